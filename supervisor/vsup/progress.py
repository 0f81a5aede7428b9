"""What CLI commands print while they wait: a live line on a terminal, nothing in a pipe."""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, TextIO

from vsup.control.errors import DaemonUnavailable
from vsup.states import State

if TYPE_CHECKING:  # the client imports httpx: `vsup status` formats durations without it
    from vsup.control.client import Client
    from vsup.snapshot import InstanceStatus, StatusSnapshot


class Progress:
    """One status line rewritten in place on a terminal; silent when the stream is not one."""

    def __init__(self, stream: TextIO | None = None, enabled: bool | None = None) -> None:
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty() if enabled is None else enabled
        self._shown = False

    def update(self, text: str) -> None:
        if not self.live:
            return
        width = shutil.get_terminal_size((100, 20)).columns - 1
        self.stream.write("\r\x1b[K" + text[:width])
        self.stream.flush()
        self._shown = True

    def clear(self) -> None:
        if self.live and self._shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._shown = False


def fmt_duration(seconds: float | None) -> str:
    """12 s, 3m05s, 2h10m, 3d4h; '-' when unknown."""
    if seconds is None:
        return "-"
    s = int(max(0, seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600}h"


def describe_waiting(instances: Iterable[InstanceStatus]) -> str:
    """'ready 1/3 · gpu1 loading 12s · gpu2 backoff 8s (oom)'."""
    insts = list(instances)
    ready = sum(1 for i in insts if i.lifecycle.state == State.READY)
    parts = [f"ready {ready}/{len(insts)}"]
    for i in insts:
        if i.lifecycle.state == State.READY:
            continue
        since = fmt_duration(i.lifecycle.state_since_s)
        if i.lifecycle.state == State.STARTING and i.lifecycle.waiting_for:
            parts.append(f"{i.name} waits ({i.lifecycle.waiting_for})")
        elif i.lifecycle.state == State.STARTING:
            parts.append(f"{i.name} loading {since}")
        elif i.lifecycle.state == State.BACKOFF:
            why = i.lifecycle.last_exit.reason if i.lifecycle.last_exit else None
            left = i.lifecycle.backoff_remaining_s
            parts.append(
                f"{i.name} backoff"
                + (f" {fmt_duration(left)}" if left is not None else "")
                + (f" ({why})" if why else "")
            )
        else:
            parts.append(f"{i.name} {i.lifecycle.state} {since}")
    return " · ".join(parts)


def wait_ready(
    client: Client,
    names: list[str],
    timeout: float,
    progress: Progress,
    interval: float = 0.2,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[bool, StatusSnapshot]:
    """Poll status until every named instance is ready (True) or one failed or the time is up
    (False). Returns the outcome and the last status. A status is a few ms of the
    daemon's time: asked every 0.2 s, a ready instance is reported within a fifth of a second
    (it was 0.5 s: each `--wait` came a quarter of a second late on average)."""
    deadline = clock() + timeout
    t0 = clock()
    while True:
        try:
            doc = client.status()
        except DaemonUnavailable:
            progress.clear()
            raise
        by_name = {i.name: i for i in doc.instances}
        mine = [by_name[n] for n in names if n in by_name]
        if len(mine) == len(names) and all(i.lifecycle.state == State.READY for i in mine):
            progress.clear()
            return True, doc
        if any(i.lifecycle.state == State.FAILED for i in mine):
            progress.clear()
            return False, doc
        if clock() >= deadline:
            progress.clear()
            return False, doc
        progress.update(f"[{fmt_duration(clock() - t0)}] " + describe_waiting(mine))
        sleep(interval)
