"""`vsup plan`: a layout packing one model onto a node's GPUs, and its memory budget per GPU.

N TP1 replicas per GPU, or TP-N groups of consecutive GPUs (N instances per group with
`per_gpu`). Each GPU's memory share is split evenly: `utilization` (0.90 by default) divided by
the instances on it, rounded down to 0.01, so the sum stays at or below 0.95.

The budget per instance (one GPU of it):
    budget   = utilization x GPU memory
    weights  = model weights / TP
    overhead = activations, CUDA/HIP graphs and allocator slack (an estimate, OVERHEAD_BYTES,
               plus COMM_OVERHEAD_BYTES for TP > 1)
    KV       = budget - weights - overhead;  KV tokens = KV / KV bytes per token (per GPU)
    max concurrency at max-model-len = KV tokens / max-model-len
A plan in which an instance cannot hold one request of max-model-len tokens is refused.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vsup.layout.budget import (
    COMM_OVERHEAD_BYTES,
    OVERHEAD_BYTES,
    overhead_bytes,
)
from vsup.layout.model import Layout
from vsup.layout.modelinfo import ModelInfo, dtype_bytes, model_info
from vsup.layout.modelpath import is_local_model, resolve_model_path
from vsup.layout.node import GIB, KNOWN_GPUS, PLATFORM_PROFILES, gpu_kind, node_gpus
from vsup.layout.schema import MAX_GPU_UTILIZATION_SUM

DEFAULT_UTILIZATION = 0.90
DEFAULT_PORT_BASE = 8000
FALLBACK_MAX_MODEL_LEN = 8192


def split_utilization(total: float, tenants: int) -> float:
    """Each tenant's share of one GPU, rounded down to 0.01: 0.90/2 -> 0.45, 0.90/4 -> 0.22."""
    return math.floor(total * 100 / tenants + 1e-9) / 100


class PlanError(ValueError):
    """The plan cannot be made; the message says what to change."""


@dataclass(frozen=True)
class PlanRequest:
    model: str
    gpus: Sequence[int]
    per_gpu: int = 1
    tp: int = 1
    port_base: int = DEFAULT_PORT_BASE
    profiles: Sequence[str] | None = None  # None: the platform profile of the GPU, if known
    gpu: str | None = None  # MI300X | MI325X | MI355X | H200 | H100
    gpu_memory_bytes: int | None = None
    params: float | None = None  # parameters (not billions)
    dtype: str | None = None  # the checkpoint's dtype or quantization, for the weight size
    max_model_len: int | None = None
    utilization: float = DEFAULT_UTILIZATION  # per GPU, all its instances together
    kv_cache_dtype: str | None = None
    name: str | None = None


@dataclass(frozen=True)
class InstanceBudget:
    name: str
    gpus: tuple[int, ...]
    port: int
    tp: int
    utilization: float
    budget_bytes: int
    weight_bytes: int | None  # per GPU
    overhead_bytes: int
    kv_bytes: int | None  # per GPU
    kv_tokens: int | None
    max_concurrency: float | None  # at max-model-len


@dataclass(frozen=True)
class Plan:
    layout: Layout
    budgets: tuple[InstanceBudget, ...]
    info: ModelInfo
    weight_bytes: int | None  # the whole model
    weight_source: str
    kv_bytes_per_token: int | None  # per GPU of one instance
    kv_source: str
    max_model_len: int
    max_model_len_source: str
    gpu_memory_bytes: int
    gpu_memory_source: str
    notes: tuple[str, ...] = ()
    problems: tuple[str, ...] = field(default=())  # why the plan is refused

    @property
    def ok(self) -> bool:
        return not self.problems


def parse_gpus(spec: str, node_count: int | None) -> list[int]:
    """`all` -> every GPU of this node; `0,1,4-7` -> [0, 1, 4, 5, 6, 7]."""
    spec = spec.strip()
    if spec == "all":
        if not node_count:
            raise PlanError(
                "--gpus all: no GPU found on this node; list the GPUs instead, e.g. --gpus "
                "0,1,2,3,4,5,6,7"
            )
        return list(range(node_count))
    out: list[int] = []
    for part in spec.split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            raise PlanError(f"--gpus {spec!r}: write 'all' or indices like 0,1,2 or 0-7")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) else lo
        if hi < lo:
            raise PlanError(f"--gpus: range {part} runs backwards; write {hi}-{lo}")
        out += range(lo, hi + 1)
    if len(set(out)) != len(out):
        raise PlanError(f"--gpus {spec!r} lists a GPU twice")
    return out


