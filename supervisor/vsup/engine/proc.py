"""Processes of one instance: the API server vsup spawned or adopted, and its whole tree.

Exit detection is immediate and needs no SIGCHLD handler: a pidfd (`os.pidfd_open`) turns
readable when the process ends, for children and non-children alike, and the event loop
watches it with `add_reader`. A child is then reaped with `Popen.poll()` (waitpid WNOHANG), so
the exit status is known and no zombie stays; an adopted process (spawned by an earlier
daemon) is not our child, so its status is unknown. Nothing here calls waitpid(-1): a
daemon must not install an asyncio child watcher that does (asyncio's default watchers wait
for their own pids only).

The tree of an instance is: every live process of its process group (vLLM never starts a
session of its own, so EngineCore and the workers stay in the group, even re-parented to PID 1
after a SIGKILL of the API server), every descendant seen while it ran (refreshed
periodically: a descendant may change its group), and the descendants of all of those.
Processes are identified by pid *and* start time, so a reused pid is never signalled.

The scans read /proc directly (cheaper than psutil's process_iter: docs/benchmarks.md); they
are still called from a thread by the runner.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field

import psutil

from vsup.engine.ranks import RankWatch

log = logging.getLogger("vsup.engine")

CLK_TCK = os.sysconf("SC_CLK_TCK")
# Start times of one process read by two daemons may differ when the clock was stepped between
# them (the kernel's boot time moves: by exactly 1 s in a fresh-clone run here, 2026-12-07, which
# a 1 s window refused); a reused pid starting within this window is implausible.
SAME_PROCESS_S = 2.0
FALLBACK_POLL_S = 0.1


def _boot_time() -> float:
    return psutil.boot_time()


_BOOT = _boot_time()


@dataclass(frozen=True)
class ProcInfo:
    pid: int
    ppid: int
    pgid: int
    state: str  # R, S, D, Z, ...
    create_time: float  # seconds since the epoch, as psutil.Process.create_time() gives it


def read_stat(pid: int) -> ProcInfo | None:
    """One process from /proc/PID/stat, or None if there is no such process."""
    # os.open/os.read, not open(): a scan reads every process of the node, and the buffered
    # file object cost ~80 % more per process (18 against 10 us here, 2026-12-07)
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
    except OSError:
        return None
    try:
        data = os.read(fd, 4096)  # one line of ~300 bytes (the comm is at most 15 characters)
    except OSError:
        return None
    finally:
        os.close(fd)
    if not data:
        return None
    # the command name (field 2) may hold spaces and parentheses: split after the last ')'
    rest = data[data.rfind(b")") + 2 :].split()
    return ProcInfo(
        pid=pid,
        ppid=int(rest[1]),
        pgid=int(rest[2]),
        state=rest[0].decode(),
        create_time=int(rest[19]) / CLK_TCK + _BOOT,
    )


# /proc/PID/stat's state letter of a process that ended and waits to be reaped.
ZOMBIE = "Z"

_STATE_WORDS = {
    "D": "uninterruptible sleep, waiting on the kernel or a driver",
    "R": "running",
    "S": "sleeping",
    "T": "stopped",
    "t": "stopped by a tracer",
    "Z": "a zombie nobody reaped",
}


def describe(pid: int) -> str:
    """One process for people: `28258 VLLM::Worker (R: running, exiting)`.

    `exiting`: its memory map is being torn down (an empty cmdline), i.e. it got the signal and
    the kernel has not finished with it."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            exiting = not f.read(1)
    except OSError:
        return f"{pid} (gone)"
    comm = data[data.find(b"(") + 1 : data.rfind(b")")].decode(errors="replace")
    state = data[data.rfind(b")") + 2 :].split(b" ", 1)[0].decode()
    words = _STATE_WORDS.get(state, "")
    return f"{pid} {comm} ({state}{': ' + words if words else ''}{', exiting' if exiting else ''})"


