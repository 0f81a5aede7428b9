"""Which of a hub repository's files vLLM loads: those are the files `vsup pull` fetches.

vLLM 0.32 (`model_executor/model_loader/default_loader.py` `_prepare_weights` and
`weight_utils.download_weights_from_hf`), with `--load-format auto` (the default):
- weights are files at the top of the repository (vLLM globs `DIR/*.safetensors`, never a
  subfolder, and ignores `original/**` by default);
- `consolidated*.safetensors` present: the Mistral format (`consolidated.safetensors.index.json`
  names its shards);
- else `*.safetensors`: when `model.safetensors.index.json` exists, only the files its
  `weight_map` names (Mistral-7B-v0.3 ships both sharded and consolidated files; loading both
  breaks), else every top-level `*.safetensors`;
- else `*.bin` (PyTorch), without `training_args.bin` / `optimizer.bin`
  (`filter_files_not_needed_for_inference`), with `pytorch_model.bin.index.json`;
- else `*.pt`.
So a repository with both safetensors and `.bin` files gets only the safetensors.
`--load-format safetensors` takes only safetensors, `pt` only `*.pt`, `mistral` only the
consolidated files, `dummy` no weights at all. Another format (gguf, bitsandbytes, tensorizer,
...) is one vsup does not model: it fetches every file but `original/**`, and says so.

Besides the weights vLLM reads the config (`config.json`, `params.json` for Mistral's format,
`generation_config.json`, quantization configs such as `hf_quant_config.json`), the tokenizer
(`tokenizer.json`, `tokenizer_config.json`, `special_tokens_map.json`, `added_tokens.json`,
`vocab.*`, `merges.txt`, `tokenizer.model*`, `*.tiktoken`, `tekken.json`, chat templates),
processor configs of multimodal models, pooling configs (`modules.json`, `1_Pooling/`) and the
Python files of `--trust-remote-code` models: every file whose name ends in `.json`, `.txt`,
`.model`, `.jinja`, `.py`, `.tiktoken` or `.vocab` (or starts with `tokenizer.model`), outside
`original/`. README, images, licences and `.gitattributes` are left on the hub.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

SAFE_INDEX = "model.safetensors.index.json"
MISTRAL_INDEX = "consolidated.safetensors.index.json"
BIN_INDEX = "pytorch_model.bin.index.json"
# vLLM's LoadConfig.ignore_patterns default
IGNORED_DIRS = ("original/",)
# vLLM's filter_files_not_needed_for_inference
NOT_FOR_INFERENCE = (
    "training_args.bin",
    "optimizer.bin",
    "optimizer.pt",
    "scheduler.pt",
    "scaler.pt",
)
WEIGHT_SUFFIXES = (
    ".safetensors",
    ".bin",
    ".pt",
    ".pth",
    ".ckpt",
    ".h5",
    ".msgpack",
    ".onnx",
    ".gguf",
    ".tflite",
    ".ot",
    ".npz",
)
SUPPORT_SUFFIXES = (".json", ".txt", ".model", ".jinja", ".py", ".tiktoken", ".vocab")
# Formats whose weight files vsup knows (the rules above); `dummy` loads random weights.
KNOWN_FORMATS = ("auto", "hf", "safetensors", "fastsafetensors", "mistral", "pt", "dummy")


@dataclass(frozen=True)
class RepoFile:
    """One file of a repository at a commit, as the hub lists it."""

    name: str  # its path in the repository
    size: int | None
    # the name huggingface_hub stores it under in `blobs/`: the LFS sha256, else the git blob id
    blob: str | None = None


@dataclass(frozen=True)
class Selection:
    """The files a pull fetches, and how they were chosen (for `vsup pull`'s summary)."""

    files: tuple[RepoFile, ...]
    weights: str  # safetensors | mistral | bin | pt | none | all (an unmodelled load format)
    left_out: tuple[str, ...]  # files of the repository that are not fetched
    note: str | None = None  # a caveat a person should read (an unmodelled load format)

    @property
    def total_bytes(self) -> int:
        return sum(f.size or 0 for f in self.files)


def _top(name: str) -> bool:
    return "/" not in name


def _ignored(name: str) -> bool:
    return any(name.startswith(d) for d in IGNORED_DIRS)


def is_support_file(name: str) -> bool:
    """A config, tokenizer, template or remote-code file (any folder but `original/`)."""
    if _ignored(name):
        return False
    base = name.rsplit("/", 1)[-1]
    if base.startswith("tokenizer.model"):
        return True
    if base.endswith(WEIGHT_SUFFIXES):
        return False
    return base.endswith(SUPPORT_SUFFIXES) and base not in (BIN_INDEX,)


def _weights_from_index(
    index_name: str, present: dict[str, RepoFile], read_json: Callable[[str], Any]
) -> list[str] | None:
    """The shard names the index's weight_map lists (None: no usable index)."""
    if index_name not in present:
        return None
    doc = read_json(index_name)
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        return None
    return sorted({str(v) for v in weight_map.values()})


# vLLM's weight formats in the order `auto` tries them: (the --load-format values that read
# it, its top-level files, the kind, its index, whether the index names the shards to fetch).
# `dummy` reads none.
_WEIGHT_KINDS: tuple[tuple[tuple[str, ...], str, str, str | None, bool], ...] = (
    (("auto", "mistral"), "consolidated*.safetensors", "mistral", MISTRAL_INDEX, True),
    (
        ("auto", "hf", "safetensors", "fastsafetensors"),
        "*.safetensors",
        "safetensors",
        SAFE_INDEX,
        True,
    ),
    (("auto", "hf"), "*.bin", "bin", BIN_INDEX, False),
    (("auto", "hf", "pt"), "*.pt", "pt", None, False),
)


def select_files(
    files: Sequence[RepoFile],
    read_json: Callable[[str], Any],
    load_format: str | None = None,
) -> Selection:
    """The files vLLM loads with `--load-format load_format` (None: auto). `read_json(name)`
    gives a (small) JSON file's content: the safetensors index, when there is one."""
    fmt = (load_format or "auto").lower()
    by_name = {f.name: f for f in files}
    note = None
    if fmt not in KNOWN_FORMATS:
        chosen = [f.name for f in files if not _ignored(f.name)]
        note = (
            f"vsup does not know which files --load-format {load_format} reads: it fetches every "
            "file but original/**"
        )
        return _selection(files, chosen, "all", note)
    top = [f.name for f in files if _top(f.name)]
    kind, index, weights = _weights(fmt, top, by_name, read_json)
    missing = [w for w in weights if w not in by_name]
    if missing:
        note = f"the weight index names files the repository does not have: {', '.join(missing)}"
        weights = [w for w in weights if w in by_name]
    chosen = list(weights)
    if index and index in by_name:
        chosen.append(index)
    # Other formats' indexes are support-looking JSON files that vLLM never reads.
    other_indexes = {SAFE_INDEX, MISTRAL_INDEX, BIN_INDEX} - {index or ""}
    chosen += [
        f.name
        for f in files
        if is_support_file(f.name) and f.name not in chosen and f.name not in other_indexes
    ]
    return _selection(files, chosen, kind, note)


def _weights(
    fmt: str, top: list[str], by_name: dict[str, RepoFile], read_json: Callable[[str], Any]
) -> tuple[str, str | None, list[str]]:
    """(kind, index, weight files) of the first format `fmt` reads that the repository has."""
    for formats, pattern, kind, index, indexed in _WEIGHT_KINDS:
        if fmt not in formats:
            continue
        found = sorted(n for n in top if fnmatch.fnmatch(n, pattern))
        if not found:
            continue
        if indexed and index is not None:
            return kind, index, _weights_from_index(index, by_name, read_json) or found
        return kind, index, [n for n in found if not n.endswith(NOT_FOR_INFERENCE)]
    return "none", None, []


def _selection(
    files: Sequence[RepoFile], chosen: Sequence[str], kind: str, note: str | None
) -> Selection:
    keep = set(chosen)
    picked = tuple(f for f in files if f.name in keep)
    left_out = tuple(f.name for f in files if f.name not in keep)
    return Selection(picked, kind, left_out, note)
