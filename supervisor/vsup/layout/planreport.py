"""What `vsup plan` made (`Plan`, an `InstanceBudget` per instance) and how it is told: the
budget table (`render_budget`) and `--explain` (`render_explain`: each GPU's memory item by
item, and why each number is what it is)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from vsup.layout.budget import COMM_OVERHEAD_BYTES, OVERHEAD_BYTES
from vsup.layout.kvcache import (
    DEFAULT_BATCHED_TOKENS_GPU,
    GPU_BLOCK_SIZE,
    KVLayout,
    in_flight_tokens,
)
from vsup.layout.model import Layout
from vsup.layout.modelinfo import ModelInfo
from vsup.layout.node import GIB
from vsup.layout.timeshare import (
    SLEEPER_RESERVE_BYTES,
    GpuShare,
    SwapGroup,
    Tenant,
    gpu_shares,
    swap_groups,
)


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
        return tenants_of(self.budgets, self.weight_bytes)

    def gpu_shares(self) -> dict[int, GpuShare]:
        return {s.gpu: s for s in gpu_shares(self.tenants(), self.gpu_memory_bytes)}

    def swap_groups(self) -> list[SwapGroup]:
        return swap_groups(self.tenants())


def tenants_of(budgets: Sequence[InstanceBudget], weights: int | None) -> list[Tenant]:
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


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / GIB:.2f}"


def render_budget(plan: Plan) -> str:
    """The per-GPU memory budget as a text table, with where each figure came from."""
    lines = [*_sources(plan), "", *_budget_table(plan)]
    groups = plan.swap_groups()
    if groups:
        lines.append("")
        lines.append(
            "swap groups (a GPU's total counts each group by its largest member, plus "
            f"{SLEEPER_RESERVE_BYTES / GIB:.0f} GiB per sleeper)"
        )
        lines += [f"  {g.describe(plan.gpu_memory_bytes)}" for g in groups]
    lines += [f"note: {n}" for n in plan.notes]
    return "\n".join(lines) + "\n"


def _sources(plan: Plan) -> list[str]:
    """Each figure the budget starts from, and where it came from."""
    info = plan.info
    params = info.params
    p = f"{params / 1e9:.2f}B params ({info.params_source})" if params else "parameters unknown"
    lines = [f"model      {info.model}: {p}"]
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
    return [
        *lines,
        f"GPU        {plan.gpu_memory_bytes / GIB:.1f} GiB each ({plan.gpu_memory_source})",
        f"max len    {plan.max_model_len} tokens ({plan.max_model_len_source})",
        f"overhead   {OVERHEAD_BYTES / GIB:.1f} GiB per instance per GPU "
        f"(+{COMM_OVERHEAD_BYTES / GIB:.1f} GiB for TP>1): an estimate",
    ]


def _budget_table(plan: Plan) -> list[str]:
    """A row per instance on each GPU, then the GPU's total share."""
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
    by_gpu = _by_gpu(plan)
    shares = plan.gpu_shares()
    for g in sorted(by_gpu):
        rows += [_budget_row(g, b, dp) for b in by_gpu[g]]
        total = shares[g].total
        first = ("", f"(GPU {g} total)", "", "", *([""] if dp else []), f"{total:.2f}")
        rows.append((*first, *[""] * (len(head) - len(first))))
    return _table(head, rows, left={1})


