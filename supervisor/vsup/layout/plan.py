"""`vsup plan`: a layout packing one model onto a node's GPUs, and its memory budget per GPU.

N TP1 replicas per GPU, or groups of TP x DP consecutive GPUs (N instances per group with
`per_gpu`): with `dp` > 1 each instance is one vLLM data-parallel server (one port, DP engine
ranks of TP GPUs each; vsup.layout.parallel). Each GPU's memory share is split evenly:
`utilization` (0.90 by default) divided by the instances on it, rounded down to 0.01, so the
sum stays at or below 0.95.

The budget per instance (one GPU of it):
    budget   = utilization x GPU memory
    weights  = model weights / TP
    overhead = activations, CUDA/HIP graphs and allocator slack (an estimate, OVERHEAD_BYTES,
               plus COMM_OVERHEAD_BYTES for TP > 1)
    KV       = budget - weights - overhead;  KV tokens: as vLLM counts them from its KV groups
               (vsup.layout.kvcache), per DP rank; the instance holds DP times that
    max concurrency at max-model-len = KV tokens / max-model-len
A plan in which an instance cannot hold one request of max-model-len tokens is refused.

With `time_share` (`vsup plan --time-share`) the instances of each GPU (or group) are one swap
group instead: each gets the whole `utilization`, one is awake at a time and the others sleep
(vLLM's sleep mode; docs/layout.md). The GPU then holds the awake member's share plus each
sleeper's remainder (vsup.layout.timeshare), and level-1 sleepers' weights wait in host RAM: a
plan whose level-1 weights exceed HOST_RAM_ERROR_SHARE of the node's RAM is refused.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from vsup.layout.budget import (
    COMM_OVERHEAD_BYTES,
    OVERHEAD_BYTES,
    overhead_bytes,
)
from vsup.layout.kvcache import (
    DEFAULT_BATCHED_TOKENS_GPU,
    GPU_BLOCK_SIZE,
    MLA,
    KVLayout,
    in_flight_tokens,
)
from vsup.layout.model import Layout
from vsup.layout.modelinfo import ModelInfo, dtype_bytes, model_info
from vsup.layout.modelpath import is_local_model, resolve_model_path
from vsup.layout.node import GIB, KNOWN_GPUS, PLATFORM_PROFILES, NodeFacts, gpu_kind
from vsup.layout.schema import MAX_GPU_UTILIZATION_SUM
from vsup.layout.spec import SLEEP_LEVELS
from vsup.layout.timeshare import (
    HOST_RAM_ERROR_SHARE,
    HOST_RAM_WARN_SHARE,
    SLEEPER_RESERVE_BYTES,
    GpuShare,
    SwapGroup,
    Tenant,
    gpu_shares,
    host_ram_need,
    swap_groups,
)

DEFAULT_UTILIZATION = 0.90
# GPUs of one node on every platform KNOWN_GPUS names (HGX H100/H200, MI300X/MI325X/MI355X
# OAM): what `--gpus all` means when planning for another node from a machine without GPUs.
NODE_GPUS = 8
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
    kv_tokens: int | None  # per DP rank: the figure each engine core logs
    max_concurrency: float | None  # at max-model-len, the whole instance
    dp: int = 1
    swap_group: str | None = None  # with --time-share: the group it takes turns in
    sleep_level: int | None = None  # with --time-share: its sleep level

    @property
    def instance_kv_tokens(self) -> int | None:
        return None if self.kv_tokens is None else self.kv_tokens * self.dp


@dataclass(frozen=True)
class Plan:
    layout: Layout
    budgets: tuple[InstanceBudget, ...]
    info: ModelInfo
    weight_bytes: int | None  # the whole model
    weight_source: str
    kv_bytes_per_token: int | None  # per GPU of one instance: a slot of vLLM's KV pool
    kv_source: str
    max_model_len: int
    max_model_len_source: str
    gpu_memory_bytes: int
    gpu_memory_source: str
    notes: tuple[str, ...] = ()
    problems: tuple[str, ...] = field(default=())  # why the plan is refused
    kv_layout: KVLayout | None = None
    tp: int = 1
    dp: int = 1
    block_size: int = GPU_BLOCK_SIZE
    batched_tokens: int = DEFAULT_BATCHED_TOKENS_GPU
    host_memory_bytes: int | None = None  # the node's RAM the level-1 sleepers were sized for
    host_memory_source: str = ""

    @property
    def ok(self) -> bool:
        return not self.problems

    def tenants(self) -> list[Tenant]:
        """The instances as the time-sharing accounting counts them (vsup.layout.timeshare)."""
        return _tenants(self.budgets, self.weight_bytes)

    def gpu_shares(self) -> dict[int, GpuShare]:
        return {s.gpu: s for s in gpu_shares(self.tenants(), self.gpu_memory_bytes)}

    def swap_groups(self) -> list[SwapGroup]:
        return swap_groups(self.tenants())


def parse_gpus(spec: str, node_count: int | None, other_node: str | None = None) -> list[int]:
    """`all` -> every GPU of this node; `0,1,4-7` -> [0, 1, 4, 5, 6, 7].

    `other_node`: the plan is for another node's GPUs (`--gpu H200`, `--gpu-mem-gib G`: what
    the flag said); on a machine without GPUs `all` is then that node's NODE_GPUS."""
    spec = spec.strip()
    if spec == "all":
        if not node_count and other_node:
            return list(range(NODE_GPUS))
        if not node_count:
            raise PlanError(
                "--gpus all: no GPU found on this node; list the GPUs instead, e.g. --gpus "
                "0,1,2,3,4,5,6,7, or name the node's GPU (--gpu H200: all is its 8)"
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


def _grouped(problems: list[tuple[str, tuple[int, ...], str]]) -> tuple[str, ...]:
    """One line per distinct problem, naming the instances (and GPUs) it affects: `--per-gpu 8`
    on 8 GPUs refused would otherwise say the same thing 64 times."""
    by_text: dict[str, list[tuple[str, tuple[int, ...]]]] = {}
    for name, gpus, text in problems:
        by_text.setdefault(text, []).append((name, gpus))
    out = []
    for text, who in by_text.items():
        names = [n for n, _ in who]
        if len(names) <= 3:
            subject = ", ".join(names)
        else:
            on = sorted({g for _, group in who for g in group})
            subject = (
                f"{len(names)} instances ({names[0]} to {names[-1]}) on "
                f"GPU{'s' if len(on) > 1 else ''} {_ranges(on)}"
            )
        out.append(f"{subject}: {text}")
    return tuple(out)


def _suffix(j: int, per: int) -> str:
    return "" if per == 1 else "abcdefghijklmnopqrstuvwxyz"[j] if j < 26 else f"-{j}"


@dataclass(frozen=True)
class GpuMemory:
    """One GPU's memory, where the figure came from and the GPU's kind (its platform profile)."""

    bytes: int
    source: str
    kind: str | None


def _gpu_memory(req: PlanRequest) -> GpuMemory:
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


def make_plan(req: PlanRequest, base_dir: Path | None = None, out_path: Path | None = None) -> Plan:
    """Plan `req`: the layout and its budget (check `plan.ok`; `problems` say what to change).

    The stages are those `--explain` prints: the model's weights, its KV bytes per token (layer
    kind by layer kind), the budget of one GPU of an instance, and the placement of the
    instances on the GPUs; then the layout that says it, and the time-sharing checks.

    `base_dir` resolves a relative local model path (the working directory by default);
    `out_path` is where the layout will be written (its relative model path is rewritten for it).
    """
    base_dir = base_dir or Path.cwd()
    _check_request(req)
    info = _model(req, base_dir)
    gpu = _gpu_memory(req)
    weights = model_weights(req, info)
    context = _context_length(req, info)
    kv = kv_per_token(req, info)
    profiles, profile_notes = _profiles(req, gpu.kind)
    budget = budget_per_gpu(req, gpu, weights, kv, context)
    seats = place(req)
    budgets = tuple(_instance_budget(req, seat, budget) for seat in seats)
    # every instance has the same budget: its problem is theirs, said once (_grouped)
    problems = [(s.name, s.gpus, budget.problem) for s in seats if budget.problem]
    host_memory, host_source = _host_memory(req)
    time_problems, time_notes = _time_share_checks(
        budgets, weights.bytes, gpu.bytes, host_memory, host_source
    )
    layout = _layout(req, info, seats, budget.utilization, context, profiles, base_dir)
    notes = [*kv.notes, *_parallel_notes(req, info), *profile_notes]
    notes += [TIME_SHARE_NOTE] if req.time_share else []
    return Plan(
        layout=layout if out_path is None else layout.relocated(out_path),
        budgets=budgets,
        info=info,
        weight_bytes=weights.bytes,
        weight_source=weights.source,
        kv_bytes_per_token=kv.bytes,
        kv_source=kv.source,
        max_model_len=context.tokens,
        max_model_len_source=context.source,
        gpu_memory_bytes=gpu.bytes,
        gpu_memory_source=gpu.source,
        notes=(*notes, *time_notes),
        problems=_grouped([*problems, *time_problems]),
        kv_layout=kv.layout,
        tp=req.tp,
        dp=req.dp,
        host_memory_bytes=host_memory,
        host_memory_source=host_source,
    )


def _check_request(req: PlanRequest) -> None:
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


def _model(req: PlanRequest, base_dir: Path) -> ModelInfo:
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


# -- stage 1: the weights ------------------------------------------------------------------


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


def _context_length(req: PlanRequest, info: ModelInfo) -> ContextLength:
    if req.max_model_len:
        return ContextLength(req.max_model_len, "--max-model-len")
    if info.max_position_embeddings:
        return ContextLength(info.max_position_embeddings, "the model's max_position_embeddings")
    return ContextLength(FALLBACK_MAX_MODEL_LEN, "default (no config: pass --max-model-len)")


# -- stage 2: KV bytes per token, layer kind by layer kind ---------------------------------


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


# -- stage 3: the budget of one GPU of an instance -----------------------------------------


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


# -- stage 4: placement --------------------------------------------------------------------


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


def _instance_budget(req: PlanRequest, seat: Seat, m: GpuBudget) -> InstanceBudget:
    return InstanceBudget(
        seat.name,
        seat.gpus,
        seat.port,
        req.tp,
        m.utilization,
        m.budget,
        m.weights,
        m.overhead,
        m.kv,
        m.tokens,
        m.concurrency,
        req.dp,
        seat.group if req.time_share else None,
        req.sleep_level if req.time_share else None,
    )


# -- the layout that says it ---------------------------------------------------------------

TIME_SHARE_NOTE = (
    "time-shared: the instances of each GPU are one swap group, one awake at a time "
    "(vsup sleep / wake / swap; docs/sleep.md); they listen on 127.0.0.1 because sleep "
    "mode's endpoints are vLLM's dev-mode ones: put a router in front for clients"
)


def _profiles(req: PlanRequest, kind: str | None) -> tuple[list[str], list[str]]:
    """The profiles the layout lists (the GPU's platform profile unless given), and a note."""
    if req.profiles is not None:
        return list(req.profiles), []
    if kind and kind in PLATFORM_PROFILES:
        profile = PLATFORM_PROFILES[kind]
        return [profile], [f"profile {profile} chosen for {kind}; pass --profile to choose others"]
    return [], []


def _parallel_notes(req: PlanRequest, info: ModelInfo) -> list[str]:
    if req.dp <= 1:
        return []
    notes = []
    if info.is_moe:
        notes.append(
            "a mixture-of-experts model with --dp: the layout sets enable-expert-parallel, so the "
            "experts spread over all TP x DP GPUs; the weights per GPU below count each rank "
            "holding all of them / TP (an upper bound)"
        )
    notes.append(
        f"each instance is one vLLM server with {req.dp} data-parallel ranks behind one port: "
        "vsup supervises it as one process group (a dead rank takes the instance down and "
        "vsup restarts it whole; docs/layout.md)"
    )
    return notes


def _layout(
    req: PlanRequest,
    info: ModelInfo,
    seats: Sequence[Seat],
    share: float,
    context: ContextLength,
    profiles: list[str],
    base_dir: Path,
) -> Layout:
    header = _header(req, len(seats))
    if profiles:
        header["profiles"] = profiles
    defaults: dict[str, Any] = {"model": req.model, "args": _args(req, info, context)}
    if req.time_share:
        # sleep mode's endpoints are vLLM's dev-mode ones: loopback only (docs/layout.md)
        defaults["host"] = "127.0.0.1"
    tables = [_instance_table(req, seat, share) for seat in seats]
    return Layout.from_tables(tables, defaults=defaults, header=header, path=base_dir / "plan.toml")


def _instance_table(req: PlanRequest, seat: Seat, share: float) -> dict[str, Any]:
    table: dict[str, Any] = {
        "name": seat.name,
        "gpus": list(seat.gpus),
        "port": seat.port,
        "gpu_memory_utilization": share,
    }
    if req.time_share:
        table["swap_group"] = seat.group
        table["sleep"] = {"level": req.sleep_level}
    return table


def _args(req: PlanRequest, info: ModelInfo, context: ContextLength) -> dict[str, Any]:
    args: dict[str, Any] = {"max-model-len": context.tokens}
    if req.tp > 1:
        args["tensor-parallel-size"] = req.tp
    if req.dp > 1:
        args["data-parallel-size"] = req.dp
        if info.is_moe:
            args["enable-expert-parallel"] = True
    if req.kv_cache_dtype:
        args["kv-cache-dtype"] = req.kv_cache_dtype
    return args


def _header(req: PlanRequest, instances: int) -> dict[str, Any]:
    shape = f"TP{req.tp}" + (f" x DP{req.dp}" if req.dp > 1 else "")
    dp = f"dp{req.dp}" if req.dp > 1 else ""
    per = "GPU" if req.tp * req.dp == 1 else "group"
    return {
        "name": req.name or f"{_slug(req.model)}-{instances}x-tp{req.tp}{dp}",
        "description": f"vsup plan: {req.model} on GPUs {','.join(map(str, req.gpus))}, "
        f"{req.per_gpu} per {per}, {shape}",
    }


def _tenants(budgets: Sequence[InstanceBudget], weights: int | None) -> list[Tenant]:
    return [
        Tenant(
            b.name,
            b.gpus,
            b.utilization,
            swap_group=b.swap_group,
            sleep_level=b.sleep_level,
            weight_bytes=weights * b.dp if b.sleep_level == 1 and weights is not None else None,
        )
        for b in budgets
    ]


def _host_memory(req: PlanRequest) -> tuple[int | None, str]:
    if req.host_memory_bytes:
        return req.host_memory_bytes, "--host-ram-gib"
    if req.node.host_memory_bytes:
        return req.node.host_memory_bytes, "this node"
    return None, "unknown"


def _time_share_checks(
    budgets: Sequence[InstanceBudget],
    weights: int,
    gpu_mem: int,
    host_memory: int | None,
    host_source: str,
) -> tuple[list[tuple[str, tuple[int, ...], str]], list[str]]:
    """A swap group's GPU (its largest member and the sleepers' remainders) and the level-1
    sleepers' host RAM: what `vsup validate` would refuse, refused here with advice."""
    tenants = _tenants(budgets, weights)
    problems: list[tuple[str, tuple[int, ...], str]] = []
    notes: list[str] = []
    seen: set[str] = set()
    for share in gpu_shares(tenants, gpu_mem):
        if not share.groups or share.total <= MAX_GPU_UTILIZATION_SUM + 1e-9:
            continue
        group = share.groups[0]
        if group.group in seen:
            continue  # a TP group's GPUs: said once
        seen.add(group.group)
        fits = math.floor((MAX_GPU_UTILIZATION_SUM - group.sleepers * group.reserve) * 100) / 100
        problems.append(
            (
                group.group,
                (share.gpu,),
                f"swap group {group.group} claims {share.total:.2f} of GPU {share.gpu} "
                f"({group.largest:g} awake + {group.sleepers} sleepers x "
                f"{SLEEPER_RESERVE_BYTES / GIB:.0f} GiB), above {MAX_GPU_UTILIZATION_SUM}: "
                f"lower --utilization to {fits:g} or use fewer instances per GPU",
            )
        )
    need = host_ram_need(tenants)
    if need.sleepers and host_memory:
        total = need.bytes
        text = (
            f"level-1 sleepers keep their weights in host RAM: {len(need.sleepers)} x "
            f"{total / len(need.sleepers) / GIB:.1f} GiB = {total / GIB:.1f} GiB when all "
            f"sleep, {total / host_memory:.0%} of {host_memory / GIB:.1f} GiB ({host_source})"
        )
        if total > HOST_RAM_ERROR_SHARE * host_memory:
            names = [t.name for t in need.sleepers]
            problems.append(
                (
                    ", ".join(names)
                    if len(names) <= 3
                    else f"{len(names)} instances ({names[0]} to {names[-1]})",
                    (),
                    f"{text}: above {HOST_RAM_ERROR_SHARE:.0%}; use --sleep-level 2 (weights "
                    "dropped, a wake reloads them) or fewer instances per GPU",
                )
            )
        elif total > HOST_RAM_WARN_SHARE * host_memory:
            notes.append(f"{text}: above {HOST_RAM_WARN_SHARE:.0%}, a large part of the node")
    return problems, notes


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / GIB:.2f}"


