"""The stages of `vsup plan` (vsup.layout.plan composes them), each a function with a typed result,
in the order `vsup plan --explain` prints them:

1. the weights (`model_weights` -> `ModelWeights`): the whole model's bytes, 1/TP per GPU;
2. KV bytes per token (`kv_per_token` -> `KVPerToken`), layer kind by layer kind as vLLM's KV
   cache specs count them (vllm/v1/kv_cache_interface.py): `FullAttentionSpec`,
   `SlidingWindowSpec` and `ChunkedLocalAttentionSpec` keep K and V of the KV heads per TP rank,
   `MLAAttentionSpec` one latent the same on every rank, `MambaSpec` a state per sequence
   instead; vsup.layout.kvcache groups the layers into one block pool as vLLM's hybrid KV cache
   manager does;
3. the budget of one GPU of an instance (`budget_per_gpu` -> `GpuBudget`): its share of the GPU,
   minus the weights and the activation/graph reserve, the KV cache the rest, the tokens vLLM
   will report, and why an instance of it would be refused;
4. the placement (`place` -> `Seat`s): names, GPUs and ports of the instances.

Before them: the request's own checks (`check_request`), the model's files (`model_facts`), the
GPU's memory (`gpu_memory`) and the context length (`context_length`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from vsup.layout.budget import overhead_bytes
from vsup.layout.kvcache import (
    DEFAULT_BATCHED_TOKENS_GPU,
    GPU_BLOCK_SIZE,
    MLA,
    KVLayout,
    in_flight_tokens,
)
from vsup.layout.modelinfo import ModelInfo, dtype_bytes, model_info
from vsup.layout.modelpath import is_local_model, resolve_model_path
from vsup.layout.node import GIB, KNOWN_GPUS, NodeFacts, gpu_kind
from vsup.layout.schema import MAX_GPU_UTILIZATION_SUM
from vsup.layout.spec import SLEEP_LEVELS

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
    dp: int = 1  # data-parallel ranks per instance (each of `tp` GPUs)
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
    hub: bool = True  # may ask the hub (or vsup's cache of it) for a hub id's config
    # this node's GPUs (vsup.telemetry.gpu.node_facts): their memory when no flag gives it
    node: NodeFacts = field(default_factory=NodeFacts)
    # the instances of each GPU (or group) time-share it: one swap group, one awake at a time
    time_share: bool = False
    sleep_level: int = 1  # the swap groups' sleep level (1: weights to host RAM)
    host_memory_bytes: int | None = None  # the node's RAM when not this node's (--host-ram-gib)


def check_request(req: PlanRequest) -> None:
    """The request's own figures, before any file is read."""
    _check_shape(req)
    if not 0 < req.utilization <= MAX_GPU_UTILIZATION_SUM:
        raise PlanError(
            f"--utilization {req.utilization}: use a value in (0, {MAX_GPU_UTILIZATION_SUM}]"
        )
    if req.time_share and req.per_gpu < 2:
        raise PlanError(
            "--time-share: give --per-gpu 2 or more (the instances that take turns on each GPU)"
        )
    if req.sleep_level not in SLEEP_LEVELS:
        raise PlanError(f"--sleep-level {req.sleep_level}: use 1 or 2")
    if req.dtype and dtype_bytes(req.dtype) is None:
        raise PlanError(
            f"--dtype {req.dtype!r}: unknown; use bfloat16, float16, float32, fp8, int8, int4, "
            "awq or gptq"
        )


def _check_shape(req: PlanRequest) -> None:
    """Instances per GPU, TP and DP, and GPUs that TP x DP divides."""
    if req.per_gpu < 1 or req.per_gpu > 26:
        raise PlanError(f"--per-gpu {req.per_gpu}: use 1 to 26 instances per GPU")
    if req.tp < 1:
        raise PlanError(f"--tp {req.tp}: use 1 or more")
    if req.dp < 1:
        raise PlanError(f"--dp {req.dp}: use 1 or more")
    if not req.gpus:
        raise PlanError("--gpus: name at least one GPU")
    if any(g < 0 for g in req.gpus):
        raise PlanError("--gpus: GPU indices start at 0")
    group_size = req.tp * req.dp
    if len(req.gpus) % group_size:
        what = f"--tp {req.tp}" + (f" x --dp {req.dp}" if req.dp > 1 else "")
        raise PlanError(
            f"{what} = {group_size} GPUs per instance does not divide the {len(req.gpus)} GPUs "
            f"given: use a multiple of {group_size} GPUs"
        )


def model_facts(req: PlanRequest, base_dir: Path) -> ModelInfo:
    """The model's config and files, or the --params and --dtype that stand in for them."""
    if is_local_model(req.model) and not Path(resolve_model_path(req.model, base_dir)).is_dir():
        raise PlanError(f"--model {req.model}: no such directory")
    info = model_info(req.model, base_dir, params=req.params, dtype=req.dtype, hub=req.hub)
    if info.config is None and info.safetensors is None and not (req.params and req.dtype):
        why = info.missing or f"{req.model} has no local files here (no config.json)"
        raise PlanError(
            f"{why}. Or give --params B (billions) and --dtype D (e.g. --params 8 --dtype "
            "bfloat16), or point --model at a local directory"
        )
    return info


