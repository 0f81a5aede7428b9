"""What a model needs in memory, from its files when they are here, else from what the user says.

- Weights: the exact byte count from the safetensors headers (only the JSON header of each file
  is read, never the tensors), else parameters x bytes per parameter, quantization aware.
- Parameters: from `config.json` (dense, MoE and MLA attention), else the safetensors headers,
  else `--params`, else the model's name ("Llama-3.1-8B" -> 8e9).
- KV cache: per layer type (full, sliding window, MLA, linear), grouped the way vLLM's KV cache
  manager groups them (vsup.layout.kvcache).

A hub id is looked up in the local Hugging Face cache (`$HF_HUB_CACHE`, `$HF_HOME/hub`,
`~/.cache/huggingface/hub`) so a model downloaded once counts as local. Only `model_info(...,
hub=True)` (the planner) goes further: vsup's cache, then the hub (vsup.layout.hub).
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vsup.layout.hub import hub_model, read_cached
from vsup.layout.kvcache import KVLayout, kv_layout
from vsup.layout.modelpath import is_local_model, resolve_model_path

# Bytes per parameter for a weight dtype or quantization. 4-bit formats carry group scales
# (awq/gptq: fp16 scale + packed zero per 128 weights; mxfp4: one byte per 32; nvfp4: one per 16).
DTYPE_BYTES: dict[str, float] = {
    "float32": 4,
    "fp32": 4,
    "float": 4,
    "bfloat16": 2,
    "bf16": 2,
    "float16": 2,
    "fp16": 2,
    "half": 2,
    "fp8": 1,
    "float8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "ptpc_fp8": 1,
    "int8": 1,
    "w8a8": 1,
    "int4": 0.53,
    "w4a16": 0.53,
    "awq": 0.53,
    "gptq": 0.53,
    "mxfp4": 0.53,
    "fp4": 0.53,
    "nvfp4": 0.5625,
    # what a model's name may say (quantized_by_name)
    "w8a16": 1,
    "8bit": 1,
    "4bit": 0.53,
    "bnb": 0.53,
}

# safetensors dtype names -> bytes per element (for the dominant checkpoint dtype).
_ST_DTYPE_BYTES = {
    "F64": 8,
    "I64": 8,
    "U64": 8,
    "F32": 4,
    "I32": 4,
    "U32": 4,
    "F16": 2,
    "BF16": 2,
    "I16": 2,
    "U16": 2,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "F8_E8M0": 1,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
}
_ST_DTYPE_NAMES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64"}

_HEADER_LIMIT = 100 * 1024 * 1024  # safetensors caps its JSON header at 100 MB

_QUANT_NAME_RE = re.compile(
    r"(?:^|[-_.])"
    r"(fp8|fp4|mxfp4|nvfp4|awq|gptq|int4|int8|w4a16|w8a8|w8a16|bnb|4bit|8bit|gguf)"
    r"(?:$|[-_.])",
    re.IGNORECASE,
)


def dtype_bytes(name: str | None) -> float | None:
    if not name:
        return None
    return DTYPE_BYTES.get(str(name).lower().replace("torch.", ""))


@dataclass(frozen=True)
class SafetensorsSummary:
    files: int
    bytes: int  # tensor bytes over all files
    params: int  # elements over all tensors (packed 4-bit tensors count their packed shape)
    dominant_dtype: str | None  # the dtype holding most bytes, e.g. "BF16"


def read_safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of one .safetensors file (8-byte little-endian length, then JSON)."""
    with open(path, "rb") as fh:
        raw = fh.read(8)
        if len(raw) != 8:
            raise ValueError(f"{path}: too short for a safetensors file")
        (size,) = struct.unpack("<Q", raw)
        if size > _HEADER_LIMIT:
            raise ValueError(f"{path}: safetensors header of {size} bytes is implausible")
        data = fh.read(size)
    header = json.loads(data)
    if not isinstance(header, dict):
        raise ValueError(f"{path}: safetensors header is not a JSON object")
    return header