def render_budget(plan: Plan) -> str:
    """The per-GPU memory budget as a text table, with where each figure came from."""
    info = plan.info
    lines = []
    params = info.params
    p = f"{params / 1e9:.2f}B params ({info.params_source})" if params else "parameters unknown"
    lines.append(f"model      {info.model}: {p}")
    if info.source:
        lines.append(f"files      {info.source}")
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
    dp = plan.dp > 1
    head = (
        "GPU",
        "instance",
        "port",
        "TP",
        *(("DP",) if dp else ()),
        "util",
        "budget GiB",
        "weights GiB",
        "overhead GiB",
        "KV GiB",
        "KV tokens" + (" per rank" if dp else ""),
        f"max conc @{plan.max_model_len}",
    )
    rows = []
    by_gpu: dict[int, list[InstanceBudget]] = {}
    for b in plan.budgets:
        for g in b.gpus:
            by_gpu.setdefault(g, []).append(b)
    shares = plan.gpu_shares()
    for g in sorted(by_gpu):
        for b in by_gpu[g]:
            rows.append(
                (
                    str(g),
                    b.name,
                    str(b.port),
                    str(b.tp),
                    *((str(b.dp),) if dp else ()),
                    f"{b.utilization:.2f}",
                    _gib(b.budget_bytes),
                    _gib(b.weight_bytes),
                    _gib(b.overhead_bytes),
                    _gib(b.kv_bytes),
                    "?" if b.kv_tokens is None else f"{b.kv_tokens:,}",
                    "?" if b.max_concurrency is None else f"{b.max_concurrency:.1f}x",
                )
            )
        total = shares[g].total
        first = ("", f"(GPU {g} total)", "", "", *([""] if dp else []), f"{total:.2f}")
        rows.append((*first, *[""] * (len(head) - len(first))))
    lines += _table(head, rows, left={1})
    groups = plan.swap_groups()
    if groups:
        lines.append("")
        lines.append(
            "swap groups (a GPU's total counts each group by its largest member, plus "
            f"{SLEEPER_RESERVE_BYTES / GIB:.0f} GiB per sleeper)"
        )
        lines += [f"  {g.describe(plan.gpu_memory_bytes)}" for g in groups]
    for n in plan.notes:
        lines.append(f"note: {n}")
    return "\n".join(lines) + "\n"