@dataclass(frozen=True)
class GpuMemory:
    """One GPU's memory, where the figure came from and the GPU's kind (its platform profile)."""

    bytes: int
    source: str
    kind: str | None


def gpu_memory(req: PlanRequest) -> GpuMemory:
    """Explicit flags first, then the node's GPUs."""
    if req.gpu_memory_bytes:
        return GpuMemory(
            req.gpu_memory_bytes, "--gpu-mem-gib", gpu_kind(req.gpu) if req.gpu else None
        )
    if req.gpu:
        kind = gpu_kind(req.gpu)
        if kind is None:
            raise PlanError(
                f"--gpu {req.gpu!r}: unknown; use one of {', '.join(KNOWN_GPUS)} or --gpu-mem-gib G"
            )
        return GpuMemory(KNOWN_GPUS[kind][1], f"{kind} (--gpu)", kind)
    memory = req.node.gpu_memory_bytes
    if memory:
        names = req.node.gpu_names
        kind = gpu_kind(names[0]) if names else None
        return GpuMemory(memory, f"{', '.join(sorted(names)) or 'GPU'} (this node)", kind)
    raise PlanError(
        "no GPU found on this node to size the plan: give --gpu "
        + "|".join(KNOWN_GPUS)
        + " or --gpu-mem-gib G"
    )


# -- stage 1: the weights --------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelWeights:
    """The whole model's weights (every GPU of a TP group holds 1/TP of them)."""

    bytes: int
    source: str

    def per_gpu(self, tp: int) -> int:
        return self.bytes // tp


def model_weights(req: PlanRequest, info: ModelInfo) -> ModelWeights:
    weights, source = info.weight_bytes()
    if weights is None:
        raise PlanError(f"cannot size {req.model}'s weights: {source}")
    return ModelWeights(weights, source)


@dataclass(frozen=True)
class ContextLength:
    """The max-model-len every instance must hold one request of."""

    tokens: int
    source: str


def context_length(req: PlanRequest, info: ModelInfo) -> ContextLength:
    if req.max_model_len:
        return ContextLength(req.max_model_len, "--max-model-len")
    if info.max_position_embeddings:
        return ContextLength(info.max_position_embeddings, "the model's max_position_embeddings")
    return ContextLength(FALLBACK_MAX_MODEL_LEN, "default (no config: pass --max-model-len)")


# -- stage 2: KV bytes per token, layer kind by layer kind -----------------------------------------


@dataclass(frozen=True)
class KVPerToken:
    """A token slot of vLLM's KV pool on one GPU of an instance, and how it follows from the
    model's layers (vsup.layout.kvcache groups them as vLLM's KV cache manager does)."""

    layout: KVLayout | None
    bytes: int | None  # None: unknown (no config.json)
    source: str
    notes: tuple[str, ...] = ()


KV_UNKNOWN_NOTE = (
    "KV tokens are unknown: the model's config.json is needed for the KV bytes per token"
)


def kv_per_token(req: PlanRequest, info: ModelInfo) -> KVPerToken:
    layout = info.kv_layout(req.kv_cache_dtype, req.tp)
    per_token = layout.bytes_per_token if layout is not None else None
    if layout is None or not per_token:
        return KVPerToken(
            layout,
            None,
            "unknown without the model's config.json",
            (KV_UNKNOWN_NOTE,),
        )
    return KVPerToken(layout, per_token, _kv_source(info, layout, req.tp))


def _kv_source(info: ModelInfo, kv: KVLayout, tp: int) -> str:
    """How the KV bytes per token follow from the config, in words: the layer kinds, one
    attention layer's bytes per token, how vLLM's groups share the pool, the per-sequence state
    of linear layers, and what the layout could not tell."""
    parts = [kv.describe(), _attention_bytes(info, kv, tp), *_pool_sharing(kv)]
    if kv.state_bytes_per_sequence:
        # vLLM's MambaSpec: a fixed state per sequence (its page), not per token
        parts.append(
            f"linear layers keep {kv.state_bytes_per_sequence / 2**20:.1f} MiB of state per "
            "sequence besides"
        )
    return "; ".join([*parts, *kv.notes])


