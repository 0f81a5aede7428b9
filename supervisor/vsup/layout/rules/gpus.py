"""Rules about GPU indices and each GPU's memory shares."""

from __future__ import annotations

import math

from vsup.layout.diagnostics import ERROR, WARNING, Diagnostic
from vsup.layout.merge import MergedInstance
from vsup.layout.rules.context import Context, origin_diag
from vsup.layout.schema import MAX_GPU_UTILIZATION_SUM, VLLM_DEFAULT_GPU_MEMORY_UTILIZATION


def gpu_index_negative(ctx: Context, m: MergedInstance) -> list[Diagnostic]:
    return [
        origin_diag(ERROR, f"GPU index {g} is negative: GPUs are numbered from 0", m, "gpus")
        for g in m.gpus or ()
        if g < 0
    ]


def gpu_beyond_node(ctx: Context, m: MergedInstance) -> list[Diagnostic]:
    n = ctx.node_gpus
    if n is None:
        return []
    source = "this node has" if ctx.probed else "--node-gpus says the node has"
    return [
        origin_diag(
            ERROR,
            f"GPU {g} does not exist: {source} {n} GPU{'s' if n != 1 else ''} (0-{n - 1}); use "
            "an index in that range",
            m,
            "gpus",
        )
        for g in m.gpus or ()
        if g >= n
    ]


def gpu_listed_twice(ctx: Context, m: MergedInstance) -> list[Diagnostic]:
    gpus = m.gpus or []
    dupes = sorted({g for g in gpus if gpus.count(g) > 1})
    if not dupes:
        return []
    return [origin_diag(ERROR, f"GPU {dupes[0]} is listed twice: list each GPU once", m, "gpus")]


def utilization_on_cpu(ctx: Context, m: MergedInstance) -> list[Diagnostic]:
    if m.gpus != [] or m.values.get("gpu_memory_utilization") is None:
        return []
    return [
        origin_diag(
            WARNING,
            "a CPU instance (gpus = []) ignores gpu_memory_utilization; size its KV cache with "
            "env VLLM_CPU_KVCACHE_SPACE (GiB)",
            m,
            "gpu_memory_utilization",
        )
    ]


def no_gpu_on_node(ctx: Context) -> list[Diagnostic]:
    """Said once: without a GPU count, indices were only checked to be >= 0."""
    if ctx.node_gpus is not None or not any(m.gpus for m in ctx.merged):
        return []
    return [
        Diagnostic(
            WARNING,
            "no GPU found on this node: GPU indices were only checked to be >= 0; pass "
            "--node-gpus N to check them against a node with N GPUs",
            file=ctx.layout.file,
        )
    ]


def gpu_overcommitted(ctx: Context) -> list[Diagnostic]:
    """The instances of one GPU may claim at most MAX_GPU_UTILIZATION_SUM of it together; one
    that does not set gpu_memory_utilization counts vLLM's default."""
    shares: dict[int, list[tuple[MergedInstance, float, bool]]] = {}
    for m in ctx.merged:
        if not m.gpus:
            continue
        util = m.values.get("gpu_memory_utilization")
        explicit = util is not None
        share = float(util) if explicit else VLLM_DEFAULT_GPU_MEMORY_UTILIZATION
        if 0 < share <= 1:  # an out-of-range value is reported on its own
            for g in set(m.gpus):
                shares.setdefault(g, []).append((m, share, explicit))
    out: list[Diagnostic] = []
    for g in sorted(shares):
        tenants = shares[g]
        total = sum(s for _, s, _ in tenants)
        if total <= MAX_GPU_UTILIZATION_SUM + 1e-9:
            continue
        parts = ", ".join(
            f"'{m.label}' {s:g}" + ("" if explicit else " (vLLM's default)")
            for m, s, explicit in tenants
        )
        each = math.floor(MAX_GPU_UTILIZATION_SUM * 100 / len(tenants)) / 100
        for m, _, explicit in tenants:
            out.append(
                origin_diag(
                    ERROR,
                    f"GPU {g} is over-committed: gpu_memory_utilization adds up to {total:.2f} "
                    f"({parts}); keep the sum at or below {MAX_GPU_UTILIZATION_SUM} "
                    f"(e.g. {each:g} each) or move an instance",
                    m,
                    "gpu_memory_utilization" if explicit else "gpus",
                )
            )
    return out