def process_table() -> dict[int, ProcInfo]:
    """Every process on the node."""
    table: dict[int, ProcInfo] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            info = read_stat(int(entry))
            if info is not None:
                table[info.pid] = info
    return table


def same_process(a: float, b: float) -> bool:
    return abs(a - b) < SAME_PROCESS_S


_Index = dict[int, list[ProcInfo]]
# The last table's processes by group and by parent. Every runner's chores walk the same shared
# scan (Engine.scan_processes): indexing the node's whole table once per instance made a
# round of chores O(instances x processes). A table is never changed once scanned.
_indexed: tuple[Mapping[int, ProcInfo], int, _Index, _Index] | None = None


def _indexes(table: Mapping[int, ProcInfo]) -> tuple[_Index, _Index]:
    """`table`'s processes by process group and by parent pid (remembered for the last table)."""
    global _indexed
    last = _indexed
    if last is not None and last[0] is table and last[1] == len(table):
        return last[2], last[3]
    groups: _Index = {}
    children: _Index = {}
    for info in table.values():
        groups.setdefault(info.pgid, []).append(info)
        children.setdefault(info.ppid, []).append(info)
    _indexed = (table, len(table), groups, children)
    return groups, children


def live_tree(
    pgid: int | None,
    known: Mapping[int, float],
    leader_create_time: float,
    table: Mapping[int, ProcInfo] | None = None,
) -> dict[int, ProcInfo]:
    """The live (non-zombie) processes of an instance's tree, by pid.

    `pgid`: the instance's process group, whose leader (pid == pgid, the API server) started at
    `leader_create_time`. `known`: pid -> start time of processes seen earlier.

    The group counts only while it is surely ours: Linux never hands out a pid that is still
    in use as a group id, so while our orphans keep the group, no other process can have
    pid == pgid; if one does, the old group is gone and the id names someone else's.
    """
    table = process_table() if table is None else table
    leader = table.get(pgid) if pgid is not None else None
    if leader is not None and not same_process(leader.create_time, leader_create_time):
        pgid = None
    groups, children = _indexes(table)
    roots = [
        info
        for info in (groups.get(pgid, ()) if pgid is not None else ())
        if info.create_time >= leader_create_time - SAME_PROCESS_S
    ]
    for pid, started in known.items():
        info = table.get(pid)
        if info is not None and same_process(started, info.create_time):
            roots.append(info)
    found: dict[int, ProcInfo] = {}
    stack = list(roots)
    seen: set[int] = set()
    while stack:
        info = stack.pop()
        if info.pid in seen:
            continue
        seen.add(info.pid)
        # a zombie holds nothing, but its live children (re-parented later) still count
        if info.state != ZOMBIE:
            found[info.pid] = info
        stack.extend(children.get(info.pid, ()))
    return found


def signal_tree(pgid: int | None, members: Mapping[int, ProcInfo], sig: int) -> None:
    """Send `sig` to the group (atomically, so a process forked meanwhile gets it too) and to
    each member outside it. The group is signalled only while a member proves it is ours."""
    if pgid is not None and any(m.pgid == pgid for m in members.values()):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, sig)
    for m in members.values():
        if m.pgid == pgid:
            continue
        now = read_stat(m.pid)
        if now is None or not same_process(now.create_time, m.create_time):
            continue
        with contextlib.suppress(ProcessLookupError):
            os.kill(m.pid, sig)


@dataclass(frozen=True)
class ExitStatus:
    """How the API server ended: `code` if it exited, `signum` if a signal ended it; both
    None for an adopted process (not our child: the kernel gives its status to its parent)."""

    code: int | None
    signum: int | None

    @classmethod
    def from_returncode(cls, rc: int) -> ExitStatus:
        return cls(None, -rc) if rc < 0 else cls(rc, None)