def safetensors_files(directory: Path) -> list[Path]:
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text()).get("weight_map", {})
            names = sorted(set(weight_map.values()))
            files = [directory / n for n in names]
            if files and all(f.is_file() for f in files):
                return files
        except (OSError, ValueError, AttributeError):
            pass
    return sorted(p for p in directory.glob("*.safetensors") if p.is_file())


def summarize_safetensors(directory: Path) -> SafetensorsSummary | None:
    """Sum tensor bytes and elements over a model directory's safetensors headers."""
    files = safetensors_files(directory)
    if not files:
        return None
    total = params = 0
    by_dtype: dict[str, int] = {}
    for f in files:
        header = read_safetensors_header(f)
        for name, entry in header.items():
            if name == "__metadata__" or not isinstance(entry, Mapping):
                continue
            begin, end = entry.get("data_offsets", (0, 0))
            nbytes = int(end) - int(begin)
            total += nbytes
            params += math.prod(int(d) for d in entry.get("shape", ()))
            dtype = str(entry.get("dtype", "?"))
            by_dtype[dtype] = by_dtype.get(dtype, 0) + nbytes
    dominant = max(by_dtype, key=by_dtype.get) if by_dtype else None  # type: ignore[arg-type]
    return SafetensorsSummary(len(files), total, params, dominant)


def hf_cache_dirs(env: Mapping[str, str] | None = None) -> list[Path]:
    env = os.environ if env is None else env
    dirs = []
    if env.get("HF_HUB_CACHE"):
        dirs.append(Path(env["HF_HUB_CACHE"]).expanduser())
    if env.get("HF_HOME"):
        dirs.append(Path(env["HF_HOME"]).expanduser() / "hub")
    dirs.append(Path("~/.cache/huggingface/hub").expanduser())
    return dirs


def hub_snapshot(model: str, env: Mapping[str, str] | None = None) -> Path | None:
    """The local snapshot directory of a hub id in the Hugging Face cache, if it has a config."""
    if "/" not in model or model.count("/") != 1:
        return None
    org, name = model.split("/")
    for cache in hf_cache_dirs(env):
        repo = cache / f"models--{org}--{name}"
        snapshots = repo / "snapshots"
        if not snapshots.is_dir():
            continue
        ref = repo / "refs" / "main"
        candidates = []
        if ref.is_file():
            candidates.append(snapshots / ref.read_text().strip())
        candidates += sorted(snapshots.iterdir(), key=lambda p: p.stat().st_mtime, reverse=True)
        for c in candidates:
            if (c / "config.json").is_file():
                return c
    return None


def params_from_name(model: str) -> float | None:
    """Parameters a model's name states: "Llama-3.1-8B" -> 8e9, "Mixtral-8x7B" -> 56e9."""
    base = model.rstrip("/").split("/")[-1]
    m = re.search(r"(?<![A-Za-z0-9.])(\d+)x(\d+(?:\.\d+)?)[Bb](?![A-Za-z0-9])", base)
    if m:
        return int(m.group(1)) * float(m.group(2)) * 1e9
    m = re.search(r"(?<![A-Za-z0-9.])(\d+(?:\.\d+)?)[Bb](?![A-Za-z0-9])", base)
    if m:
        return float(m.group(1)) * 1e9
    m = re.search(r"(?<![A-Za-z0-9.])(\d+(?:\.\d+)?)[Mm](?![A-Za-z0-9])", base)
    if m:
        return float(m.group(1)) * 1e6
    return None


def quantized_by_name(model: str) -> str | None:
    m = _QUANT_NAME_RE.search(model.rstrip("/").split("/")[-1])
    return m.group(1).lower() if m else None


def _num(cfg: Mapping[str, Any], *keys: str) -> int | None:
    for k in keys:
        v = cfg.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
            return int(v)
    return None


def text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The language model's part of a config (multimodal configs nest it)."""
    for key in ("text_config", "llm_config", "language_config"):
        sub = config.get(key)
        if isinstance(sub, Mapping) and sub.get("hidden_size"):
            return sub
    return config


