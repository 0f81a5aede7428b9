"""Rules about the model an instance serves and the command that runs vLLM."""

from __future__ import annotations

import shutil
from pathlib import Path

from vsup.layout.diagnostics import ERROR, WARNING, Diagnostic
from vsup.layout.merge import MergedInstance
from vsup.layout.modelinfo import quantized_by_name
from vsup.layout.modelpath import is_local_model
from vsup.layout.rules.context import Context, origin_diag
from vsup.layout.schema import is_number
from vsup.layout.vllm_flags import instance_path

# Below this start timeout, on-the-fly quantization (minutes of extra start-up) risks a timeout.
QUANTIZE_START_TIMEOUT_S = 1800


def model_empty(ctx: Context, m: MergedInstance) -> list[Diagnostic]:
    model = m.values.get("model")
    if not isinstance(model, str) or model.strip():
        return []
    return [
        origin_diag(
            ERROR, 'model is empty: set model = "org/name" or a local directory', m, "model"
        )
    ]


def _is_demo_model(path: Path) -> bool:
    # layouts/cpu-demo.toml serves `.demo/models/...`, which `make demo` generates.
    parts = path.parts
    return any(a == ".demo" and b == "models" for a, b in zip(parts, parts[1:], strict=False))


def local_model_missing(ctx: Context, m: MergedInstance) -> list[Diagnostic]:
    model = m.values.get("model")
    if not isinstance(model, str) or not model.strip() or not is_local_model(model):
        return []
    path = Path(ctx.local_model_path(model))
    if path.exists():
        return []
    rel = " (relative paths start from the layout's directory)" if model.startswith(".") else ""
    fix = (
        "it is the demo's tiny model, which `make demo` generates (run it in the checkout)"
        if _is_demo_model(path)
        else "fix the path or download the model there"
    )
    return [origin_diag(ERROR, f"local model path {path} does not exist{rel}: {fix}", m, "model")]


def command_not_found(ctx: Context, m: MergedInstance) -> list[Diagnostic]:
    """Only a warning: layouts are often checked on another machine than the one they run on."""
    command = m.values.get("command")
    if not (isinstance(command, list) and command and command[0]):
        return []
    program = command[0]
    found = shutil.which(program, path=instance_path())
    if program in ("python", "python3") or found or Path(program).is_file():
        return []
    return [
        origin_diag(
            WARNING,
            f"command '{program}' is not found on this node (fine if this layout is for another "
            'node); install vLLM or set command (e.g. ["python", "-m", '
            '"vllm.entrypoints.openai.api_server"])',
            m,
            "command",
        )
    ]


def on_the_fly_quantization(ctx: Context, m: MergedInstance) -> list[Diagnostic]:
    """Quantizing a checkpoint while it loads adds minutes to start-up."""
    quant = m.arg("quantization")
    model = m.values.get("model")
    if not (isinstance(quant, str) and quant and isinstance(model, str)):
        return []
    info = ctx.model_info(m)
    prequantized = (info is not None and info.quantization is not None) or quantized_by_name(
        model
    ) is not None
    timeout = m.values.get("start_timeout_s")
    if prequantized or not is_number(timeout) or timeout >= QUANTIZE_START_TIMEOUT_S:
        return []
    return [
        origin_diag(
            WARNING,
            f"quantization = '{quant}' quantizes {model} while it loads, which adds minutes to "
            f"start-up: raise start_timeout_s (now {timeout:g}) to {QUANTIZE_START_TIMEOUT_S} or "
            "more, or serve a pre-quantized checkpoint",
            m,
            "args",
            m.arg_key("quantization") or "",
        )
    ]