def _budget_row(g: int, b: InstanceBudget, dp: bool) -> tuple[str, ...]:
    return (
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


def _by_gpu(plan: Plan) -> dict[int, list[InstanceBudget]]:
    """The instances on each GPU (an instance of TP x DP GPUs is on each of them)."""
    by_gpu: dict[int, list[InstanceBudget]] = {}
    for b in plan.budgets:
        for g in b.gpus:
            by_gpu.setdefault(g, []).append(b)
    return by_gpu


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
    by_gpu = _by_gpu(plan)
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
        label = "GPU " + gpu_ranges(gpus)
        out.append(
            f"{label}: {mem / GIB:.1f} GiB ({plan.gpu_memory_source}); "
            f"{len(tenants)} instance(s) per GPU" + (f": {names}" if len(tenants) > 1 else "")
        )
        rows: list[tuple[str, str, str]] = []
        for b in tenants:
            prefix = f"{b.name}: " if len(tenants) > 1 else ""
            rows += _explain_rows(plan, b, prefix)
        rows += _shared_rows(shares[gpus[0]], tenants, mem)
        out += _table(("item", "GiB", "why"), rows, left={0, 2})
        out.append("")
    return "\n".join(out)


def _shared_rows(
    share: GpuShare, tenants: Sequence[InstanceBudget], mem: int
) -> list[tuple[str, str, str]]:
    """The GPU's own rows: its swap groups' sleepers, and what no instance was given."""
    rows = [
        (
            f"swap group {group.group}: sleepers",
            _gib(int(group.sleepers * group.reserve * mem)),
            f"one of {len(group.members)} members awake (its budget above counts once, "
            f"not {len(group.members)} times); {group.sleepers} asleep, each keeping "
            f"~{SLEEPER_RESERVE_BYTES / GIB:.0f} GiB (CUDA context, graphs)",
        )
        for group in share.groups
    ]
    rows.append(
        (
            "not given to vLLM",
            _gib(mem - _used_bytes(share, tenants, mem)),
            f"1 - {share.total:.2f} of the GPU: outside every "
            "instance's gpu_memory_utilization (the driver's own use, other processes, "
            "headroom)",
        )
    )
    return rows


def _used_bytes(share: GpuShare, tenants: Sequence[InstanceBudget], mem: int) -> int:
    """What one GPU's instances may hold at once: the solo budgets, and per swap group its
    largest member's budget and its sleepers' remainders."""
    budget = {b.name: b.budget_bytes for b in tenants}
    used = sum(budget[t.name] for t in share.solo)
    for group in share.groups:
        used += max(budget[t.name] for t in group.members)
        used += int(group.sleepers * group.reserve * mem)
    pool = share.pool
    if pool is not None and pool.evicts:  # the largest awake, the others asleep
        used += max(budget[t.name] for t in pool.members)
        used += int((len(pool.members) - 1) * pool.reserve * mem)
    elif pool is not None:
        used += sum(budget[t.name] for t in pool.members)
    return used


def _explain_rows(plan: Plan, b: InstanceBudget, prefix: str) -> list[tuple[str, str, str]]:
    """One instance's items on one GPU: budget, weights, activation/graph reserve, KV cache."""
    mem = plan.gpu_memory_bytes
    tp_note = f" / TP {b.tp}: each GPU of a TP group holds 1/{b.tp}" if b.tp > 1 else ""
    dp_note = "; every DP rank holds its own copy" if b.dp > 1 else ""
    comm = f", +{COMM_OVERHEAD_BYTES / GIB:.1f} GiB of TP communication buffers" if b.tp > 1 else ""
    return [
        (
            f"{prefix}budget",
            _gib(b.budget_bytes),
            f"gpu_memory_utilization {b.utilization:.2f} x {mem / GIB:.1f} GiB: all vLLM may use "
            "on this GPU (weights, activations and graphs, KV cache)",
        ),
        (
            f"{prefix}weights",
            _gib(b.weight_bytes),
            f"{_gib(plan.weight_bytes)} GiB from {plan.weight_source}{tp_note}{dp_note}",
        ),
        (
            f"{prefix}activation/graph reserve",
            _gib(b.overhead_bytes),
            f"an estimate: {OVERHEAD_BYTES / GIB:.1f} GiB for the peak activations of a "
            f"max-num-batched-tokens step, CUDA/HIP graphs and allocator slack{comm}; vLLM "
            "measures the real figure by profiling at start-up and gives the KV cache the rest",
        ),
        (f"{prefix}KV cache", _gib(b.kv_bytes), _kv_why(plan, b)),
    ]


def _kv_why(plan: Plan, b: InstanceBudget) -> str:
    """The KV cache's blocks, what one full-length request takes of them, and the tokens and
    concurrency vLLM will report."""
    if b.kv_tokens is None or not plan.kv_bytes_per_token or plan.kv_layout is None:
        return "what is left: budget - weights - reserve (tokens unknown without a config.json)"
    per_req = plan.kv_layout.blocks_per_request(
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
    return why + f", {b.max_concurrency:.1f} full-length requests at once"


def gpu_ranges(gpus: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5"."""
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