@dataclass
class RunningProcess:
    """One spawned or adopted vLLM API server and what vsup knows of its tree."""

    pid: int
    pgid: int
    create_time: float
    run: int
    popen: subprocess.Popen | None = None  # None when adopted
    # pid -> start time of every process of the tree seen while it ran, this one included
    tracked: dict[int, float] = field(default_factory=dict)
    exited: asyncio.Future | None = None
    ranks: RankWatch = field(default_factory=RankWatch)  # data-parallel engine cores
    _pidfd: int | None = None
    _poller: asyncio.Task | None = None

    def __post_init__(self) -> None:
        self.tracked.setdefault(self.pid, self.create_time)

    @property
    def adopted(self) -> bool:
        return self.popen is None

    @property
    def alive(self) -> bool:
        return self.exited is not None and not self.exited.done()

    @property
    def exit_future(self) -> asyncio.Future:
        """`exited` of a watched process: a process is always watched before it is supervised,
        so None here is a bug, not a state."""
        if self.exited is None:
            raise RuntimeError(f"process {self.pid} is supervised before it is watched")
        return self.exited

    def watch(self, loop: asyncio.AbstractEventLoop | None = None) -> asyncio.Future:
        """Start watching for the exit; `exited` resolves to an ExitStatus.

        Raises ProcessLookupError when an adopted process is gone or its pid now names another
        process (checked after the pidfd is open, so the pidfd surely names the right one).
        """
        loop = loop or asyncio.get_running_loop()
        self.exited = loop.create_future()
        try:
            self._pidfd = os.pidfd_open(self.pid)
        except ProcessLookupError:
            if self.popen is None:
                raise
            self._pidfd = None  # a child that exited and was reaped already: poll() says how
        except (AttributeError, OSError):  # no pidfd on this kernel (< 5.3): poll instead
            self._pidfd = None
        if self.popen is None:
            info = read_stat(self.pid)
            if (
                info is None
                or info.state == ZOMBIE
                or not same_process(info.create_time, self.create_time)
            ):
                self.close()
                raise ProcessLookupError(self.pid)
        if self._pidfd is not None:
            loop.add_reader(self._pidfd, self._on_exit)
        else:
            self._poller = loop.create_task(self._poll())
        return self.exited

    def _on_exit(self) -> None:
        if self.popen is not None:
            rc = self.popen.poll()
            if rc is None:  # cannot happen for a readable pidfd; keep watching
                return
            status = ExitStatus.from_returncode(rc)
        else:
            status = ExitStatus(None, None)
        self.close()
        if self.exited is not None and not self.exited.done():
            self.exited.set_result(status)

    async def _poll(self) -> None:
        while True:
            if self.popen is not None:
                if self.popen.poll() is not None:
                    break
            else:
                info = read_stat(self.pid)
                if (
                    info is None
                    or info.state == ZOMBIE
                    or not same_process(info.create_time, self.create_time)
                ):
                    break
            await asyncio.sleep(FALLBACK_POLL_S)
        self._poller = None
        self._on_exit()

    def close(self) -> None:
        """Stop watching (the process keeps running: used when the daemon detaches)."""
        self.ranks.close()
        if self._pidfd is not None:
            with contextlib.suppress(RuntimeError):
                asyncio.get_running_loop().remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None
        if self._poller is not None and self._poller is not asyncio.current_task():
            self._poller.cancel()
            self._poller = None

    def tree(self, table: Mapping[int, ProcInfo] | None = None) -> dict[int, ProcInfo]:
        """The live tree in `table`, or now (blocking then: call from a thread; it reads a
        copy of `tracked`)."""
        return live_tree(self.pgid, dict(self.tracked), self.create_time, table)

    def remember(self, members: Mapping[int, ProcInfo]) -> None:
        """Add a scan's members to `tracked` (on the loop: `tracked` has one writer)."""
        for pid, info in members.items():
            self.tracked.setdefault(pid, info.create_time)

    def descendants(self) -> frozenset[int]:
        """Pids seen in the tree besides the API server itself."""
        return frozenset(p for p in self.tracked if p != self.pid)
