"""Every validation rule, each with a malformed layout, and the `vsup validate` command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vsup.cli import main
from vsup.layout import node
from vsup.layout.model import load_layout, loads_layout
from vsup.layout.validate import validate

REPO = Path(__file__).resolve().parents[3]
CONFIGS = REPO / "configs"

BASE = """\
[layout]
name = "t"

[defaults]
model = "org/model"
command = ["python", "-m", "vllm.entrypoints.openai.api_server"]

[[instance]]
name = "g0"
gpus = [0]
port = 8000
gpu_memory_utilization = 0.9

[[instance]]
name = "g1"
gpus = [1]
port = 8001
gpu_memory_utilization = 0.9
"""

CPU = """\
[defaults]
model = "{tiny}"
command = ["python", "-m", "vllm.entrypoints.openai.api_server"]

[[instance]]
name = "c0"
gpus = []
port = 8101
"""

MLA_CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "num_hidden_layers": 61,
    "vocab_size": 129280,
    "kv_lora_rank": 512,
    "q_lora_rank": 1536,
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 128,
    "v_head_dim": 128,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "first_k_dense_replace": 3,
    "max_position_embeddings": 163840,
    "torch_dtype": "bfloat16",
}
TINY_CONFIG = {
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "num_hidden_layers": 2,
    "vocab_size": 512,
    "max_position_embeddings": 2048,
    "torch_dtype": "float32",
}


@pytest.fixture
def models(tmp_path: Path) -> dict[str, str]:
    out = {}
    for name, cfg in (("mla", MLA_CONFIG), ("tiny", TINY_CONFIG)):
        d = tmp_path / "models" / name
        d.mkdir(parents=True)
        (d / "config.json").write_text(json.dumps(cfg))
        (d / "pytorch_model.bin").write_bytes(b"")  # weights: a config alone does not load
        out[name] = str(d)
    return out


def run_validate(tmp_path: Path, text: str, node_gpus: int | None = 8, **kw):
    path = tmp_path / "layouts" / "l.toml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    layout = load_layout(path)
    return path, validate(
        layout, node_gpus=node_gpus, profile_dirs=[CONFIGS, tmp_path / "configs"], **kw
    )


def edit(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


G0 = 'name = "g0"\ngpus = [0]\nport = 8000\ngpu_memory_utilization = 0.9\n'
DEFAULTS_CMD = 'command = ["python", "-m", "vllm.entrypoints.openai.api_server"]\n'

# (id, layout text, severity, instance or None, key or None, words the message must contain)
CASES = [
    ("toml-syntax", edit(BASE, "port = 8000", "port = "), "error", None, None, "TOML syntax"),
    (
        "unknown-section",
        edit(BASE, "[defaults]", "[defualts]"),
        "error",
        None,
        "defualts",
        "did you mean 'defaults'",
    ),
    (
        "unknown-instance-key",
        edit(BASE, "port = 8000", "prot = 8000\nport = 8000"),
        "error",
        "g0",
        "prot",
        "did you mean 'port'",
    ),
    (
        "flag-outside-args",
        edit(BASE, G0, G0 + "max-model-len = 4096\n"),
        "error",
        "g0",
        "max-model-len",
        "put it in args",
    ),
    (
        "instance-key-in-defaults",
        edit(BASE, DEFAULTS_CMD, DEFAULTS_CMD + "port = 9000\n"),
        "error",
        None,
        "port",
        "set per instance",
    ),
    (
        "layout-key-in-defaults",
        edit(BASE, DEFAULTS_CMD, DEFAULTS_CMD + 'profiles = ["cpu"]\n'),
        "error",
        None,
        "profiles",
        "belongs in the [layout] table",
    ),
    (
        "port-wrong-type",
        edit(BASE, "port = 8000", 'port = "8000"'),
        "error",
        "g0",
        "port",
        "must be an integer, not a string",
    ),
    (
        "gpus-wrong-type",
        edit(BASE, "gpus = [0]", "gpus = 0"),
        "error",
        "g0",
        "gpus",
        "must be an array of integers",
    ),
    (
        "utilization-wrong-type",
        edit(BASE, "gpu_memory_utilization = 0.9\n", 'gpu_memory_utilization = "0.9"\n'),
        "error",
        "g0",
        "gpu_memory_utilization",
        "must be a number",
    ),
    (
        "args-not-table",
        edit(BASE, DEFAULTS_CMD, DEFAULTS_CMD + "args = 5\n"),
        "error",
        None,
        "args",
        "must be a table",
    ),
    (
        "duplicate-name",
        edit(BASE, 'name = "g1"', 'name = "g0"'),
        "error",
        "g0",
        "name",
        "duplicate name 'g0'",
    ),
    (
        "bad-name",
        edit(BASE, 'name = "g0"', 'name = "g 0"'),
        "error",
        "g 0",
        "name",
        "is not usable",
    ),
    ("missing-name", edit(BASE, 'name = "g1"\n', ""), "error", "#2", "name", "missing"),
    (
        "missing-gpus",
        edit(BASE, "gpus = [1]\n", ""),
        "error",
        "g1",
        "gpus",
        "gpus = [0] (or [] for a CPU instance)",
    ),
    ("missing-port", edit(BASE, "port = 8001\n", ""), "error", "g1", "port", "port = 8000"),
    (
        "port-clash",
        edit(BASE, "port = 8001", "port = 8000"),
        "error",
        "g1",
        "port",
        "also used by instance 'g0'",
    ),
    (
        "port-too-high",
        edit(BASE, "port = 8001", "port = 70000"),
        "error",
        "g1",
        "port",
        "out of range",
    ),
    ("port-zero", edit(BASE, "port = 8001", "port = 0"), "error", "g1", "port", "out of range"),
    (
        "gpu-beyond-node",
        edit(BASE, "gpus = [1]", "gpus = [8]"),
        "error",
        "g1",
        "gpus",
        "GPU 8 does not exist",
    ),
    ("gpu-negative", edit(BASE, "gpus = [1]", "gpus = [-1]"), "error", "g1", "gpus", "negative"),
    ("gpu-twice", edit(BASE, "gpus = [1]", "gpus = [1, 1]"), "error", "g1", "gpus", "listed twice"),
    (
        "utilization-sum",
        edit(BASE, "gpus = [1]", "gpus = [0]"),
        "error",
        "g0",
        "gpu_memory_utilization",
        "GPU 0 is over-committed",
    ),
    (
        "default-utilization-counts",
        edit(edit(BASE, "gpus = [1]", "gpus = [0]"), "gpu_memory_utilization = 0.9\n", ""),
        "error",
        "g0",
        "gpus",
        "vLLM's default",
    ),
    (
        "utilization-zero",
        edit(BASE, "utilization = 0.9", "utilization = 0"),
        "error",
        "g0",
        "gpu_memory_utilization",
        "must be in (0, 1]",
    ),
    (
        "utilization-above-one",
        edit(BASE, "utilization = 0.9", "utilization = 1.5"),
        "error",
        "g0",
        "gpu_memory_utilization",
        "must be in (0, 1]",
    ),
    (
        "tp-vs-gpus",
        edit(BASE, G0, G0 + "args = { tensor-parallel-size = 2 }\n"),
        "error",
        "g0",
        "args.tensor-parallel-size",
        "needs 2 GPU(s) but gpus lists 1",
    ),
    (
        "tp-alias",
        edit(BASE, G0, G0 + "args = { tp = 1 }\n"),
        "error",
        "g0",
        "args.tp",
        "write 'tensor-parallel-size'",
    ),
    ("no-model", edit(BASE, 'model = "org/model"\n', ""), "error", "g0", "model", "no model"),
    (
        "empty-model",
        edit(BASE, 'model = "org/model"', 'model = ""'),
        "error",
        "g0",
        "model",
        "model is empty",
    ),
    (
        "unknown-profile",
        edit(BASE, 'name = "t"', 'name = "t"\nprofiles = ["rocm-mi300"]'),
        "error",
        None,
        "profiles",
        "did you mean 'rocm-mi300x'",
    ),
    (
        "unknown-restart-policy",
        edit(BASE, DEFAULTS_CMD, DEFAULTS_CMD + 'restart = { policy = "on_failure" }\n'),
        "error",
        None,
        "restart.policy",
        "did you mean 'on-failure'",
    ),
    (
        "unknown-restart-key",
        edit(BASE, DEFAULTS_CMD, DEFAULTS_CMD + "restart = { backof_s = 1 }\n"),
        "error",
        None,
        "restart.backof_s",
        "did you mean 'backoff_s'",
    ),
    (
        "backoff-order",
        edit(
            BASE, DEFAULTS_CMD, DEFAULTS_CMD + "restart = { backoff_s = 60, backoff_max_s = 10 }\n"
        ),
        "error",
        None,
        "restart.backoff_max_s",
        "below backoff_s",
    ),
    (
        "max-failures-zero",
        edit(BASE, DEFAULTS_CMD, DEFAULTS_CMD + "restart = { max_failures = 0 }\n"),
        "error",
        None,
        "restart.max_failures",
        "must be 1 or more",
    ),
    (
        "api-key-in-args",
        edit(BASE, DEFAULTS_CMD, DEFAULTS_CMD + 'args = { api-key = "sk-123" }\n'),
        "error",
        None,
        "args.api-key",
        "api_key_env",
    ),
    (
        "api-key-in-env",
        edit(BASE, DEFAULTS_CMD, DEFAULTS_CMD + 'env = { VLLM_API_KEY = "sk-123" }\n'),
        "error",
        None,
        "env.VLLM_API_KEY",
        "secret",
    ),
    (
        "api-key-env-not-a-name",
        edit(BASE, DEFAULTS_CMD, DEFAULTS_CMD + 'api_key_env = "sk-123"\n'),
        "error",
        None,
        "api_key_env",
        "not an environment variable name",
    ),
    (
        "reserved-arg",
        edit(BASE, G0, G0 + "args = { port = 9000 }\n"),
        "error",
        "g0",
        "args.port",
        "use the 'port' key",
    ),
    (
        "same-flag-twice",
        edit(BASE, G0, G0 + "args = { max-model-len = 1, max_model_len = 2 }\n"),
        "error",
        "g0",
        "args.max_model_len",
        "same flag --max-model-len",
    ),
    (
        "date-as-flag",
        edit(BASE, G0, G0 + "args = { seed = 2024-01-01 }\n"),
        "error",
        "g0",
        "args.seed",
        "cannot be a flag value",
    ),
    (
        "single-bracket-instance",
        '[defaults]\nmodel = "o/m"\n\n[instance]\nname = "a"\n',
        "error",
        None,
        "instance",
        "double brackets",
    ),
    (
        "metrics-listen-malformed",
        edit(BASE, 'name = "t"', 'name = "t"\nmetrics_listen = "9400"'),
        "error",
        None,
        "metrics_listen",
        "is not HOST:PORT",
    ),
    (
        "metrics-listen-clash",
        edit(BASE, 'name = "t"', 'name = "t"\nmetrics_listen = "127.0.0.1:8000"'),
        "error",
        "g0",
        "port",
        "metrics exporter",
    ),
    (
        "env-bool",
        edit(BASE, DEFAULTS_CMD, DEFAULTS_CMD + "env = { VLLM_ROCM_USE_AITER = true }\n"),
        "error",
        None,
        "env.VLLM_ROCM_USE_AITER",
        'as a string ("1" or "0")',
    ),
    (
        "env-bad-name",
        edit(BASE, DEFAULTS_CMD, DEFAULTS_CMD + 'env = { "A-B" = "1" }\n'),
        "error",
        None,
        "env.A-B",
        "not an environment variable name",
    ),
    (
        "empty-command",
        edit(BASE, DEFAULTS_CMD, "command = []\n"),
        "error",
        None,
        "command",
        "must name the program",
    ),
    (
        "batched-below-seqs",
        edit(BASE, G0, G0 + "args = { max-num-seqs = 512, max-num-batched-tokens = 256 }\n"),
        "error",
        "g0",
        "args.max-num-batched-tokens",
        "below max-num-seqs (512)",
    ),
    (
        "local-path-missing",
        edit(BASE, '"org/model"', '"./no/such/model"'),
        "error",
        "g0",
        "model",
        "does not exist",
    ),
    (
        "mla-aiter-no-block-size",
        edit(BASE, 'model = "org/model"', 'model = "{mla}"\nenv = { VLLM_ROCM_USE_AITER = "1" }'),
        "error",
        "g0",
        "args",
        "block-size = 1",
    ),
    (
        "kv-blocks-too-few",
        edit(
            CPU,
            "port = 8101",
            "port = 8101\nargs = { max-model-len = 512, num-gpu-blocks-override = 4 }",
        ),
        "error",
        "c0",
        "args.max-model-len",
        "holds 384 tokens",
    ),
    # warnings
    (
        "command-not-found",
        edit(BASE, DEFAULTS_CMD, 'command = ["no-such-vllm-binary", "serve"]\n'),
        "warning",
        "g0",
        "command",
        "not found on this node",
    ),
    (
        "hip-visible-devices",
        edit(BASE, DEFAULTS_CMD, DEFAULTS_CMD + 'env = { HIP_VISIBLE_DEVICES = "0" }\n'),
        "warning",
        "g0",
        "env.HIP_VISIBLE_DEVICES",
        "HIP_VISIBLE_DEVICES",
    ),
    (
        "cuda-visible-devices",
        edit(BASE, G0, G0 + 'env = { CUDA_VISIBLE_DEVICES = "3" }\n'),
        "warning",
        "g0",
        "env.CUDA_VISIBLE_DEVICES",
        "from gpus",
    ),
    (
        "attention-backend-env",
        edit(BASE, G0, G0 + 'env = { VLLM_ATTENTION_BACKEND = "X" }\n'),
        "warning",
        "g0",
        "env.VLLM_ATTENTION_BACKEND",
        "attention-backend",
    ),
    (
        "nccl-on-tp1",
        edit(BASE, DEFAULTS_CMD, DEFAULTS_CMD + 'env = { NCCL_MIN_NCHANNELS = "112" }\n'),
        "warning",
        "g0",
        "env.NCCL_MIN_NCHANNELS",
        "TP1",
    ),
    (
        "tp-for-small-model",
        edit(
            edit(BASE, '"org/model"', '"meta-llama/Llama-3.1-8B-Instruct"'),
            "gpus = [0]",
            "gpus = [2, 3]",
        ),
        "warning",
        "g0",
        "gpus",
        "TP1 replicas",
    ),
    (
        "kv-beyond-capacity",
        edit(
            CPU,
            "port = 8101",
            'port = 8101\nenv = { VLLM_CPU_KVCACHE_SPACE = "1" }\nargs = { max-num-seqs = 1024, max-model-len = 2048 }',
        ),
        "warning",
        "c0",
        "args.max-num-seqs",
        "beyond the KV cache's 1048576",
    ),
    (
        "kv-blocks-vs-seqs",
        edit(
            CPU,
            "port = 8101",
            "port = 8101\nargs = { max-model-len = 512, num-gpu-blocks-override = 6, max-num-seqs = 8 }",
        ),
        "warning",
        "c0",
        "args.max-num-seqs",
        "lower max-num-seqs to 1",
    ),
    (
        "on-the-fly-quantization",
        edit(BASE, G0, G0 + 'args = { quantization = "fp8" }\n'),
        "warning",
        "g0",
        "args.quantization",
        "adds minutes to start-up",
    ),
    (
        "unknown-flag-typo",
        edit(BASE, G0, G0 + "args = { max-modle-len = 1 }\n"),
        "error",  # the installed vLLM's own flag list: vLLM would exit with bad_args
        "g0",
        "args.max-modle-len",
        "did you mean 'max-model-len'",
    ),
    (
        "utilization-on-cpu",
        edit(CPU, "port = 8101", "port = 8101\ngpu_memory_utilization = 0.5"),
        "warning",
        "c0",
        "gpu_memory_utilization",
        "ignores gpu_memory_utilization",
    ),
    (
        "privileged-port",
        edit(BASE, "port = 8001", "port = 80"),
        "warning",
        "g1",
        "port",
        "privileged",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_rule(case, tmp_path, models):
    _id, text, severity, instance, key, words = case
    text = text.replace("{mla}", models["mla"]).replace("{tiny}", models["tiny"])
    _, diagnostics = run_validate(tmp_path, text)
    matching = [
        d
        for d in diagnostics
        if d.severity == severity
        and d.key == key
        and words in d.message
        and (instance is None or d.instance == instance or instance in d.others)
    ]
    assert matching, "\n".join(d.format() for d in diagnostics) or "no diagnostics"
    if severity == "warning":
        assert not [d for d in diagnostics if d.is_error], [d.format() for d in diagnostics]


def test_base_layouts_are_clean(tmp_path, models):
    assert run_validate(tmp_path, BASE)[1] == []
    assert run_validate(tmp_path, CPU.replace("{tiny}", models["tiny"]))[1] == []


def test_mla_with_block_size_one_or_aiter_mla_off_is_fine(tmp_path, models):
    text = edit(
        BASE,
        'model = "org/model"',
        f'model = "{models["mla"]}"\nenv = {{ VLLM_ROCM_USE_AITER = "1" }}',
    )
    assert not run_validate(
        tmp_path, edit(text, DEFAULTS_CMD, DEFAULTS_CMD + "args = { block-size = 1 }\n")
    )[1]
    off = text.replace(
        'VLLM_ROCM_USE_AITER = "1"', 'VLLM_ROCM_USE_AITER = "1", VLLM_ROCM_USE_AITER_MLA = "0"'
    )
    assert not run_validate(tmp_path, off)[1]


def test_every_error_comes_at_once_with_file_and_line(tmp_path):
    text = edit(edit(BASE, "port = 8001", "port = 8000"), "gpus = [1]", "gpus = [9]")
    text = edit(text, DEFAULTS_CMD, DEFAULTS_CMD + 'args = { api-key = "x" }\n')
    path, diagnostics = run_validate(tmp_path, text)
    errors = [d for d in diagnostics if d.is_error]
    assert {d.key for d in errors} == {"port", "gpus", "args.api-key"}
    lines = {d.key: d.line for d in errors}
    source = path.read_text().splitlines()
    assert source[lines["port"] - 1] == "port = 8000" and lines["port"] > 12
    assert source[lines["gpus"] - 1] == "gpus = [9]"
    assert source[lines["args.api-key"] - 1].startswith("args = { api-key")
    assert all(d.file == str(path) for d in errors)


def test_problem_in_a_profile_points_at_the_profile(tmp_path):
    configs = tmp_path / "configs"
    configs.mkdir()
    (configs / "mine.toml").write_text(
        '[profile]\ndescription = "x"\n\n[defaults]\nargs = { max-num-seqs = 64 }\nenv = { HIP_VISIBLE_DEVICES = "0" }\nport = 1\n'
    )
    text = edit(BASE, 'name = "t"', 'name = "t"\nprofiles = ["mine"]')
    _, diagnostics = run_validate(tmp_path, text)
    port = [d for d in diagnostics if d.key == "port" and d.is_error]
    assert port and port[0].file == str(configs / "mine.toml") and port[0].line == 7
    hip = [d for d in diagnostics if d.key == "env.HIP_VISIBLE_DEVICES"]
    assert hip[0].file == str(configs / "mine.toml") and hip[0].line == 6
    assert hip[0].instance == "g0" and hip[0].others == ("g1",)
    assert "(set in profile 'mine')" in hip[0].message


def test_profile_syntax_error_and_unknown_section(tmp_path):
    configs = tmp_path / "configs"
    configs.mkdir()
    (configs / "broken.toml").write_text("[defaults\n")
    (configs / "odd.toml").write_text("[defaults]\n[extra]\n")
    text = edit(BASE, 'name = "t"', 'name = "t"\nprofiles = ["broken", "odd"]')
    _, diagnostics = run_validate(tmp_path, text)
    messages = [d.format() for d in diagnostics if d.is_error]
    assert any("broken.toml:1: error" in m and "TOML syntax" in m for m in messages), messages
    assert any("odd.toml:2: error" in m and "key 'extra'" in m for m in messages), messages


def test_profiles_are_found_beside_or_above_the_layout_and_on_the_path(tmp_path, monkeypatch):
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "up.toml").write_text('[defaults]\nhost = "127.0.0.2"\n')
    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "env.toml").write_text('[defaults]\nhost = "127.0.0.3"\n')
    (extra / "up.toml").write_text('[defaults]\nhost = "127.0.0.9"\n')
    layout_path = tmp_path / "a" / "b" / "l.toml"
    layout_path.parent.mkdir(parents=True)
    layout_path.write_text(edit(BASE, 'name = "t"', 'name = "t"\nprofiles = ["up"]'))
    assert load_layout(layout_path).resolve()[0].host == "127.0.0.2"
    monkeypatch.setenv("VSUP_PROFILE_PATH", f"/nonexistent:{extra}")
    assert load_layout(layout_path).resolve()[0].host == "127.0.0.9"  # $VSUP_PROFILE_PATH first
    layout_path.write_text(edit(BASE, 'name = "t"', 'name = "t"\nprofiles = ["env", "cpu"]'))
    spec = load_layout(layout_path).resolve()[0]
    assert spec.host == "127.0.0.3" and spec.args["dtype"] == "float32"  # shipped cpu profile


def test_no_gpu_on_node_checks_only_non_negative_and_says_so_once(tmp_path):
    path, diagnostics = run_validate(
        tmp_path, edit(BASE, "gpus = [1]", "gpus = [42]"), node_gpus=None
    )
    assert not [d for d in diagnostics if d.is_error]
    (w,) = diagnostics
    assert "no GPU found on this node" in w.message and w.file == str(path)


def test_probed_gpu_count_is_used(tmp_path):
    found = node.NodeFacts((node.NodeGpu(0, "NVIDIA H200", 150 * 2**30, "nvidia"),))
    _, diagnostics = run_validate(tmp_path, BASE, node_gpus=None, node=found)
    (e,) = [d for d in diagnostics if d.is_error]
    assert "this node has 1 GPU (0-0)" in e.message and e.instance == "g1"


def test_gpu_kv_estimate_warns_when_memory_is_known(tmp_path, models):
    text = edit(BASE, '"org/model"', f'"{models["mla"]}"')
    text = edit(text, DEFAULTS_CMD, DEFAULTS_CMD + "args = { max-model-len = 163840 }\n")
    _, diagnostics = run_validate(tmp_path, text, gpu_memory_bytes=80 * 2**30)
    assert any("vLLM will likely refuse to start" in d.message for d in diagnostics), [
        d.format() for d in diagnostics
    ]


@pytest.mark.parametrize(
    "junk",
    [
        "instance = 5",
        "instance = [1, 2]",
        "layout = 3",
        "defaults = []",
        "[[instance]]\nargs = [1]\nenv = 3\nrestart = 4\n",
    ],
)
def test_wrong_shapes_are_errors_not_crashes(tmp_path, junk):
    _, diagnostics = run_validate(tmp_path, junk + "\n")
    assert any(d.is_error for d in diagnostics)


# -- the command ----------------------------------------------------------------------------


def test_cli_valid_layout_exits_0_with_warnings_on_stderr(tmp_path, capsys):
    path = tmp_path / "l.toml"
    path.write_text(edit(BASE, DEFAULTS_CMD, 'command = ["no-such-vllm-binary"]\n'))
    assert main(["validate", str(path), "--node-gpus", "8"]) == 0
    out, err = capsys.readouterr()
    assert "valid (2 instances, 1 warning)" in out
    assert (
        f"{path}:6: warning: instance 'g0' (and 'g1'): key 'command': command 'no-such-vllm-binary'"
        in err
    )


def test_cli_invalid_layout_exits_2_listing_every_error(tmp_path, capsys):
    path = tmp_path / "l.toml"
    path.write_text(edit(edit(BASE, "port = 8001", "port = 8000"), "gpus = [1]", "gpus = [9]"))
    assert main(["validate", str(path), "--node-gpus", "8"]) == 2
    _, err = capsys.readouterr()
    assert (
        f"{path}:17: error: instance 'g1': key 'port': port 8000 is also used by instance 'g0'"
        in err
    )
    assert f"{path}:16: error: instance 'g1': key 'gpus': GPU 9 does not exist" in err
    assert "2 errors" in err


def test_cli_json_and_missing_file(tmp_path, capsys):
    assert main(["validate", str(tmp_path / "none.toml"), "--json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["valid"] is False and "cannot read" in doc["errors"][0]["message"]
    path = tmp_path / "l.toml"
    path.write_text(BASE)
    assert main(["validate", str(path), "--node-gpus", "8", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["valid"] and doc["instances"] == ["g0", "g1"] and doc["warnings"] == []


def test_validate_never_raises_on_garbage_profiles_or_paths(tmp_path):
    text = 'layout = { profiles = ["a\\u0000b", "../x.toml", "/etc"] }\n[defaults]\nmodel = "/\\u0000"\n[[instance]]\nname = "a"\ngpus = [0]\nport = 1\n'
    layout = loads_layout(text, tmp_path / "l.toml")
    diagnostics = validate(layout, node_gpus=1, profile_dirs=[CONFIGS])
    assert any("unknown profile" in d.message for d in diagnostics)


def test_validate_instance_reports_what_the_form_must_fix(tmp_path):
    layout = loads_layout(BASE, tmp_path / "l.toml")
    new = {"name": "g2", "gpus": [0], "port": 8000, "gpu_memory_utilization": 0.5}
    from vsup.layout.validate import validate_instance

    found = validate_instance(layout, new, node_gpus=8, profile_dirs=[CONFIGS])
    keys = sorted({d.key or "" for d in found if d.is_error})
    assert keys == ["gpu_memory_utilization", "port"]
    assert all(d.file is None or d.file == str(tmp_path / "l.toml") for d in found)
    ok = validate_instance(
        layout, {**new, "gpus": [2], "port": 8002}, node_gpus=8, profile_dirs=[CONFIGS]
    )
    assert ok == []
    edited = validate_instance(
        layout,
        {"name": "g0", "gpus": [1], "port": 8001},
        replace_name="g0",
        node_gpus=8,
        profile_dirs=[CONFIGS],
    )
    assert any("also used by instance 'g0'" in d.message for d in edited)
