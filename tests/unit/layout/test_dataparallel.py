"""Data parallel as a layout shape: argv, GPUs = TP x PP x DP, DP rules, `vsup plan --dp`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vsup.cli import main
from vsup.layout.model import load_layout
from vsup.layout.parallel import parallel_shape
from vsup.layout.plan import PlanError, PlanRequest, make_plan, render_explain
from vsup.layout.validate import validate

REPO = Path(__file__).resolve().parents[3]
CONFIGS = REPO / "configs"

DENSE = {
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_hidden_layers": 32,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "torch_dtype": "bfloat16",
}
MOE = {
    **DENSE,
    "model_type": "mixtral",
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
}


@pytest.fixture
def models(tmp_path: Path) -> dict[str, str]:
    out = {}
    for name, cfg in (("dense", DENSE), ("moe", MOE)):
        d = tmp_path / "models" / name
        d.mkdir(parents=True)
        (d / "config.json").write_text(json.dumps(cfg))
        (d / "pytorch_model.bin").write_bytes(b"")  # weights: a config alone does not load
        out[name] = str(d)
    return out


def layout_text(model: str, gpus: str, args: str, extra: str = "") -> str:
    return (
        f'[defaults]\nmodel = "{model}"\n\n[[instance]]\nname = "a"\ngpus = {gpus}\n'
        f"port = 8000\nargs = {{ {args} }}\n{extra}"
    )


def check(tmp_path: Path, text: str, node_gpus: int = 8):
    path = tmp_path / "l.toml"
    path.write_text(text)
    layout = load_layout(path)
    return layout, validate(layout, node_gpus=node_gpus, profile_dirs=[CONFIGS])


def errors(diags):
    return [d for d in diags if d.is_error]


def test_dp8_on_8_gpus_runs_tp1_not_tp8(tmp_path, models):
    layout, diags = check(
        tmp_path, layout_text(models["dense"], "[0,1,2,3,4,5,6,7]", "data-parallel-size = 8")
    )
    assert not errors(diags), [d.format() for d in diags]
    spec = layout.resolve(profile_dirs=[CONFIGS])[0]
    argv = spec.argv()
    assert "--tensor-parallel-size" not in argv  # TP1: vLLM's default
    assert argv[argv.index("--data-parallel-size") + 1] == "8"
    assert spec.tensor_parallel_size == 1 and spec.data_parallel_size == 8


def test_dp8_with_explicit_tp1_is_accepted(tmp_path, models):
    text = layout_text(
        models["dense"], "[0,1,2,3,4,5,6,7]", "data-parallel-size = 8, tensor-parallel-size = 1"
    )
    _, diags = check(tmp_path, text)
    assert not errors(diags), [d.format() for d in diags]


def test_dp2_over_8_gpus_derives_tp4(tmp_path, models):
    layout, diags = check(
        tmp_path, layout_text(models["dense"], "[0,1,2,3,4,5,6,7]", "data-parallel-size = 2")
    )
    assert not errors(diags)
    argv = layout.resolve(profile_dirs=[CONFIGS])[0].argv()
    assert argv[argv.index("--tensor-parallel-size") + 1] == "4"


def test_tp_x_dp_must_match_the_gpus(tmp_path, models):
    text = layout_text(
        models["dense"], "[0,1,2,3]", "data-parallel-size = 2, tensor-parallel-size = 1"
    )
    _, diags = check(tmp_path, text)
    (err,) = errors(diags)
    assert "tensor-parallel-size 1 x data-parallel-size 2 needs 2 GPU(s) but gpus lists 4" in (
        err.message
    )
    _, diags = check(tmp_path, layout_text(models["dense"], "[0,1,2]", "data-parallel-size = 2"))
    (err,) = errors(diags)
    assert err.key == "gpus" and "do not split into 2 data-parallel ranks" in err.message


def test_parallel_shape_reads_every_spelling():
    assert parallel_shape({"dp": 4}, 8).tp == 2
    assert parallel_shape({"data_parallel_size": "2", "pipeline-parallel-size": 2}, 8).tp == 2
    shape = parallel_shape({"data-parallel-size": 4, "data-parallel-size-local": 2}, 4)
    assert shape.tp == 2 and shape.spans_nodes and shape.gpus_needed == 4
    assert parallel_shape({"tensor-parallel-size": False, "data-parallel-size": 2}, 4).tp == 2


@pytest.mark.parametrize(
    ("model", "args", "extra", "severity", "words"),
    [
        ("dense", 'data-parallel-size = "x"', "", "error", "positive integer"),
        (
            "dense",
            "data-parallel-size = 2, data-parallel-size-local = 4",
            "",
            "error",
            "above data-parallel-size",
        ),
        (
            "dense",
            "data-parallel-size = 8, data-parallel-external-lb = true",
            "",
            "error",
            "refuses for a dense",
        ),
        (
            "moe",
            "data-parallel-size = 8, data-parallel-hybrid-lb = true",
            "",
            "error",
            "needs data-parallel-size-local",
        ),
        (
            "moe",
            "data-parallel-size = 16, data-parallel-size-local = 8, enable-expert-parallel = true",
            "",
            "warning",
            "ranks on other nodes",
        ),
        ("moe", "data-parallel-size = 8", "", "warning", "without enable-expert-parallel"),
        (
            "dense",
            "data-parallel-size = 8, enable-expert-parallel = true",
            "",
            "warning",
            "does nothing for a dense",
        ),
        (
            "dense",
            "data-parallel-size = 8",
            'env = { VLLM_DP_MASTER_PORT = "29600" }\n',
            "warning",
            "vllm serve ignores VLLM_DP_MASTER_PORT",
        ),
    ],
)
def test_dp_rule(tmp_path, models, model, args, extra, severity, words):
    _, diags = check(tmp_path, layout_text(models[model], "[0,1,2,3,4,5,6,7]", args, extra))
    hits = [d for d in diags if words in d.message]
    assert hits, [d.format() for d in diags]
    assert hits[0].severity == severity and hits[0].instance == "a"


def test_dp_rpc_port_may_not_be_another_instances_port(tmp_path, models):
    text = (
        f'[defaults]\nmodel = "{models["moe"]}"\n\n'
        '[[instance]]\nname = "a"\ngpus = [0,1,2,3]\nport = 8000\n'
        "args = { data-parallel-size = 8, data-parallel-size-local = 4, "
        "enable-expert-parallel = true, data-parallel-rpc-port = 8001 }\n\n"
        '[[instance]]\nname = "b"\ngpus = [4]\nport = 8001\n'
    )
    _, diags = check(tmp_path, text)
    clash = [d for d in errors(diags) if "data-parallel RPC port" in d.message]
    assert clash and "instance 'b'" in clash[0].message
    assert clash[0].key == "args.data-parallel-rpc-port"


def test_two_multi_node_dp_instances_share_the_default_rpc_port(tmp_path, models):
    inst = (
        '[[instance]]\nname = "{n}"\ngpus = [{g}]\nport = {p}\n'
        "args = {{ data-parallel-size = 2, data-parallel-size-local = 1, "
        "enable-expert-parallel = true }}\n\n"
    )
    text = f'[defaults]\nmodel = "{models["moe"]}"\n\n' + "".join(
        inst.format(n=n, g=g, p=8000 + g) for n, g in (("a", 0), ("b", 1))
    )
    _, diags = check(tmp_path, text)
    clash = [d for d in errors(diags) if "29550" in d.message]
    assert len(clash) == 1 and clash[0].instance == "b"


def test_single_node_dp_instances_need_no_extra_port(tmp_path, models):
    text = (
        f'[defaults]\nmodel = "{models["dense"]}"\nargs = {{ data-parallel-size = 4 }}\n\n'
        '[[instance]]\nname = "a"\ngpus = [0,1,2,3]\nport = 8000\n\n'
        '[[instance]]\nname = "b"\ngpus = [4,5,6,7]\nport = 8001\n'
    )
    _, diags = check(tmp_path, text)
    assert not errors(diags), [d.format() for d in diags]


def test_plan_dp_writes_one_instance_per_group(models):
    plan = make_plan(
        PlanRequest(
            model=models["dense"], gpus=list(range(8)), dp=4, gpu="H200", max_model_len=8192
        )
    )
    assert plan.ok, plan.problems
    names = [t["name"] for t in plan.layout.instances]
    assert names == ["dp4-0", "dp4-1"]
    assert [t["gpus"] for t in plan.layout.instances] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert plan.layout.defaults["args"]["data-parallel-size"] == 4
    assert "enable-expert-parallel" not in plan.layout.defaults["args"]
    b = plan.budgets[0]
    assert b.kv_tokens is not None
    assert b.dp == 4 and b.instance_kv_tokens == 4 * b.kv_tokens
    assert b.max_concurrency == pytest.approx(4 * b.kv_tokens / 8192)
    diags = validate(plan.layout, node_gpus=8, profile_dirs=[CONFIGS])
    assert not errors(diags)
    spec = plan.layout.resolve(profile_dirs=[CONFIGS])[0]
    assert "--tensor-parallel-size" not in spec.argv()
    assert "per rank" in render_explain(plan)


def test_plan_tp2_dp4_and_moe_gets_expert_parallel(models):
    plan = make_plan(
        PlanRequest(
            model=models["moe"], gpus=list(range(8)), tp=2, dp=4, gpu="MI300X", max_model_len=8192
        )
    )
    assert plan.ok, plan.problems
    assert [t["name"] for t in plan.layout.instances] == ["tp2dp4-0"]
    args = plan.layout.defaults["args"]
    assert args["tensor-parallel-size"] == 2 and args["enable-expert-parallel"] is True
    diags = validate(plan.layout, node_gpus=8, profile_dirs=[CONFIGS])
    assert not errors(diags), [d.format() for d in diags]
    with pytest.raises(PlanError, match="does not divide the 6 GPUs"):
        make_plan(PlanRequest(model=models["moe"], gpus=list(range(6)), dp=4, gpu="H200"))


def test_cli_plan_dp_explain(models, tmp_path, capsys):
    out = tmp_path / "dp.toml"
    rc = main(
        [
            "plan",
            "--model",
            models["dense"],
            "--gpus",
            "0-7",
            "--dp",
            "8",
            "--gpu",
            "H200",
            "--max-model-len",
            "8192",
            "--explain",
            "-o",
            str(out),
        ]
    )
    stdout, stderr = capsys.readouterr()
    assert rc == 0, stderr
    assert "GPU 0-7:" in stdout and "activation/graph reserve" in stdout
    assert "not given to vLLM" in stdout and "every DP rank holds its own copy" in stdout
    assert load_layout(out).instances[0]["gpus"] == list(range(8))
