"""Rules about GPU indices and each GPU's memory shares."""

from __future__ import annotations

import math

from vsup.layout.diagnostics import ERROR, WARNING, Diagnostic
from vsup.layout.merge import MergedInstance
from vsup.layout.rules.context import Context, origin_diag
from vsup.layout.schema import MAX_GPU_UTILIZATION_SUM
from vsup.layout.timeshare import gpu_shares


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
    that does not set gpu_memory_utilization counts vLLM's default. A swap group counts by its
    largest member plus each sleeper's remainder (vsup.layout.timeshare)."""
    by_label = {m.label: m for m in ctx.merged}
    out: list[Diagnostic] = []
    for share in gpu_shares(ctx.tenants(), ctx.gpu_memory_bytes):
        total = share.total
        if total <= MAX_GPU_UTILIZATION_SUM + 1e-9:
            continue
        pool = share.pool.members if share.pool is not None else ()
        count = len(share.solo) + len(share.groups) + len(pool)
        each = math.floor(MAX_GPU_UTILIZATION_SUM * 100 / count) / 100
        fix = f"(e.g. {each:g} each) or move an instance"
        if share.groups:
            fix = (
                "by lowering gpu_memory_utilization (a swap group counts as its largest member "
                "plus each sleeper's remainder) or moving an instance"
            )
            if share.solo:
                fix += ", or put the others into the swap group"
        tenants = [*share.solo, *(t for g in share.groups for t in g.members), *pool]
        for t in tenants:
            out.append(
                origin_diag(
                    ERROR,
                    f"GPU {share.gpu} is over-committed: gpu_memory_utilization adds up to "
                    f"{total:.2f} ({share.describe()}); keep the sum at or below "
                    f"{MAX_GPU_UTILIZATION_SUM} {fix}",
                    by_label[t.name],
                    "gpu_memory_utilization" if t.explicit else "gpus",
                )
            )
    return out
