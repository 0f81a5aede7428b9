"""`vsup plan`: layouts that validate for 1-8 GPUs x 1-4 per GPU, TP groups, budgets, refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vsup.cli import main
from vsup.layout.model import load_layout
from vsup.layout.node import GIB, KNOWN_GPUS, NodeFacts, NodeGpu
from vsup.layout.plan import (
    PlanError,
    PlanRequest,
    make_plan,
    overhead_bytes,
    parse_gpus,
    render_budget,
    render_explain,
    split_utilization,
)
from vsup.layout.validate import validate

REPO = Path(__file__).resolve().parents[3]
CONFIGS = REPO / "configs"
LLAMA_8B = {
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_hidden_layers": 32,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


@pytest.fixture(scope="module")
def llama8b(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("models") / "llama-8b"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(LLAMA_8B))
    (d / "pytorch_model.bin").write_bytes(b"")  # weights: a config alone does not load
    return d


@pytest.mark.parametrize("gpus", range(1, 9))
@pytest.mark.parametrize("per_gpu", range(1, 5))
def test_plan_validates_for_1_to_8_gpus_and_1_to_4_per_gpu(llama8b, gpus, per_gpu):
    req = PlanRequest(
        model=str(llama8b),
        gpus=list(range(gpus)),
        per_gpu=per_gpu,
        gpu="MI300X",
        max_model_len=8192,
    )
    plan = make_plan(req)
    assert plan.ok, plan.problems
    layout = plan.layout
    assert len(layout.instances) == gpus * per_gpu
    diagnostics = validate(layout, node_gpus=8, profile_dirs=[CONFIGS])
    assert not [d for d in diagnostics if d.is_error], [d.format() for d in diagnostics]
    for g in range(gpus):
        on_gpu = [t for t in layout.instances if g in t["gpus"]]
        assert len(on_gpu) == per_gpu
        assert sum(t["gpu_memory_utilization"] for t in on_gpu) <= 0.95
    ports = [t["port"] for t in layout.instances]
    assert ports == list(range(8000, 8000 + gpus * per_gpu))
    specs = layout.resolve(profile_dirs=[CONFIGS])
    assert all(s.argv()[:2] == ["vllm", "serve"] for s in specs)


@pytest.mark.parametrize(("tp", "per_gpu"), [(2, 1), (4, 1), (8, 1), (2, 2), (4, 3)])
def test_tp_groups_validate(llama8b, tp, per_gpu):
    plan = make_plan(
        PlanRequest(
            model=str(llama8b),
            gpus=list(range(8)),
            tp=tp,
            per_gpu=per_gpu,
            gpu="H200",
            max_model_len=8192,
        )
    )
    assert plan.ok
    groups = {tuple(t["gpus"]) for t in plan.layout.instances}
    assert groups == {tuple(range(i, i + tp)) for i in range(0, 8, tp)}
    diagnostics = validate(plan.layout, node_gpus=8, profile_dirs=[CONFIGS])
    assert not [d for d in diagnostics if d.is_error]
    # An 8B model on TP>1 earns the tuning guide's warning.
    assert any("TP1 replicas" in d.message for d in diagnostics)
    spec = plan.layout.resolve(profile_dirs=[CONFIGS])[0]
    assert spec.argv()[spec.argv().index("--tensor-parallel-size") + 1] == str(tp)


def test_budget_figures(llama8b):
    plan = make_plan(
        PlanRequest(model=str(llama8b), gpus=[0], per_gpu=2, gpu="MI300X", max_model_len=8192)
    )
    assert plan.kv_bytes_per_token == 131072
    assert plan.weight_bytes == 8_030_261_248 * 2
    b = plan.budgets[0]
    assert b.utilization == 0.45
    assert b.budget_bytes == int(0.45 * 192 * GIB)
    assert b.kv_bytes == b.budget_bytes - plan.weight_bytes - overhead_bytes(1)
    # whole blocks of 16 tokens: vLLM's KV cache is a pool of blocks
    assert b.kv_tokens == b.kv_bytes // (131072 * 16) * 16
    assert b.max_concurrency == pytest.approx(b.kv_tokens / 8192)
    text = render_budget(plan)
    assert "128.0 KiB per token" in text and "(GPU 0 total)" in text and f"{b.kv_tokens:,}" in text


def test_utilization_split():
    assert [split_utilization(0.90, n) for n in (1, 2, 3, 4)] == [0.90, 0.45, 0.30, 0.22]


def test_refuses_an_instance_that_cannot_hold_one_full_request(llama8b):
    plan = make_plan(
        PlanRequest(model=str(llama8b), gpus=[0], per_gpu=4, gpu="H100", max_model_len=131072)
    )
    assert not plan.ok
    assert "less than one request of max-model-len 131072" in plan.problems[0]
    assert "lower --max-model-len" in plan.problems[0]


def test_a_refusal_shared_by_many_instances_is_one_line_naming_them(llama8b):
    """Issue 25: `--per-gpu 8` on 8 GPUs refused printed 64 near-identical lines."""
    plan = make_plan(
        PlanRequest(
            model=str(llama8b), gpus=list(range(8)), per_gpu=8, gpu="H100", max_model_len=131072
        )
    )
    assert not plan.ok and len(plan.budgets) == 64
    (problem,) = plan.problems
    assert problem.startswith("64 instances (gpu0a to gpu7h) on GPUs 0-7: 0.11 of 80 GiB ")
    assert "cannot hold 15.0 GiB of weights" in problem
    # a few instances are named one by one
    three = make_plan(
        PlanRequest(model=str(llama8b), gpus=[0], per_gpu=3, gpu="H100", max_model_len=131072)
    )
    (problem,) = three.problems
    assert problem.startswith("gpu0a, gpu0b, gpu0c: its KV cache holds ")
    assert "less than one request of max-model-len 131072" in problem


def test_refuses_weights_that_do_not_fit(tmp_path):
    plan = make_plan(
        PlanRequest(
            model="meta-llama/Llama-3.1-405B-Instruct",
            gpus=[0],
            gpu="MI300X",
            params=405e9,
            dtype="bfloat16",
        )
    )
    assert not plan.ok and "cannot hold" in plan.problems[0] and "--tp" in plan.problems[0]


def test_hub_id_without_files_needs_params_and_dtype():
    with pytest.raises(PlanError, match="--params"):
        make_plan(PlanRequest(model="org/unknown-model", gpus=[0], gpu="MI300X"))
    plan = make_plan(
        PlanRequest(
            model="org/unknown-model",
            gpus=[0, 1],
            gpu="MI300X",
            params=8e9,
            dtype="fp8",
            max_model_len=4096,
        )
    )
    assert plan.ok and plan.weight_bytes == 8e9 and plan.kv_bytes_per_token is None
    assert any("config.json is needed" in n for n in plan.notes)
    assert not [d for d in validate(plan.layout, node_gpus=8, profile_dirs=[CONFIGS]) if d.is_error]


def test_gpu_memory_from_the_node_and_all_gpus(llama8b):
    found = NodeFacts(tuple(NodeGpu(i, "NVIDIA H200", 150 * GIB, "nvidia") for i in range(8)))
    plan = make_plan(
        PlanRequest(
            model=str(llama8b),
            gpus=parse_gpus("all", found.gpu_count),
            max_model_len=8192,
            node=found,
        )
    )
    assert plan.gpu_memory_bytes == 150 * GIB and "this node" in plan.gpu_memory_source
    assert plan.layout.profiles == ["nvidia-h200"]
    assert len(plan.layout.instances) == 8


def test_no_memory_source_or_gpus_is_an_error(llama8b):
    with pytest.raises(PlanError, match="--gpu-mem-gib"):
        make_plan(PlanRequest(model=str(llama8b), gpus=[0]))
    with pytest.raises(PlanError, match="no GPU found"):
        parse_gpus("all", None)
    assert parse_gpus("0,2-4", None) == [0, 2, 3, 4]
    with pytest.raises(PlanError):
        parse_gpus("0,0", None)
    with pytest.raises(PlanError, match="does not divide"):
        make_plan(PlanRequest(model=str(llama8b), gpus=[0, 1, 2], tp=2, gpu="H200"))


def test_explicit_memory_and_profiles(llama8b):
    plan = make_plan(
        PlanRequest(
            model=str(llama8b),
            gpus=[0],
            gpu_memory_bytes=64 * GIB,
            profiles=["rocm-mi300x", "latency"],
            max_model_len=4096,
        )
    )
    assert plan.gpu_memory_bytes == 64 * GIB and plan.layout.profiles == ["rocm-mi300x", "latency"]
    assert KNOWN_GPUS["MI355X"][1] == 288 * GIB


def test_cli_writes_a_valid_layout_and_prints_the_budget(llama8b, tmp_path, capsys):
    out = tmp_path / "plans" / "p.toml"
    rc = main(
        [
            "plan",
            "--model",
            str(llama8b),
            "--gpus",
            "0-3",
            "--per-gpu",
            "2",
            "--gpu",
            "mi355x",
            "--max-model-len",
            "8192",
            "--profile",
            "rocm-mi355x",
            "throughput",
            "-o",
            str(out),
        ]
    )
    stdout, stderr = capsys.readouterr()
    assert rc == 0, stderr
    assert "GPU" in stdout and "gpu3b" in stdout and f"wrote {out}" in stdout
    layout = load_layout(out)
    assert layout.profiles == ["rocm-mi355x", "throughput"] and len(layout.instances) == 8
    assert main(["validate", str(out), "--node-gpus", "4"]) == 0


def test_cli_without_output_prints_toml_on_stdout(llama8b, capsys):
    assert (
        main(
            [
                "plan",
                "--model",
                str(llama8b),
                "--gpus",
                "0",
                "--gpu",
                "H200",
                "--max-model-len",
                "2048",
            ]
        )
        == 0
    )
    stdout, stderr = capsys.readouterr()
    assert stdout.startswith("[layout]") and "KV cache" in stderr


def test_cli_refusal_exits_2(llama8b, capsys):
    rc = main(
        [
            "plan",
            "--model",
            str(llama8b),
            "--gpus",
            "0",
            "--per-gpu",
            "4",
            "--gpu",
            "H100",
            "--max-model-len",
            "131072",
        ]
    )
    assert rc == 2
    assert "refused" in capsys.readouterr().err
    assert main(["plan", "--model", "org/x", "--gpus", "0", "--gpu", "H100"]) == 2
    assert "--params" in capsys.readouterr().err


def test_relative_model_path_is_rewritten_for_the_output(llama8b, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(llama8b.parent)
    out = tmp_path / "elsewhere" / "p.toml"
    assert (
        main(
            [
                "plan",
                "--model",
                "./llama-8b",
                "--gpus",
                "0",
                "--gpu",
                "H200",
                "--max-model-len",
                "2048",
                "-o",
                str(out),
            ]
        )
        == 0
    )
    spec = load_layout(out).resolve(profile_dirs=[CONFIGS])[0]
    assert spec.model == str(llama8b)


def test_explain_gives_every_item_of_a_shared_gpu_and_why(llama8b):
    plan = make_plan(
        PlanRequest(model=str(llama8b), gpus=[0, 1], per_gpu=2, gpu="MI300X", max_model_len=8192)
    )
    text = render_explain(plan)
    assert text.startswith("GPU 0-1: 192.0 GiB (MI300X (--gpu)); 2 instance(s) per GPU")
    for item in ("budget", "weights", "activation/graph reserve", "KV cache"):
        assert f"gpu0a: {item}" in text and f"gpu0b: {item}" in text
    assert "gpu_memory_utilization 0.45 x 192.0 GiB" in text
    assert "not given to vLLM" in text and "1 - 0.90 of the GPU" in text
    left = 192 * GIB - 2 * int(0.45 * 192 * GIB)
    assert f"{left / GIB:.2f}" in text
    b = plan.budgets[0]
    assert f"vLLM reports {b.kv_tokens:,} tokens" in text


def time_shared(llama8b, **kw) -> PlanRequest:
    """Two instances per H200 taking turns (one swap group per GPU), on a node of 256 GiB."""
    base = dict(
        model=str(llama8b),
        gpus=[0, 1],
        per_gpu=2,
        gpu="H200",
        max_model_len=8192,
        time_share=True,
        host_memory_bytes=256 * GIB,
    )
    return PlanRequest(**{**base, **kw})


def test_a_swap_group_of_two_at_090_on_one_gpu_fits_and_without_sleep_mode_does_not(llama8b):
    plan = make_plan(time_shared(llama8b))
    assert plan.ok, plan.problems
    tables = plan.layout.instances
    assert [t["gpu_memory_utilization"] for t in tables] == [0.9] * 4
    assert [t["swap_group"] for t in tables] == ["gpu0", "gpu0", "gpu1", "gpu1"]
    assert all(t["sleep"] == {"level": 1} for t in tables)
    assert plan.layout.defaults["host"] == "127.0.0.1"  # dev-mode endpoints: loopback only
    # each GPU's total counts the group once: 0.90 awake + one sleeper's 2 GiB of 140 GiB
    assert plan.gpu_shares()[0].total == pytest.approx(0.9 + 2 / (143771 / 1024))
    text = render_budget(plan)
    assert plan.weight_bytes is not None
    weights = 2 * plan.weight_bytes / GIB
    assert (
        "gpu0: gpu0a, gpu0b time-share GPU 0 - one awake at a time, 0.90 of the GPU; sleepers "
        f"keep ~2.0 GiB each, level-1 weights {weights:.1f} GiB in host RAM"
    ) in text
    total = next(line for line in text.splitlines() if "(GPU 0 total)" in line)
    assert total.split()[-1] == "0.91"
    explain = render_explain(plan)
    assert "swap group gpu0: sleepers" in explain and "1 - 0.91 of the GPU" in explain
    target = NodeFacts(
        tuple(NodeGpu(i, "NVIDIA H200", plan.gpu_memory_bytes, "nvidia") for i in range(2)),
        host_memory_bytes=256 * GIB,
    )
    errors = [d for d in validate(plan.layout, node=target, profile_dirs=[CONFIGS]) if d.is_error]
    assert errors == []
    # without their swap groups they still sleep: evicted by memory, the largest awake with
    # the other asleep fits
    for t in tables:
        del t["swap_group"]
    errors = [d for d in validate(plan.layout, node=target, profile_dirs=[CONFIGS]) if d.is_error]
    assert errors == []
    # without sleep mode either: 1.80 of each GPU, refused
    for t in tables:
        del t["sleep"]
    errors = [d for d in validate(plan.layout, node=target, profile_dirs=[CONFIGS]) if d.is_error]
    named = {name for d in errors for name in (d.instance, *d.others)}
    assert named == {"gpu0a", "gpu0b", "gpu1a", "gpu1b"}
    assert all("over-committed" in d.message and "1.80" in d.message for d in errors)


def test_time_share_refuses_level_1_weights_beyond_host_ram(llama8b):
    plan = make_plan(time_shared(llama8b, host_memory_bytes=32 * GIB))
    assert not plan.ok
    (problem,) = plan.problems
    assert plan.weight_bytes is not None
    each = plan.weight_bytes / GIB
    assert problem.startswith("4 instances (gpu0a to gpu1b): level-1 sleepers keep their weights")
    assert f"4 x {each:.1f} GiB = {4 * each:.1f} GiB when all sleep" in problem
    assert "of 32.0 GiB (--host-ram-gib): above 80%" in problem and "--sleep-level 2" in problem
    # level 2 drops the weights instead: nothing waits in host RAM
    assert make_plan(time_shared(llama8b, host_memory_bytes=32 * GIB, sleep_level=2)).ok
    # above half the node's RAM: said, not refused
    warned = make_plan(time_shared(llama8b, host_memory_bytes=96 * GIB))
    assert warned.ok and any("above 50%" in n for n in warned.notes)
    # the node's own RAM when no flag gives it
    node = NodeFacts(host_memory_bytes=32 * GIB)
    assert not make_plan(time_shared(llama8b, host_memory_bytes=None, node=node)).ok


def test_time_share_refuses_more_sleepers_than_fit_beside_the_awake_one(llama8b):
    plan = make_plan(time_shared(llama8b, gpus=[0], per_gpu=5, host_memory_bytes=None))
    (problem,) = plan.problems
    assert problem.startswith("gpu0: swap group gpu0 claims 0.96 of GPU 0")
    assert "0.9 awake + 4 sleepers x 2 GiB" in problem and "--utilization to 0.89" in problem
    assert make_plan(time_shared(llama8b, gpus=[0], per_gpu=5, utilization=0.89)).ok


def test_time_share_needs_two_per_gpu_and_a_sleep_level(llama8b):
    with pytest.raises(PlanError, match="--per-gpu 2 or more"):
        make_plan(time_shared(llama8b, per_gpu=1))
    with pytest.raises(PlanError, match="--sleep-level 3"):
        make_plan(time_shared(llama8b, sleep_level=3))


def test_cli_time_share_writes_a_layout_that_validates(llama8b, tmp_path, capsys):
    out = tmp_path / "swap.toml"
    argv = ["plan", "--model", str(llama8b), "--gpus", "0", "--per-gpu", "2", "--gpu", "H200"]
    argv += ["--max-model-len", "8192", "--time-share", "--host-ram-gib", "256", "-o", str(out)]
    assert main(argv) == 0, capsys.readouterr().err
    stdout = capsys.readouterr().out
    assert "gpu0: gpu0a, gpu0b time-share GPU 0 - one awake at a time" in stdout
    assert main(["validate", str(out), "--node-gpus", "1"]) == 0
    assert "swap group gpu0: gpu0a, gpu0b time-share GPU 0" in capsys.readouterr().out
    argv[-3:-2] = ["16"]  # --host-ram-gib 16: two sleepers' 30 GiB do not fit
    assert main(argv) == 2
    assert "vsup plan: refused: gpu0a, gpu0b: level-1 sleepers" in capsys.readouterr().err
