"""The status keys of an instance's parallel shape: `parallel`, `hbm_per_gpu` and `ranks`.

Joins what the engine saw of a data-parallel server's ranks (engine/ranks.py: their processes
by title) with the GPU telemetry of the last poll (per-process figures and their owners) through
telemetry/dpranks.py. Every instance gets `parallel`; `ranks` is empty unless DP > 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vsup.engine import Instance
from vsup.layout.parallel import find_arg, positive_int
from vsup.snapshot import GpuStatus, Parallel, RankStatus
from vsup.telemetry.dpranks import hbm_per_gpu, rank_statuses

START_RANK_FLAG = "--data-parallel-start-rank"


def parallel_fields(inst: Instance, gpus: Sequence[GpuStatus]) -> dict[str, Any]:
    """`parallel`, `hbm_per_gpu` and `ranks` of one instance (snapshot.InstanceStatus keys)."""
    spec = inst.spec
    shape = spec.parallel
    parallel = Parallel(tp=shape.tp, pp=shape.pp, dp=shape.dp)
    process = inst.process
    ranks: tuple[RankStatus, ...] = ()
    if shape.dp > 1:  # rank_statuses' answer is () otherwise: not worked out each poll
        start = find_arg(spec.args, START_RANK_FLAG)
        start_rank = (positive_int(start[1]) if start else None) or 0
        seen = process.ranks.seen() if process is not None else {}
        ranks = rank_statuses(tuple(spec.gpus), parallel, seen, gpus, start_rank)
    return {
        "parallel": parallel,
        "hbm_per_gpu": hbm_per_gpu(inst.name, spec.gpus, gpus) if process is not None else None,
        "ranks": ranks,
    }