@dataclass(frozen=True)
class ModelInfo:
    model: str
    local_dir: Path | None = None
    config: dict[str, Any] | None = None
    safetensors: SafetensorsSummary | None = None
    explicit_params: float | None = None  # --params, in parameters
    explicit_dtype: str | None = None  # --dtype
    problems: tuple[str, ...] = field(default=())  # files that could not be read
    source: str = ""  # where the config and weight sizes came from
    missing: str | None = None  # why a hub id has no config: what to do about it

    # -- architecture ---------------------------------------------------------------------

    @property
    def arch(self) -> Mapping[str, Any]:
        return text_config(self.config) if self.config else {}

    @property
    def hidden_size(self) -> int | None:
        return _num(self.arch, "hidden_size", "n_embd", "d_model")

    @property
    def num_layers(self) -> int | None:
        """Hidden layers, as vLLM splits them over pipeline stages."""
        return _num(self.arch, "num_hidden_layers", "n_layer", "num_layers", "n_layers")

    @property
    def num_heads(self) -> int | None:
        return _num(self.arch, "num_attention_heads", "n_head", "num_heads")

    @property
    def num_kv_heads(self) -> int | None:
        a = self.arch
        if a.get("multi_query") is True:
            return 1
        return _num(a, "num_key_value_heads", "n_head_kv", "num_kv_heads") or self.num_heads

    @property
    def head_dim(self) -> int | None:
        hd = _num(self.arch, "head_dim")
        if hd:
            return hd
        if self.hidden_size and self.num_heads:
            return self.hidden_size // self.num_heads
        return None

    @property
    def kv_lora_rank(self) -> int | None:
        return _num(self.arch, "kv_lora_rank")

    @property
    def is_mla(self) -> bool:
        """Multi-head latent attention (DeepSeek V2/V3, Kimi K2...): a config with kv_lora_rank."""
        return self.kv_lora_rank is not None

    @property
    def num_experts(self) -> int | None:
        return _num(
            self.arch, "num_local_experts", "n_routed_experts", "num_experts", "moe_num_experts"
        )

    @property
    def is_moe(self) -> bool | None:
        """A mixture-of-experts model; None without a config to tell."""
        return None if self.config is None else self.num_experts is not None

    @property
    def max_position_embeddings(self) -> int | None:
        return _num(self.arch, "max_position_embeddings", "n_positions", "max_sequence_length")

    @property
    def torch_dtype(self) -> str | None:
        for cfg in (self.config or {}, self.arch):
            for key in ("torch_dtype", "dtype"):
                v = cfg.get(key)
                if isinstance(v, str) and dtype_bytes(v):
                    return v.replace("torch.", "")
        if self.safetensors and self.safetensors.dominant_dtype in _ST_DTYPE_NAMES:
            return _ST_DTYPE_NAMES[self.safetensors.dominant_dtype]
        return None

    @property
    def quantization(self) -> str | None:
        """The checkpoint's quantization as a DTYPE_BYTES name (fp8, int8, int4, awq, gptq,
        mxfp4, nvfp4), else the config's raw method; None for an unquantized checkpoint."""
        qc = (self.config or {}).get("quantization_config") or self.arch.get("quantization_config")
        if not isinstance(qc, Mapping):
            return None
        return canonical_quantization(qc)

    @property
    def is_prequantized(self) -> bool:
        return self.quantization is not None or quantized_by_name(self.model) is not None

    # -- sizes ----------------------------------------------------------------------------

    @property
    def config_params(self) -> int | None:
        return estimate_params(self.arch) if self.config else None

    @property
    def params(self) -> float | None:
        """Parameters: config, else safetensors elements, else --params, else the name."""
        return (
            self.explicit_params
            or self.config_params
            or (self.safetensors.params if self.safetensors else None)
            or params_from_name(self.model)
        )

    @property
    def params_source(self) -> str:
        if self.explicit_params:
            return "--params"
        if self.config_params:
            return "config.json"
        if self.safetensors:
            return "safetensors headers"
        if params_from_name(self.model):
            return "the model's name"
        return "unknown"

    def embedding_params(self) -> int:
        a = self.arch
        h, vocab = self.hidden_size, _num(a, "vocab_size")
        if not h or not vocab:
            return 0
        tied = bool(a.get("tie_word_embeddings", (self.config or {}).get("tie_word_embeddings")))
        return h * vocab * (1 if tied else 2)

    def vocab_bytes(self, weights: int) -> tuple[int, int]:
        """(bytes of one vocabulary x hidden matrix within `weights`, how many of them `weights`
        counts: 1 with tied embeddings, else 2, the input embedding and the LM head); (0, 0)
        when the config does not say. 16-bit in quantized checkpoints (as `weight_bytes`
        counts them), else the weights' own width."""
        h, vocab, params = self.hidden_size, _num(self.arch, "vocab_size"), self.params
        if not h or not vocab or not params:
            return 0, 0
        matrices = self.embedding_params() // (h * vocab)
        if not matrices:
            return 0, 0
        per_param = max(2.0, weights / params)
        return min(int(h * vocab * per_param), weights // matrices), matrices

    def weight_bytes(
        self, dtype: str | None = None, quantization: str | None = None
    ) -> tuple[int | None, str]:
        """Bytes the weights take on the GPUs (all TP ranks together) and how that was found.

        `dtype` is vLLM's --dtype (None or "auto": the checkpoint's); `quantization` is vLLM's
        --quantization (on-the-fly quantization of an unquantized checkpoint shrinks it).
        """
        dtype = self.explicit_dtype if dtype in (None, "auto") else dtype
        on_the_fly = quantization if quantization and not self.is_prequantized else None
        if self.safetensors and not on_the_fly:
            st = self.safetensors
            width = dtype_bytes(dtype) if dtype and not self.is_prequantized else None
            if width:
                return int(st.params * width), f"safetensors headers ({st.files} files), as {dtype}"
            return st.bytes, f"safetensors headers ({st.files} files)"
        params = self.params
        if not params:
            return None, "unknown"
        quant = (
            on_the_fly
            or self.quantization
            or (quantized_by_name(self.model) if not dtype else None)
        )
        per_param = dtype_bytes(quant) or dtype_bytes(dtype) or dtype_bytes(self.torch_dtype)
        if per_param is None:
            return (
                None,
                f"unknown (no dtype: give --dtype; {self.params_source} gives the parameters)",
            )
        source = f"{params / 1e9:.2f}B params ({self.params_source}) x {per_param:g} bytes"
        if quant and per_param < 2:
            # Embeddings and the LM head stay in 16 bits in quantized checkpoints.
            embed = min(self.embedding_params(), int(params))
            return int(
                (params - embed) * per_param + embed * 2
            ), source + f" ({quant}; embeddings 16-bit)"
        return int(params * per_param), source

    def kv_width(self, kv_cache_dtype: str | None = None, dtype: str | None = None) -> int:
        """Bytes per cached element: the KV cache dtype, else the model's compute dtype."""
        kv_dt = (kv_cache_dtype or "auto").lower()
        if kv_dt.startswith(("fp8", "int8")):
            return 1
        if kv_dt != "auto":
            return int(dtype_bytes(kv_dt) or 2)
        width = dtype_bytes(dtype if dtype not in (None, "auto") else None) or dtype_bytes(
            self.torch_dtype
        )
        if width is None or width < 2:
            width = 2  # quantized checkpoints compute (and cache) in 16 bits
        return int(width)

    def kv_layout(
        self,
        kv_cache_dtype: str | None = None,
        tp: int = 1,
        dtype: str | None = None,
        hybrid_manager: bool = True,
        pp: int = 1,
        partition: tuple[int, ...] | None = None,
    ) -> KVLayout | None:
        """The KV cache layout on one GPU of a TP-`tp` x PP-`pp` instance (vsup.layout.kvcache;
        `partition`: VLLM_PP_LAYER_PARTITION, read)."""
        if not self.config:
            return None
        return kv_layout(
            self.arch,
            width=self.kv_width(kv_cache_dtype, dtype),
            tp=tp,
            hybrid_manager=hybrid_manager,
            pp=pp,
            partition=partition,
        )

    def kv_bytes_per_token(
        self, kv_cache_dtype: str | None = None, tp: int = 1, dtype: str | None = None
    ) -> int | None:
        """KV-cache bytes one token slot takes on one GPU of a TP-`tp` instance, as vLLM's
        pool counts them (a sliding-window model's windowed layers share slots with its full
        ones: see vsup.layout.kvcache). None when unknown."""
        layout = self.kv_layout(kv_cache_dtype, tp, dtype)
        return layout.bytes_per_token or None if layout is not None else None


def canonical_quantization(qc: Mapping[str, Any]) -> str:
    """A `quantization_config` as one of DTYPE_BYTES's names where the format is known:
    `fbgemm_fp8` -> fp8, gptq with 8 bits -> int8, compressed-tensors 4-bit -> int4, ..."""
    method = str(qc.get("quant_method") or "").lower()
    algo = str(qc.get("quant_algo") or "").lower()  # modelopt: FP8, NVFP4, W4A8_AWQ
    bits = qc.get("bits") or qc.get("w_bit") or qc.get("weight_bits")
    if method in ("compressed-tensors", "compressed_tensors"):
        bits = _compressed_tensors_bits(qc)
        if bits == 8:
            fmt = json.dumps(qc).lower()
            return "fp8" if '"float"' in fmt or "fp8" in fmt else "int8"
        return "int4" if bits == 4 else "compressed-tensors"
    if method == "bitsandbytes":
        return "int4" if qc.get("load_in_4bit") else "int8"
    for name in ("nvfp4", "mxfp4"):
        if name in method or name in algo:
            return name
    if "fp8" in method or "fp8" in algo:
        return "fp8"  # fp8, fbgemm_fp8, ptpc_fp8, modelopt FP8
    if bits == 8:
        return "int8"
    for name in ("awq", "gptq"):
        if name in method or name in algo:
            return name
    if bits == 4:
        return "int4"
    return method or algo or "quantized"


def _compressed_tensors_bits(qc: Mapping[str, Any]) -> int | None:
    groups = qc.get("config_groups")
    if isinstance(groups, Mapping):
        for group in groups.values():
            weights = group.get("weights") if isinstance(group, Mapping) else None
            if isinstance(weights, Mapping) and isinstance(weights.get("num_bits"), int):
                return weights["num_bits"]
    return None


def estimate_params(cfg: Mapping[str, Any]) -> int | None:
    """Parameters of a decoder-only transformer from its config (dense, MoE, MLA)."""
    h = _num(cfg, "hidden_size", "n_embd", "d_model")
    layers = _num(cfg, "num_hidden_layers", "n_layer", "num_layers")
    vocab = _num(cfg, "vocab_size")
    heads = _num(cfg, "num_attention_heads", "n_head")
    if not (h and layers and vocab and heads):
        return None
    kv = _num(cfg, "num_key_value_heads", "n_head_kv") or heads
    hd = _num(cfg, "head_dim") or h // heads
    inter = _num(cfg, "intermediate_size", "ffn_dim", "n_inner") or 4 * h
    kv_lora = _num(cfg, "kv_lora_rank")
    if kv_lora:
        q_lora = _num(cfg, "q_lora_rank")
        nope = _num(cfg, "qk_nope_head_dim") or hd
        rope = _num(cfg, "qk_rope_head_dim") or 0
        v_hd = _num(cfg, "v_head_dim") or hd
        q = (
            (h * q_lora + q_lora + q_lora * heads * (nope + rope))
            if q_lora
            else h * heads * (nope + rope)
        )
        kv_proj = h * (kv_lora + rope) + kv_lora + kv_lora * heads * (nope + v_hd)
        attn = q + kv_proj + heads * v_hd * h
    else:
        attn = h * heads * hd + 2 * h * kv * hd + heads * hd * h
    model_type = str(cfg.get("model_type", "")).lower()
    mats = 2 if model_type in ("gpt2", "opt", "gpt_neox", "bloom", "falcon", "gptj", "phi") else 3
    dense_mlp = mats * h * inter
    experts = _num(cfg, "num_local_experts", "n_routed_experts", "num_experts")
    if experts:
        moe_inter = _num(cfg, "moe_intermediate_size") or inter
        shared = (_num(cfg, "n_shared_experts") or 0) * mats * h * moe_inter
        shared_inter = _num(cfg, "shared_expert_intermediate_size")
        if shared_inter:
            shared += mats * h * shared_inter
        moe_mlp = experts * mats * h * moe_inter + shared + h * experts
        dense_layers = min(layers, _num(cfg, "first_k_dense_replace") or 0)
        mlp_total = dense_layers * dense_mlp + (layers - dense_layers) * moe_mlp
    else:
        mlp_total = layers * dense_mlp
    norms = layers * 2 * h + h
    tied = bool(cfg.get("tie_word_embeddings", False))
    embed = vocab * h * (1 if tied else 2)
    return layers * attn + mlp_total + norms + embed


def model_dir(model: str, base_dir: Path | None = None) -> Path | None:
    """The local directory holding a model: a local path, or a hub id's cached snapshot."""
    if is_local_model(model):
        p = Path(resolve_model_path(model, base_dir))
        return p if p.is_dir() else None
    return hub_snapshot(model)


def model_info(
    model: str,
    base_dir: Path | None = None,
    *,
    params: float | None = None,
    dtype: str | None = None,
    read_weights: bool = True,
    hub: bool = False,
) -> ModelInfo:
    """Everything knowable about `model`. Never raises on unreadable files.

    Local files first (a directory, or the hub id's snapshot in the Hugging Face cache); with
    `hub`, a hub id without one is looked up in vsup's cache, then on the hub itself (config.json
    and safetensors headers only: vsup.layout.hub). Without `hub` (validation) only vsup's cache
    is read: offline and fast."""
    directory = model_dir(model, base_dir)
    config: dict[str, Any] | None = None
    summary = None
    problems: list[str] = []
    source = ""
    missing = None
    if directory is not None:
        source = f"local files ({directory})"
        config, summary = _read_local(directory, read_weights, problems)
    elif not is_local_model(model) and model.count("/") == 1:
        found = hub_model(model) if hub else read_cached(model)
        if found is not None:
            config, source, missing = found.config, found.source, found.problem
        if found is not None and found.weights is not None:
            w = found.weights
            summary = SafetensorsSummary(w.files, w.bytes, w.params, w.dominant_dtype)
    return ModelInfo(
        model=model,
        local_dir=directory,
        config=config,
        safetensors=summary,
        explicit_params=params,
        explicit_dtype=dtype,
        problems=tuple(problems),
        source=source,
        missing=missing,
    )


def _read_local(
    directory: Path, read_weights: bool, problems: list[str]
) -> tuple[dict[str, Any] | None, SafetensorsSummary | None]:
    """config.json and (with `read_weights`) the safetensors headers of a model directory;
    what could not be read goes to `problems`."""
    config = None
    summary = None
    cfg_path = directory / "config.json"
    if cfg_path.is_file():
        try:
            loaded = json.loads(cfg_path.read_text())
            config = loaded if isinstance(loaded, dict) else None
        except (OSError, ValueError) as exc:
            problems.append(f"{cfg_path}: {exc}")
    if read_weights:
        try:
            summary = summarize_safetensors(directory)
        except (OSError, ValueError, TypeError) as exc:
            problems.append(f"safetensors headers in {directory}: {exc}")
    return config, summary