def _table(head: tuple[str, ...], rows: Sequence[tuple[str, ...]], left: set[int]) -> list[str]:
    widths = [max(len(r[i]) for r in (head, *rows)) for i in range(len(head))]
    return [
        "  ".join(
            c.ljust(widths[i]) if i in left else c.rjust(widths[i]) for i, c in enumerate(r)
        ).rstrip()
        for r in (head, *rows)
    ]


def render_explain(plan: Plan) -> str:
    """`vsup plan --explain`: each GPU's memory, item by item, and why each number is what it is.
    GPUs whose instances have the same figures are shown once."""
    out: list[str] = []
    by_gpu: dict[int, list[InstanceBudget]] = {}
    for b in plan.budgets:
        for g in b.gpus:
            by_gpu.setdefault(g, []).append(b)
    shares = plan.gpu_shares()
    seen: dict[tuple, list[int]] = {}
    for g in sorted(by_gpu):
        key = tuple(
            (b.utilization, b.weight_bytes, b.overhead_bytes, b.kv_bytes) for b in by_gpu[g]
        )
        seen.setdefault(key, []).append(g)
    mem = plan.gpu_memory_bytes
    for gpus in seen.values():
        tenants = by_gpu[gpus[0]]
        names = ", ".join(b.name for b in tenants)
        label = "GPU " + _ranges(gpus)
        out.append(
            f"{label}: {mem / GIB:.1f} GiB ({plan.gpu_memory_source}); "
            f"{len(tenants)} instance(s) per GPU" + (f": {names}" if len(tenants) > 1 else "")
        )
        rows: list[tuple[str, str, str]] = []
        for b in tenants:
            prefix = f"{b.name}: " if len(tenants) > 1 else ""
            rows += _explain_rows(plan, b, prefix)
        share = shares[gpus[0]]
        for group in share.groups:
            rows.append(
                (
                    f"swap group {group.group}: sleepers",
                    _gib(int(group.sleepers * group.reserve * mem)),
                    f"one of {len(group.members)} members awake (its budget above counts once, "
                    f"not {len(group.members)} times); {group.sleepers} asleep, each keeping "
                    f"~{SLEEPER_RESERVE_BYTES / GIB:.0f} GiB (CUDA context, graphs)",
                )
            )
        rows.append(
            (
                "not given to vLLM",
                _gib(mem - _used_bytes(share, tenants, mem)),
                f"1 - {share.total:.2f} of the GPU: outside every "
                "instance's gpu_memory_utilization (the driver's own use, other processes, "
                "headroom)",
            )
        )
        out += _table(("item", "GiB", "why"), rows, left={0, 2})
        out.append("")
    return "\n".join(out)