def _attention_bytes(info: ModelInfo, kv: KVLayout, tp: int) -> str:
    """One attention layer's bytes per token, as vLLM's specs size a page per block token.

    MLAAttentionSpec: one latent of kv_lora_rank + qk_rope_head_dim elements (no separate V),
    the same on every TP rank. FullAttentionSpec, SlidingWindowSpec and ChunkedLocalAttentionSpec:
    K and V of num_kv_heads (split over TP, at least one per rank) x head_size elements."""
    if MLA in kv.kinds:
        rope = info.arch.get("qk_rope_head_dim") or 0
        return (
            f"MLA: (kv_lora_rank {info.kv_lora_rank} + qk_rope_head_dim {rope}) x {kv.width}"
            " bytes per layer, the same on every TP rank"
        )
    kv_per_rank = max(1, (info.num_kv_heads or 1) // tp)
    return f"{kv_per_rank} KV heads x {info.head_dim} head dim x 2 x {kv.width} bytes per layer"


def _pool_sharing(kv: KVLayout) -> list[str]:
    """Several layer kinds: vLLM's hybrid KV cache manager groups them into one block pool."""
    if len(kv.groups) <= 1:
        return []
    size = kv.groups[0].size
    return [
        f"vLLM groups them {len(kv.groups)} ways of {size} layers sharing one block pool, so "
        f"a token slot is {size} layers, not all {sum(kv.kinds.values())}, and a windowed "
        "request holds only its window's blocks"
    ]


# -- stage 3: the budget of one GPU of an instance -------------------------------------------------


def _share(req: PlanRequest) -> float:
    """Each instance's gpu_memory_utilization: time-shared, whichever member is awake has the
    whole share; else the GPU's `utilization` split evenly."""
    share = req.utilization if req.time_share else split_utilization(req.utilization, req.per_gpu)
    if share <= 0:
        raise PlanError(
            f"--per-gpu {req.per_gpu} leaves each instance no memory: use fewer per GPU"
        )
    return share


@dataclass(frozen=True)
class GpuBudget:
    """One GPU of an instance: its share, the budget that is, what of it the weights and the
    activation/graph reserve take, the KV cache the rest, the tokens vLLM will report for it,
    and why an instance of it is refused (None: it is not)."""

    utilization: float
    budget: int
    weights: int
    overhead: int
    kv: int
    tokens: int | None  # per DP rank; None: KV bytes per token unknown
    concurrency: float | None  # full-length requests at once, the whole instance
    problem: str | None = None


def budget_per_gpu(
    req: PlanRequest,
    gpu: GpuMemory,
    weights: ModelWeights,
    kv: KVPerToken,
    context: ContextLength,
) -> GpuBudget:
    share = _share(req)
    budget = int(share * gpu.bytes)
    w = weights.per_gpu(req.tp)
    over = overhead_bytes(req.tp)
    kv_bytes = budget - w - over
    tokens = None
    if kv.layout is not None and kv.bytes:
        in_flight = in_flight_tokens(DEFAULT_BATCHED_TOKENS_GPU, True)
        tokens = kv.layout.tokens(kv_bytes, context.tokens, GPU_BLOCK_SIZE, in_flight)
    conc = tokens * req.dp / context.tokens if tokens is not None else None
    out = GpuBudget(share, budget, w, over, kv_bytes, tokens, conc)
    return replace(out, problem=_budget_problem(req, gpu, out, context))


def _budget_problem(
    req: PlanRequest, gpu: GpuMemory, b: GpuBudget, context: ContextLength
) -> str | None:
    """No room for the KV cache, or too little for one request of max-model-len."""
    max_len = context.tokens
    if b.kv <= 0:
        return (
            f"{b.utilization:g} of {gpu.bytes / GIB:.0f} GiB = {b.budget / GIB:.1f} GiB cannot "
            f"hold {b.weights / GIB:.1f} GiB of weights plus {b.overhead / GIB:.1f} GiB overhead: "
            "use fewer instances per GPU (--per-gpu), a larger --tp, or a quantized "
            "model"
        )
    if b.tokens is not None and b.tokens < max_len:
        return (
            f"its KV cache holds {b.tokens} tokens"
            + (" per data-parallel rank" if req.dp > 1 else "")
            + f", less than one request of max-model-len {max_len}: lower "
            f"--max-model-len (to {b.tokens} or less), use fewer instances per GPU, a "
            "larger --tp, or --kv-cache-dtype fp8"
        )
    return None


# -- stage 4: placement ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Seat:
    """Where one instance goes: its name, its GPUs (a TP x DP group), its port, and the group
    it belongs to (its swap group when time-shared)."""

    name: str
    gpus: tuple[int, ...]
    port: int
    group: str


def place(req: PlanRequest) -> tuple[Seat, ...]:
    """`per_gpu` instances on each group of TP x DP consecutive GPUs, ports counting up."""
    size = req.tp * req.dp
    seats: list[Seat] = []
    for k, i in enumerate(range(0, len(req.gpus), size)):
        gpus = tuple(req.gpus[i : i + size])
        base = _group_name(req, k, gpus[0])
        for j in range(req.per_gpu):
            name = base + _suffix(j, req.per_gpu)
            port = req.port_base + len(seats)
            if not 1 <= port <= 65535:
                raise PlanError(
                    f"--port-base {req.port_base}: instance {name} would get port {port}; lower "
                    "--port-base"
                )
            seats.append(Seat(name, gpus, port, base))
    return tuple(seats)


def _group_name(req: PlanRequest, k: int, first_gpu: int) -> str:
    if req.tp == 1 and req.dp == 1:
        return f"gpu{first_gpu}"
    if req.dp == 1:
        return f"tp{req.tp}-{k}"
    if req.tp == 1:
        return f"dp{req.dp}-{k}"
    return f"tp{req.tp}dp{req.dp}-{k}"


def _suffix(j: int, per: int) -> str:
    return "" if per == 1 else "abcdefghijklmnopqrstuvwxyz"[j] if j < 26 else f"-{j}"