def _slug(model: str) -> str:
    base = model.rstrip("/").split("/")[-1] or "model"
    return re.sub(r"[^a-z0-9.]+", "-", base.lower()).strip("-.") or "model"


def _suffix(j: int, per: int) -> str:
    return "" if per == 1 else "abcdefghijklmnopqrstuvwxyz"[j] if j < 26 else f"-{j}"


def _gpu_memory(req: PlanRequest) -> tuple[int, str, str | None]:
    """(bytes, where that came from, GPU kind) - explicit flags first, then the node's probe."""
    if req.gpu_memory_bytes:
        return req.gpu_memory_bytes, "--gpu-mem-gib", gpu_kind(req.gpu) if req.gpu else None
    if req.gpu:
        kind = gpu_kind(req.gpu)
        if kind is None:
            raise PlanError(
                f"--gpu {req.gpu!r}: unknown; use one of {', '.join(KNOWN_GPUS)} or --gpu-mem-gib G"
            )
        return KNOWN_GPUS[kind][1], f"{kind} (--gpu)", kind
    found = node_gpus()
    sizes = [g.memory_bytes for g in found if g.memory_bytes]
    if sizes:
        names = {g.name for g in found if g.name}
        kind = gpu_kind(next(iter(names))) if names else None
        return min(sizes), f"{', '.join(sorted(names)) or 'GPU'} (this node)", kind
    raise PlanError(
        "no GPU found on this node to size the plan: give --gpu "
        + "|".join(KNOWN_GPUS)
        + " or --gpu-mem-gib G"
    )