def _used_bytes(share: GpuShare, tenants: Sequence[InstanceBudget], mem: int) -> int:
    """What one GPU's instances may hold at once: the solo budgets, and per swap group its
    largest member's budget and its sleepers' remainders."""
    budget = {b.name: b.budget_bytes for b in tenants}
    used = sum(budget[t.name] for t in share.solo)
    for group in share.groups:
        used += max(budget[t.name] for t in group.members)
        used += int(group.sleepers * group.reserve * mem)
    return used


def _explain_rows(plan: Plan, b: InstanceBudget, prefix: str) -> list[tuple[str, str, str]]:
    mem = plan.gpu_memory_bytes
    rows = [
        (
            f"{prefix}budget",
            _gib(b.budget_bytes),
            f"gpu_memory_utilization {b.utilization:.2f} x {mem / GIB:.1f} GiB: all vLLM may use "
            "on this GPU (weights, activations and graphs, KV cache)",
        )
    ]
    tp_note = f" / TP {b.tp}: each GPU of a TP group holds 1/{b.tp}" if b.tp > 1 else ""
    dp_note = "; every DP rank holds its own copy" if b.dp > 1 else ""
    rows.append(
        (
            f"{prefix}weights",
            _gib(b.weight_bytes),
            f"{_gib(plan.weight_bytes)} GiB from {plan.weight_source}{tp_note}{dp_note}",
        )
    )
    rows.append(
        (
            f"{prefix}activation/graph reserve",
            _gib(b.overhead_bytes),
            f"an estimate: {OVERHEAD_BYTES / GIB:.1f} GiB for the peak activations of a "
            "max-num-batched-tokens step, CUDA/HIP graphs and allocator slack"
            + (
                f", +{COMM_OVERHEAD_BYTES / GIB:.1f} GiB of TP communication buffers"
                if b.tp > 1
                else ""
            )
            + "; vLLM measures the real figure by profiling at start-up and gives the KV cache the "
            "rest",
        )
    )
    if b.kv_tokens is not None and plan.kv_bytes_per_token and plan.kv_layout is not None:
        kv = plan.kv_layout
        per_req = kv.blocks_per_request(
            plan.max_model_len, plan.block_size, in_flight_tokens(plan.batched_tokens, True)
        )
        blocks = max(0, int((b.kv_bytes or 0) // (plan.kv_bytes_per_token * plan.block_size)))
        why = (
            f"what is left: budget - weights - reserve = {blocks:,} blocks of {plan.block_size} "
            f"tokens x {plan.kv_bytes_per_token / 1024:.1f} KiB per token; a "
            f"{plan.max_model_len:,}-token request takes {per_req:,} blocks, so vLLM reports "
            f"{b.kv_tokens:,} tokens"
        )
        if b.dp > 1:
            why += f" per rank ({b.instance_kv_tokens:,} for the instance's {b.dp} ranks)"
        why += f", {b.max_concurrency:.1f} full-length requests at once"
    else:
        why = "what is left: budget - weights - reserve (tokens unknown without a config.json)"
    rows.append((f"{prefix}KV cache", _gib(b.kv_bytes), why))
    return rows


def _ranges(gpus: list[int]) -> str:
    out = []
    start = prev = gpus[0]
    for g in [*gpus[1:], None]:
        if g is not None and g == prev + 1:
            prev = g
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if g is not None:
            start = prev = g
    return ",".join(out)
