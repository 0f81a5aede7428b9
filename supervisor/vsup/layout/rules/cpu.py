"""Rules about CPU instances (`gpus = []`) and the node's cores."""

from __future__ import annotations

from vsup.layout.cpubind import BIND_ENV, allowed_cpus, core_order
from vsup.layout.diagnostics import WARNING, Diagnostic
from vsup.layout.parallel import parallel_shape
from vsup.layout.rules.context import Context, origin_diag


def cpu_instances_outnumber_cores(ctx: Context) -> list[Diagnostic]:
    """More CPU ranks than this node's cores: vsup's core split (layout/cpubind.py) has to
    put two on one core, where each one's spinning OpenMP threads slow the other (a start
    beside a busy instance took minutes)."""
    cpu = [m for m in ctx.merged if m.gpus == []]
    unbound = [m for m in cpu if BIND_ENV not in m.env]
    if len(cpu) < 2 or not unbound:
        return []
    need = 0
    for m in unbound:
        shape = parallel_shape(m.args, 0)
        need += max(1, shape.tp) * max(1, shape.pp) * max(1, shape.dp_local)
    cores = len(core_order(allowed_cpus()))
    if need <= cores:
        return []
    names = ", ".join(m.label for m in unbound)
    return [
        origin_diag(
            WARNING,
            f"{len(unbound)} CPU instances ({names}) need {need} core sets and this node gives "
            f"vsup {cores} core(s): some share a core, and each one's OpenMP threads slow the "
            "other (starts can take minutes). Run fewer CPU instances here, or bind them "
            f'yourself with env {BIND_ENV} = "0-3" (docs/layout.md, "CPU instances")',
            unbound[-1],
            "gpus",
        )
    ]