def make_plan(req: PlanRequest, base_dir: Path | None = None, out_path: Path | None = None) -> Plan:
    """Plan `req`: the layout and its budget (check `plan.ok`; `problems` say what to change).

    `base_dir` resolves a relative local model path (the working directory by default);
    `out_path` is where the layout will be written (its relative model path is rewritten for it).
    """
    base_dir = base_dir or Path.cwd()
    if req.per_gpu < 1 or req.per_gpu > 26:
        raise PlanError(f"--per-gpu {req.per_gpu}: use 1 to 26 instances per GPU")
    if req.tp < 1:
        raise PlanError(f"--tp {req.tp}: use 1 or more")
    if not req.gpus:
        raise PlanError("--gpus: name at least one GPU")
    if any(g < 0 for g in req.gpus):
        raise PlanError("--gpus: GPU indices start at 0")
    if len(req.gpus) % req.tp:
        raise PlanError(
            f"--tp {req.tp} does not divide the {len(req.gpus)} GPUs given: use a multiple of "
            f"{req.tp} GPUs"
        )
    if not 0 < req.utilization <= MAX_GPU_UTILIZATION_SUM:
        raise PlanError(
            f"--utilization {req.utilization}: use a value in (0, {MAX_GPU_UTILIZATION_SUM}]"
        )
    if req.dtype and dtype_bytes(req.dtype) is None:
        raise PlanError(
            f"--dtype {req.dtype!r}: unknown; use bfloat16, float16, float32, fp8, int8, int4, "
            "awq or gptq"
        )
    if is_local_model(req.model) and not Path(resolve_model_path(req.model, base_dir)).is_dir():
        raise PlanError(f"--model {req.model}: no such directory")
    info = model_info(req.model, base_dir, params=req.params, dtype=req.dtype)
    if info.config is None and info.safetensors is None and not (req.params and req.dtype):
        raise PlanError(
            f"{req.model} has no local files here (no config.json): give --params B (billions) and "
            "--dtype D (e.g. --params 8 --dtype bfloat16), or point --model at a local directory"
        )
    gpu_mem, gpu_source, kind = _gpu_memory(req)
    weights, weight_source = info.weight_bytes()
    notes: list[str] = []
    if weights is None:
        raise PlanError(f"cannot size {req.model}'s weights: {weight_source}")
    if req.max_model_len:
        max_len, max_len_source = req.max_model_len, "--max-model-len"
    elif info.max_position_embeddings:
        max_len, max_len_source = (
            info.max_position_embeddings,
            "the model's max_position_embeddings",
        )
    else:
        max_len, max_len_source = (
            FALLBACK_MAX_MODEL_LEN,
            "default (no config: pass --max-model-len)",
        )
    per_token = info.kv_bytes_per_token(req.kv_cache_dtype, req.tp)
    if per_token is None:
        kv_source = "unknown without the model's config.json"
        notes.append(
            "KV tokens are unknown: the model's config.json is needed for the KV bytes per token"
        )
    elif info.is_mla:
        rope = info.arch.get("qk_rope_head_dim") or 0
        kv_source = (
            f"MLA: (kv_lora_rank {info.kv_lora_rank} + qk_rope_head_dim {rope}) x "
            f"{info.num_layers} layers x {_kv_width(info, req)} bytes, the same on every TP rank"
        )
    else:
        kv_per_rank = max(1, (info.num_kv_heads or 1) // req.tp)
        kv_source = (
            f"{info.num_layers} layers x {kv_per_rank} KV heads x {info.head_dim} head dim x 2 x "
            f"{_kv_width(info, req)} bytes"
        )
    profiles = list(req.profiles) if req.profiles is not None else []
    if req.profiles is None and kind and kind in PLATFORM_PROFILES:
        profiles = [PLATFORM_PROFILES[kind]]
        notes.append(f"profile {profiles[0]} chosen for {kind}; pass --profile to choose others")

    groups = [list(req.gpus[i : i + req.tp]) for i in range(0, len(req.gpus), req.tp)]
    share = split_utilization(req.utilization, req.per_gpu)
    if share <= 0:
        raise PlanError(
            f"--per-gpu {req.per_gpu} leaves each instance no memory: use fewer per GPU"
        )
    tables: list[dict[str, Any]] = []
    budgets: list[InstanceBudget] = []
    problems: list[str] = []
    port = req.port_base
    for k, group in enumerate(groups):
        base = f"gpu{group[0]}" if req.tp == 1 else f"tp{req.tp}-{k}"
        for j in range(req.per_gpu):
            name = base + _suffix(j, req.per_gpu)
            if not 1 <= port <= 65535:
                raise PlanError(
                    f"--port-base {req.port_base}: instance {name} would get port {port}; lower "
                    "--port-base"
                )
            tables.append(
                {"name": name, "gpus": list(group), "port": port, "gpu_memory_utilization": share}
            )
            budget = int(share * gpu_mem)
            w = weights // req.tp
            over = overhead_bytes(req.tp)
            kv = budget - w - over
            tokens = max(0, int(kv // per_token)) if per_token else None
            conc = tokens / max_len if tokens is not None else None
            budgets.append(
                InstanceBudget(
                    name, tuple(group), port, req.tp, share, budget, w, over, kv, tokens, conc
                )
            )
            if kv <= 0:
                problems.append(
                    f"{name}: {share:g} of {gpu_mem / GIB:.0f} GiB = {budget / GIB:.1f} GiB "
                    "cannot hold "
                    f"{w / GIB:.1f} GiB of weights plus {over / GIB:.1f} GiB overhead: use fewer "
                    "instances per "
                    "GPU (--per-gpu), a larger --tp, or a quantized model"
                )
            elif tokens is not None and tokens < max_len:
                problems.append(
                    f"{name}: its KV cache holds {tokens} tokens, less than one request of "
                    "max-model-len "
                    f"{max_len}: lower --max-model-len (to {tokens} or less), use fewer instances "
                    "per GPU, "
                    "a larger --tp, or --kv-cache-dtype fp8"
                )
            port += 1
    args: dict[str, Any] = {"max-model-len": max_len}
    if req.tp > 1:
        args["tensor-parallel-size"] = req.tp
    if req.kv_cache_dtype:
        args["kv-cache-dtype"] = req.kv_cache_dtype
    header: dict[str, Any] = {
        "name": req.name or f"{_slug(req.model)}-{len(tables)}x-tp{req.tp}",
        "description": f"vsup plan: {req.model} on GPUs {','.join(map(str, req.gpus))}, "
        f"{req.per_gpu} per {'GPU' if req.tp == 1 else 'group'}, TP{req.tp}",
    }
    if profiles:
        header["profiles"] = profiles
    defaults = {"model": req.model, "args": args}
    layout = Layout.from_tables(
        tables, defaults=defaults, header=header, path=base_dir / "plan.toml"
    )
    if out_path is not None:
        layout = layout.relocated(out_path)
    return Plan(
        layout=layout,
        budgets=tuple(budgets),
        info=info,
        weight_bytes=weights,
        weight_source=weight_source,
        kv_bytes_per_token=per_token,
        kv_source=kv_source,
        max_model_len=max_len,
        max_model_len_source=max_len_source,
        gpu_memory_bytes=gpu_mem,
        gpu_memory_source=gpu_source,
        notes=tuple(notes),
        problems=tuple(problems),
    )


def _kv_width(info: ModelInfo, req: PlanRequest) -> int:
    kv = (req.kv_cache_dtype or "auto").lower()
    if kv.startswith(("fp8", "int8")):
        return 1
    width = dtype_bytes(info.torch_dtype) or 2
    return int(width) if width >= 2 else 2


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / GIB:.2f}"


def render_budget(plan: Plan) -> str:
    """The per-GPU memory budget as a text table, with where each figure came from."""
    info = plan.info
    lines = []
    params = info.params
    p = f"{params / 1e9:.2f}B params ({info.params_source})" if params else "parameters unknown"
    lines.append(f"model      {info.model}: {p}")
    lines.append(f"weights    {_gib(plan.weight_bytes)} GiB ({plan.weight_source})")
    if plan.kv_bytes_per_token:
        lines.append(
            f"KV cache   {plan.kv_bytes_per_token / 1024:.1f} KiB per token per GPU "
            f"({plan.kv_source})"
        )
    else:
        lines.append(f"KV cache   bytes per token {plan.kv_source}")
    lines.append(
        f"GPU        {plan.gpu_memory_bytes / GIB:.1f} GiB each ({plan.gpu_memory_source})"
    )
    lines.append(f"max len    {plan.max_model_len} tokens ({plan.max_model_len_source})")
    lines.append(
        f"overhead   {OVERHEAD_BYTES / GIB:.1f} GiB per instance per GPU "
        f"(+{COMM_OVERHEAD_BYTES / GIB:.1f} GiB for TP>1): an estimate"
    )
    lines.append("")
    head = (
        "GPU",
        "instance",
        "port",
        "TP",
        "util",
        "budget GiB",
        "weights GiB",
        "overhead GiB",
        "KV GiB",
        "KV tokens",
        f"max conc @{plan.max_model_len}",
    )
    rows = []
    by_gpu: dict[int, list[InstanceBudget]] = {}
    for b in plan.budgets:
        for g in b.gpus:
            by_gpu.setdefault(g, []).append(b)
    for g in sorted(by_gpu):
        for b in by_gpu[g]:
            rows.append(
                (
                    str(g),
                    b.name,
                    str(b.port),
                    str(b.tp),
                    f"{b.utilization:.2f}",
                    _gib(b.budget_bytes),
                    _gib(b.weight_bytes),
                    _gib(b.overhead_bytes),
                    _gib(b.kv_bytes),
                    "?" if b.kv_tokens is None else f"{b.kv_tokens:,}",
                    "?" if b.max_concurrency is None else f"{b.max_concurrency:.1f}x",
                )
            )
        total = sum(b.utilization for b in by_gpu[g])
        rows.append(("", f"(GPU {g} total)", "", "", f"{total:.2f}", "", "", "", "", "", ""))
    widths = [max(len(r[i]) for r in (head, *rows)) for i in range(len(head))]
    left = {1}
    for r in (head, *rows):
        lines.append(
            "  ".join(
                c.ljust(widths[i]) if i in left else c.rjust(widths[i]) for i, c in enumerate(r)
            ).rstrip()
        )
    for n in plan.notes:
        lines.append(f"note: {n}")
    return "\n".join(lines) + "\n"
