"""Rules about the model an instance serves and the command that runs vLLM."""

from __future__ import annotations

import os
import re
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


# The one model `make demo` generates (layouts/cpu-demo.toml, supervisor/vsup/demo/).
DEMO_MODEL_PARTS = (".demo", "models", "tiny-llama")
# A hub repo id as the hub accepts it: `name` or `org/name` (huggingface_hub's rule).
HUB_ID = re.compile(r"^(?:[\w.-]+/)?[\w.-]+$")
# Files vLLM loads weights from (safetensors, PyTorch .bin/.pt/.pth, GGUF, Mistral's
# consolidated format is safetensors too).
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".ckpt", ".npz")
CONFIG_FILES = ("config.json", "params.json")  # params.json: Mistral's own format


def _is_demo_model(path: Path) -> bool:
    return path.parts[-len(DEMO_MODEL_PARTS) :] == DEMO_MODEL_PARTS


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


def model_not_hub_id(ctx: Context, m: MergedInstance) -> list[Diagnostic]:
    """A model that is no local path (/, ./, ../, ~) must be a hub id, `org/name`: vLLM would
    look `tmp/x/model` up on the hub and exit with model_not_found."""
    model = m.values.get("model")
    if not isinstance(model, str) or not model.strip() or is_local_model(model):
        return []
    if HUB_ID.match(model) and ".." not in model and "--" not in model and len(model) <= 96:
        return _hub_id_beside_a_directory(ctx, m, model)
    here = (ctx.layout.base_dir or Path.cwd()) / model
    hint = (
        f'; the directory {here} exists: write model = "./{model}"'
        if here.is_dir()
        else "; write a hub id (org/name) or a local path starting with /, ./, ../ or ~"
    )
    return [
        origin_diag(
            ERROR,
            f"model '{model}' is neither a hub id (org/name) nor a local path{hint}",
            m,
            "model",
        )
    ]


def _hub_id_beside_a_directory(ctx: Context, m: MergedInstance, model: str) -> list[Diagnostic]:
    """`models/tiny` reads as a hub id, and vLLM would ask the hub for it (model_not_found)
    although `./models/tiny` is a directory beside the layout: almost surely a missing `./`."""
    if ctx.layout.path is None:
        return []  # no file, no "beside": the daemon's own directory means nothing
    here = ctx.layout.base_dir / model
    if not here.is_dir():
        return []
    return [
        origin_diag(
            ERROR,
            f"model '{model}' reads as a hub id, but {here} is a directory beside the layout: "
            f'did you mean ./{model}? (write model = "./{model}"; for the hub model of that '
            "name, move the directory)",
            m,
            "model",
        )
    ]


def local_model_incomplete(ctx: Context, m: MergedInstance) -> list[Diagnostic]:
    """A local model directory vLLM could not load: no config, or no weights."""
    model = m.values.get("model")
    if not isinstance(model, str) or not model.strip() or not is_local_model(model):
        return []
    path = Path(ctx.local_model_path(model))
    if path.is_file():
        if path.suffix == ".gguf":
            return []  # vLLM serves a single GGUF file
        return [
            origin_diag(
                ERROR,
                f"local model path {path} is a file: point model at the model's directory "
                "(or at a .gguf file)",
                m,
                "model",
            )
        ]
    if not path.is_dir():
        return []  # missing: local_model_missing says so
    try:
        names = [p.name for p in path.iterdir()]
    except OSError as exc:
        return [origin_diag(ERROR, f"cannot read local model directory {path}: {exc}", m, "model")]
    missing = []
    if not any(n in CONFIG_FILES for n in names) and not any(n.endswith(".gguf") for n in names):
        missing.append("no config.json")
    if not any(n.endswith(WEIGHT_SUFFIXES) for n in names):
        missing.append("no weights (*.safetensors, *.bin, *.pt, *.pth or *.gguf)")
    if not missing:
        return []
    demo = (
        ": it is the demo's tiny model, which `make demo` generates again (run it in the checkout)"
        if _is_demo_model(path)
        else ": vLLM could not load it; finish the download or fix the path"
    )
    return [
        origin_diag(
            ERROR,
            f"local model directory {path} has {' and '.join(missing)}{demo}",
            m,
            "model",
        )
    ]


def command_not_found(ctx: Context, m: MergedInstance) -> list[Diagnostic]:
    """Not found: only a warning, layouts are often checked on another machine than the one
    they run on. Found but not runnable by this user (a directory it may not enter, no
    execute bit): an error, the start would fail."""
    command = m.values.get("command")
    if not (isinstance(command, list) and command and command[0]):
        return []
    program = command[0]
    found = shutil.which(program, path=instance_path())
    if program in ("python", "python3") or found:
        return []
    try:
        exists = Path(program).is_file()
    except OSError as exc:  # a directory on the way this user may not enter
        return [_command_error(m, program, f"cannot be read: {exc.strerror or exc}")]
    if exists and not os.access(program, os.X_OK):
        return [_command_error(m, program, "is not executable by this user")]
    if exists:
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


def _command_error(m: MergedInstance, program: str, what: str) -> Diagnostic:
    """The instance's program exists but this user cannot run it: vLLM would never start."""
    return origin_diag(
        ERROR,
        f"command '{program}' {what}: the instance could not start; fix the permissions of "
        "the file and its directories, or set command to a program this user may run",
        m,
        "command",
    )


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
