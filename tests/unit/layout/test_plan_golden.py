"""`vsup plan` pinned byte for byte: the budget table, `--explain`, the layout and the refusals
for one model of each KV kind (dense MHA, GQA, sliding window, alternating and 5:1 windows,
MLA, linear-attention and mamba hybrids, chunked local attention) and each placement (per-GPU
replicas, TP, DP, time sharing, refusals).

The golden files under golden/plan/ are what the planner printed before it was cut into stages
(issue 37); a refactor must leave them unchanged. After a deliberate change of the output,
rewrite them with `VSUP_UPDATE_GOLDEN=1` and review the diff.
"""

from __future__ import annotations

import json
import os
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

import vsup
from vsup.cli import main
from vsup.layout.model import dumps_layout
from vsup.layout.node import GIB, NodeFacts, NodeGpu
from vsup.layout.plan import PlanError, PlanRequest, make_plan

GOLDEN = Path(__file__).parent / "golden" / "plan"

LLAMA_8B = {
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
MODELS: dict[str, dict[str, object]] = {
    "llama-8b": LLAMA_8B,
    # multi-head attention: as many KV heads as query heads
    "llama-7b-mha": {
        **LLAMA_8B,
        "intermediate_size": 11008,
        "num_key_value_heads": 32,
        "vocab_size": 32000,
        "max_position_embeddings": 4096,
    },
    # every layer windowed
    "mistral-7b": {
        **LLAMA_8B,
        "model_type": "mistral",
        "vocab_size": 32000,
        "max_position_embeddings": 32768,
        "sliding_window": 4096,
    },
    # sliding and full layers alternating
    "gemma2-9b": {
        "model_type": "gemma2",
        "hidden_size": 3584,
        "intermediate_size": 14336,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 256,
        "num_hidden_layers": 42,
        "vocab_size": 256000,
        "max_position_embeddings": 8192,
        "sliding_window": 4096,
        "torch_dtype": "bfloat16",
    },
    # five sliding layers, then a full one
    "gemma3-27b": {
        "model_type": "gemma3_text",
        "hidden_size": 5376,
        "intermediate_size": 21504,
        "num_attention_heads": 32,
        "num_key_value_heads": 16,
        "head_dim": 128,
        "num_hidden_layers": 62,
        "vocab_size": 262208,
        "max_position_embeddings": 131072,
        "sliding_window": 1024,
        "sliding_window_pattern": 6,
        "torch_dtype": "bfloat16",
    },
    # mixture of experts, sliding and full layers named in layer_types
    "gpt-oss-20b": {
        "model_type": "gpt_oss",
        "hidden_size": 2880,
        "intermediate_size": 2880,
        "head_dim": 64,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "num_hidden_layers": 24,
        "vocab_size": 201088,
        "max_position_embeddings": 131072,
        "sliding_window": 128,
        "layer_types": ["sliding_attention", "full_attention"] * 12,
        "num_local_experts": 32,
        "num_experts_per_tok": 4,
        "torch_dtype": "bfloat16",
    },
    # MLA, mixture of experts
    "deepseek-v2-lite": {
        "model_type": "deepseek_v2",
        "hidden_size": 2048,
        "intermediate_size": 10944,
        "moe_intermediate_size": 1408,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "num_hidden_layers": 27,
        "n_routed_experts": 64,
        "n_shared_experts": 2,
        "num_experts_per_tok": 6,
        "first_k_dense_replace": 1,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128,
        "v_head_dim": 128,
        "vocab_size": 102400,
        "max_position_embeddings": 163840,
        "torch_dtype": "bfloat16",
    },
    # linear attention (gated delta net) every layer but each fourth
    "qwen3-next": {
        "model_type": "qwen3_next",
        "hidden_size": 2048,
        "intermediate_size": 5120,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "num_hidden_layers": 48,
        "full_attention_interval": 4,
        "linear_num_value_heads": 32,
        "linear_num_key_heads": 16,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4,
        "num_experts": 512,
        "num_experts_per_tok": 10,
        "moe_intermediate_size": 512,
        "vocab_size": 151936,
        "max_position_embeddings": 262144,
        "torch_dtype": "bfloat16",
    },
    # mamba layers, a few attention ones
    "nemotron-h": {
        "model_type": "nemotron_h",
        "hidden_size": 4096,
        "intermediate_size": 21504,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "num_hidden_layers": 8,
        "hybrid_override_pattern": "M-M*M-M*",
        "mamba_num_heads": 128,
        "mamba_head_dim": 64,
        "ssm_state_size": 128,
        "vocab_size": 131072,
        "max_position_embeddings": 8192,
        "torch_dtype": "bfloat16",
    },
    # a config that sizes nothing
    "no-sizes": {"model_type": "mystery"},
    # chunked local attention on RoPE layers, global on NoPE ones
    "llama4-chunked": {
        **LLAMA_8B,
        "model_type": "llama4_text",
        "num_hidden_layers": 8,
        "attention_chunk_size": 8192,
        "no_rope_layers": [1, 1, 1, 0, 1, 1, 1, 0],
    },
}

# (case name, `vsup plan` arguments after --model): each ends in a golden file
CASES: dict[str, tuple[str, list[str]]] = {
    "llama-8b-per-gpu-2": ("llama-8b", ["--gpus", "0-7", "--per-gpu", "2", "--gpu", "H200"]),
    "llama-8b-tp2-h100": ("llama-8b", ["--gpus", "0-3", "--tp", "2", "--gpu", "H100"]),
    "llama-8b-tp2-dp2": ("llama-8b", ["--gpus", "0-7", "--tp", "2", "--dp", "2", "--gpu", "H200"]),
    "llama-8b-dp4-len": (
        "llama-8b",
        ["--gpus", "0-3", "--dp", "4", "--gpu", "MI300X", "--max-model-len", "32768"],
    ),
    "llama-8b-refused": ("llama-8b", ["--gpus", "0-7", "--per-gpu", "8", "--gpu", "H100"]),
    "llama-8b-time-share": (
        "llama-8b",
        ["--gpus", "0-1", "--per-gpu", "3", "--time-share", "--gpu", "H200"],
    ),
    "llama-8b-time-share-host-ram": (
        "llama-8b",
        [
            "--gpus",
            "0-3",
            "--per-gpu",
            "4",
            "--time-share",
            "--gpu",
            "H200",
            "--host-ram-gib",
            "64",
        ],
    ),
    "llama-8b-time-share-warn-level-2": (
        "llama-8b",
        [
            "--gpus",
            "0-1",
            "--per-gpu",
            "2",
            "--time-share",
            "--sleep-level",
            "2",
            "--gpu-mem-gib",
            "80",
            "--host-ram-gib",
            "40",
        ],
    ),
    "llama-8b-time-share-host-warn": (
        "llama-8b",
        [
            "--gpus",
            "0-1",
            "--per-gpu",
            "2",
            "--time-share",
            "--gpu",
            "H200",
            "--host-ram-gib",
            "100",
        ],
    ),
    "llama-8b-time-share-crowded": (
        "llama-8b",
        ["--gpus", "0-3", "--tp", "2", "--per-gpu", "12", "--time-share", "--gpu", "H200"],
    ),
    "llama-7b-mha": ("llama-7b-mha", ["--gpus", "0,1", "--per-gpu", "3", "--gpu", "H100"]),
    "mistral-7b-fp8": (
        "mistral-7b",
        ["--gpus", "0", "--gpu", "H200", "--kv-cache-dtype", "fp8", "--profile", "throughput"],
    ),
    "gemma2-9b": ("gemma2-9b", ["--gpus", "0-1", "--per-gpu", "2", "--gpu", "MI355X"]),
    "gemma3-27b-tp2": ("gemma3-27b", ["--gpus", "0-3", "--tp", "2", "--gpu", "H200"]),
    "gpt-oss-20b-dp2": ("gpt-oss-20b", ["--gpus", "0-1", "--dp", "2", "--gpu", "H200"]),
    "deepseek-v2-lite-tp2": (
        "deepseek-v2-lite",
        ["--gpus", "0-1", "--tp", "2", "--gpu", "H100", "--name", "mla", "--port-base", "9100"],
    ),
    "deepseek-v2-lite-dp2": ("deepseek-v2-lite", ["--gpus", "0-3", "--dp", "2", "--gpu", "H200"]),
    "qwen3-next-tp2": (
        "qwen3-next",
        ["--gpus", "0-1", "--tp", "2", "--gpu", "H200", "--max-model-len", "65536"],
    ),
    "qwen3-next-refused": ("qwen3-next", ["--gpus", "0", "--gpu", "H200"]),
    "nemotron-h": ("nemotron-h", ["--gpus", "0-1", "--per-gpu", "2", "--gpu", "H100"]),
    "llama4-chunked": ("llama4-chunked", ["--gpus", "0", "--gpu", "H200", "--utilization", "0.8"]),
    "max-len-too-long": ("llama-8b", ["--gpus", "0", "--per-gpu", "4", "--gpu-mem-gib", "24"]),
    "bad-per-gpu": ("llama-8b", ["--gpus", "0", "--per-gpu", "27", "--gpu", "H200"]),
    "bad-tp-groups": ("llama-8b", ["--gpus", "0-2", "--tp", "2", "--dp", "1", "--gpu", "H200"]),
    "bad-dp-groups": ("llama-8b", ["--gpus", "0-4", "--dp", "2", "--gpu", "H200"]),
    "bad-utilization": ("llama-8b", ["--gpus", "0", "--utilization", "0.99", "--gpu", "H200"]),
    "bad-time-share": ("llama-8b", ["--gpus", "0", "--time-share", "--gpu", "H200"]),
    "bad-dtype": ("llama-8b", ["--gpus", "0", "--dtype", "int3", "--gpu", "H200"]),
    "bad-port": ("llama-8b", ["--gpus", "0-1", "--port-base", "65535", "--gpu", "H200"]),
    "no-gpu": ("llama-8b", ["--gpus", "0"]),
    "too-many-per-gpu": (
        "llama-8b",
        ["--gpus", "0", "--per-gpu", "26", "--utilization", "0.2", "--gpu", "H200"],
    ),
    "weights-unknown": ("no-sizes", ["--gpus", "0", "--gpu", "H200"]),
    "gpus-all-elsewhere": ("llama-8b", ["--gpus", "all", "--gpu", "MI325X", "--tp", "8"]),
}

# (case name, PlanRequest keyword arguments): sized from the node's GPUs, or without a config
REQUESTS: dict[str, dict[str, Any]] = {
    "node-mi300x": {
        "model": "llama-8b",
        "gpus": [0, 1],
        "node": NodeFacts(
            tuple(NodeGpu(i, "AMD Instinct MI300X", 192 * GIB, "amd") for i in range(2))
        ),
    },
    "node-unnamed-host-ram": {
        "model": "llama-8b",
        "gpus": [0, 1],
        "per_gpu": 2,
        "time_share": True,
        "node": NodeFacts(
            tuple(NodeGpu(i, None, 80 * GIB, "nvidia") for i in range(2)),
            host_memory_bytes=24 * GIB,
        ),
    },
    "params-and-dtype": {
        "model": "org/unknown-model",
        "gpus": [0, 1],
        "gpu": "MI300X",
        "params": 8e9,
        "dtype": "fp8",
        "max_model_len": 4096,
        "hub": False,
    },
    "params-without-dtype": {
        "model": "org/unknown-model",
        "gpus": [0],
        "gpu": "H200",
        "hub": False,
    },
    "negative-gpu": {"model": "llama-8b", "gpus": [-1], "gpu": "H200"},
    "no-gpus": {"model": "llama-8b", "gpus": [], "gpu": "H200"},
    "bad-sleep-level": {"model": "llama-8b", "gpus": [0], "gpu": "H200", "sleep_level": 3},
    "zero-tp": {"model": "llama-8b", "gpus": [0], "gpu": "H200", "tp": 0},
    "zero-dp": {"model": "llama-8b", "gpus": [0], "gpu": "H200", "dp": 0},
    "unknown-gpu": {"model": "llama-8b", "gpus": [0], "gpu": "A100"},
    "missing-dir": {"model": "./no-such-model", "gpus": [0], "gpu": "H200"},
}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("golden-models")
    for name, cfg in MODELS.items():
        (root / name).mkdir()
        (root / name / "config.json").write_text(json.dumps(cfg))
        (root / name / "pytorch_model.bin").write_bytes(b"")
    return root


def _check(name: str, text: str, root: Path) -> None:
    # the installed package's place differs per checkout and venv: warnings name its profiles
    text = text.replace(str(root), "<models>").replace(str(Path(vsup.__file__).parent), "<vsup>")
    path = GOLDEN / f"{name}.txt"
    if os.environ.get("VSUP_UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"{path}: no golden file; write it with VSUP_UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{name}: the plan's output changed (see {path})"


@pytest.mark.parametrize("case", sorted(CASES))
def test_cli_output_is_unchanged(
    case: str,
    models: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(models)
    model, args = CASES[case]
    rc = main(["plan", "--model", str(models / model), *args, "--explain"])
    out, err = capsys.readouterr()
    _check(f"cli-{case}", f"exit {rc}\n--- stdout\n{out}--- stderr\n{err}", models)


@pytest.mark.parametrize("case", sorted(REQUESTS))
def test_plan_is_unchanged(case: str, models: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from vsup.layout.plan import render_budget, render_explain

    monkeypatch.chdir(models)
    kwargs = dict(REQUESTS[case])
    if not kwargs["model"].startswith(("org/", "./")):
        kwargs["model"] = str(models / kwargs["model"])
    try:
        plan = make_plan(PlanRequest(**kwargs), base_dir=models)
    except PlanError as exc:
        _check(f"req-{case}", f"PlanError: {exc}\n", models)
        return
    # the plan's repr, less its model info and layout document (the layout is dumped below)
    values = ", ".join(
        f"{f.name}={None if f.name in ('info', 'layout') else getattr(plan, f.name)!r}"
        for f in fields(plan)
    )
    text = (
        f"Plan({values})\n--- budget\n{render_budget(plan)}--- explain\n{render_explain(plan)}"
        f"--- layout\n{dumps_layout(plan.layout)}"
    )
    _check(f"req-{case}", text, models)
