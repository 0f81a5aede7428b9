"""The progress of a `vsup bench` run, as the daemon keeps it for status JSON's `bench` key.

The bench is a client process, not the daemon: it reports (POST /v1/bench/progress) about once
a second, and the daemon only remembers the latest report. A report outlives its sender by at
most `STALE_S`: a bench that was killed (its pid is gone, or reused by another process) or that
stopped reporting is forgotten, so the dashboard never shows a bench that no longer runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vsup.clock import Clock
from vsup.control.liveness import process_matches
from vsup.engine import proc
from vsup.snapshot import BENCH_PHASES, BenchStatus, StatusSnapshot

# The bench reports every second from its own thread; ten missed reports mean it is gone
# (stopped with SIGSTOP, or on another pid namespace where its pid cannot be checked).
STALE_S = 10.0
DONE = "done"  # the last report of a run: forget it at once
PHASES = (*BENCH_PHASES, DONE)


@dataclass
class _Report:
    body: dict[str, Any]
    received: float  # the clock's monotonic seconds
    phase_since: float  # when this phase began, by the daemon's clock
    create_time: float | None  # the sender's start time, when its pid could be read


class BenchProgressBoard:
    """The latest report of the bench that runs now (at most one is shown)."""

    def __init__(self, clock: Clock, stale_s: float = STALE_S) -> None:
        self.clock = clock
        self.stale_s = stale_s
        self._report: _Report | None = None
        self.version = 0  # counts reports taken: the daemon's snapshot follows it

    def update(self, body: dict[str, Any]) -> None:
        """Take a report (keys checked by the API). Phase `done` from the same sender clears."""
        self.version += 1
        now = self.clock.monotonic()
        pid = int(body["pid"])
        current = self._report if self._report and self._report.body["pid"] == pid else None
        if body["phase"] == DONE:
            if current is not None:
                self._report = None
            return
        elapsed = float(body.get("elapsed_s") or 0.0)
        if current is not None:
            create_time = current.create_time
        else:
            stat = proc.read_stat(pid)
            create_time = stat.create_time if stat is not None else None
        self._report = _Report(dict(body), now, now - elapsed, create_time)

    def status(self) -> BenchStatus | None:
        """`current()` typed, as the snapshot carries it (every key of the report must be a
        field of snapshot.BenchStatus: tests/unit/control/test_benchprogress.py checks)."""
        doc = self.current()
        return None if doc is None else decode_bench(doc)

    def current(self) -> dict[str, Any] | None:
        """The report as status JSON's `bench`, or None (none, stale, or its sender died)."""
        rep = self._report
        if rep is None:
            return None
        now = self.clock.monotonic()
        age = now - rep.received
        gone = rep.create_time is not None and not process_matches(rep.body["pid"], rep.create_time)
        if age > self.stale_s or gone:
            self._report = None
            return None
        body = rep.body
        return {
            "pid": body["pid"],
            "phase": body["phase"],
            "layout": body.get("layout"),
            "index": body.get("index"),
            "count": body.get("count"),
            "requests_done": body.get("requests_done"),
            "requests_total": body.get("requests_total"),
            # advanced by the daemon's clock between reports, so the dashboard's time moves
            "elapsed_s": round(now - rep.phase_since, 1),
            "started_at": body.get("started_at"),
            "age_s": round(age, 1),
        }


def decode_bench(doc: dict[str, Any]) -> BenchStatus:
    """A report as `BenchStatus` (the snapshot's own JSON reading, so the two cannot drift)."""
    return StatusSnapshot.decode_part(BenchStatus, doc)
