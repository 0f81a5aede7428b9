"""Whose HBM is it: per-instance memory from per-process figures, and processes no instance owns.

An instance's HBM is the sum, over its GPUs, of the driver's per-process figures for every
process of the instance: the API server's tree (EngineCore, workers) and, when the process
group is given, every member of it - so an EngineCore orphaned by a SIGKILLed API server is
still the instance's (VLLM-FACTS: it keeps its HBM). `hbm_source` says where a figure came from:

- "process": every one of the instance's GPUs listed the instance's processes with a figure.
- "device": the driver gave no usable per-process figure (NVML inside a container without the
  host pid namespace lists host pids, none of which is ours; or the list is empty or lacks
  figures), and the instance is alone on each of its GPUs - no other instance there, no other
  process of this node listed there - so the GPU's used memory is the instance's (plus the
  driver's own few hundred MiB: a device figure, labelled as such).
- "unavailable" (bytes None): anything else. A co-tenant's share is never guessed.

Foreign processes are pids on a GPU that belong to no instance and exist on this node; pids
that do not exist here (another pid namespace) are `unresolved`, not foreign, so a container
does not flood the advice with false alarms.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import psutil

from vsup.snapshot import GpuProcess, GpuStatus
from vsup.telemetry.gpu.base import GpuSample

PROCESS, DEVICE, UNAVAILABLE = "process", "device", "unavailable"


@dataclass(frozen=True)
class HbmFigure:
    bytes: int | None
    source: str  # process | device | unavailable (snapshot.HBM_SOURCES)


@dataclass(frozen=True)
class InstanceRef:
    """What attribution needs to know of an instance."""

    name: str
    pid: int | None  # the API server (the process vsup started), None when not running
    gpus: tuple[int, ...]
    pgid: int | None = None  # its process group: catches orphaned EngineCores


@dataclass(frozen=True)
class GpuPid:
    gpu: int
    pid: int
    hbm_bytes: int | None


@dataclass(frozen=True)
class Attribution:
    instances: Mapping[str, HbmFigure]
    owners: Mapping[tuple[int, int], str]  # (gpu index, pid) -> instance name
    foreign: tuple[GpuPid, ...] = ()  # on a GPU, alive on this node, no instance's
    unresolved: tuple[GpuPid, ...] = ()  # on a GPU, no such pid here (another pid namespace)
    trees: Mapping[str, frozenset[int]] = field(default_factory=dict)


class ProcessTable:
    """The node's processes, read once per poll: pid -> (ppid, pgid).

    Processes come and go while it is read; one that vanished is simply not in the table.
    """

    def __init__(self, rows: Mapping[int, tuple[int, int | None]]) -> None:
        self._rows = dict(rows)
        self._children: dict[int, list[int]] = defaultdict(list)
        self._groups: dict[int, list[int]] = defaultdict(list)
        for pid, (ppid, pgid) in self._rows.items():
            self._children[ppid].append(pid)
            if pgid is not None:
                self._groups[pgid].append(pid)

    @classmethod
    def scan(cls) -> ProcessTable:
        """Read every process of this node: from /proc/PID/stat (one read per process; cost in
        docs/benchmarks.md), else through psutil where there is no /proc."""
        try:
            return cls(_scan_proc())
        except OSError:
            return cls(_scan_psutil())

    def exists(self, pid: int) -> bool:
        return pid in self._rows

    def tree(self, pid: int | None, pgid: int | None = None) -> frozenset[int]:
        """`pid` and its descendants, plus every member of process group `pgid` and theirs."""
        roots: list[int] = []
        if pid is not None and pid in self._rows:
            roots.append(pid)
        if pgid is not None and pgid > 1:  # never group 0/1: that would be the whole node
            roots.extend(self._groups.get(pgid, ()))
        found: set[int] = set()
        stack = roots
        while stack:
            p = stack.pop()
            if p not in found:
                found.add(p)
                stack.extend(self._children.get(p, ()))
        return frozenset(found)


def _scan_proc() -> dict[int, tuple[int, int | None]]:
    rows: dict[int, tuple[int, int | None]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # it exited meanwhile, or is not ours to read
        # `pid (comm) state ppid pgrp ...`; comm may hold spaces and parentheses.
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) < 3:
            continue
        rows[int(entry)] = (int(fields[1]), int(fields[2]))
    return rows


def _scan_psutil() -> dict[int, tuple[int, int | None]]:
    rows: dict[int, tuple[int, int | None]] = {}
    for proc in psutil.process_iter(["ppid"]):
        try:
            ppid = proc.info["ppid"]
            pgid: int | None = os.getpgid(proc.pid)
        except (psutil.Error, OSError):
            continue
        if ppid is not None:
            rows[proc.pid] = (int(ppid), pgid)
    return rows


def attribute(
    instances: Iterable[InstanceRef],
    gpus: Sequence[GpuSample],
    table: ProcessTable | None = None,
) -> Attribution:
    """Per-instance HBM figures, pid owners and foreign pids for one GPU snapshot.

    `instances` are the ones that may hold GPU memory (any with a pid); `table` defaults to a
    fresh `ProcessTable.scan()` (pass one to share a scan, or in tests).
    """
    table = table if table is not None else ProcessTable.scan()
    refs = list(instances)
    samples = {g.index: g for g in gpus}
    trees = {ref.name: table.tree(ref.pid, ref.pgid) for ref in refs}
    owner_of: dict[int, str] = {}
    for ref in refs:
        for pid in trees[ref.name]:
            owner_of.setdefault(pid, ref.name)
    tenants: dict[int, set[str]] = defaultdict(set)
    for ref in refs:
        if trees[ref.name]:
            for g in ref.gpus:
                tenants[g].add(ref.name)

    owners: dict[tuple[int, int], str] = {}
    foreign: list[GpuPid] = []
    unresolved: list[GpuPid] = []
    for sample in gpus:
        for proc in sample.processes:
            name = owner_of.get(proc.pid)
            if name is not None:
                owners[(sample.index, proc.pid)] = name
            elif table.exists(proc.pid):
                foreign.append(GpuPid(sample.index, proc.pid, proc.hbm_bytes))
            else:
                unresolved.append(GpuPid(sample.index, proc.pid, proc.hbm_bytes))

    figures: dict[str, HbmFigure] = {}
    for ref in refs:
        figures[ref.name] = _figure(ref, trees[ref.name], samples, tenants, owner_of, table)
    return Attribution(figures, owners, tuple(foreign), tuple(unresolved), trees)


def _figure(
    ref: InstanceRef,
    tree: frozenset[int],
    samples: Mapping[int, GpuSample],
    tenants: Mapping[int, set[str]],
    owner_of: Mapping[int, str],
    table: ProcessTable,
) -> HbmFigure:
    if not ref.gpus or not tree:
        return HbmFigure(None, UNAVAILABLE)
    total = 0
    for g in ref.gpus:
        sample = samples.get(g)
        if sample is None or sample.error is not None or not sample.per_process_supported:
            break
        ours = [p.hbm_bytes for p in sample.processes if p.pid in tree]
        if not ours or any(b is None for b in ours):
            break
        total += sum(b for b in ours if b is not None)
    else:
        return HbmFigure(total, PROCESS)

    device_total = 0
    for g in ref.gpus:
        sample = samples.get(g)
        if sample is None or sample.error is not None or sample.hbm_used_bytes is None:
            return HbmFigure(None, UNAVAILABLE)
        if tenants.get(g, set()) - {ref.name}:
            return HbmFigure(None, UNAVAILABLE)  # a co-tenant instance: no share is guessed
        for proc in sample.processes:
            if proc.pid in tree:
                continue
            if proc.pid in owner_of or table.exists(proc.pid):
                return HbmFigure(None, UNAVAILABLE)  # a visible process of someone else
        device_total += sample.hbm_used_bytes
    return HbmFigure(device_total, DEVICE)


def gpu_statuses(gpus: Sequence[GpuSample], attribution: Attribution) -> tuple[GpuStatus, ...]:
    """The snapshot's `gpus` entries: each GPU with its processes and their owners."""
    return tuple(
        GpuStatus(
            index=g.index,
            name=g.name,
            hbm_total_bytes=g.hbm_total_bytes,
            hbm_used_bytes=g.hbm_used_bytes,
            util_pct=g.util_pct,
            temp_c=g.temp_c,
            power_w=g.power_w,
            processes=tuple(
                GpuProcess(p.pid, p.hbm_bytes, attribution.owners.get((g.index, p.pid)))
                for p in g.processes
            ),
            health=g.health,
        )
        for g in gpus
    )
