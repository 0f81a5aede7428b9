"""The progress of a `vsup bench` run, as the daemon keeps it for status JSON's `bench` key.

The bench is a client process, not the daemon: it reports (POST /v1/bench/progress) about once
a second, and the daemon only remembers the latest report. A report outlives its sender by at
most `STALE_S`: a bench that was killed (its pid is gone, or reused by another process) or that
stopped reporting is forgotten, so the dashboard never shows a bench that no longer runs.

A bench that died without restoring (SIGKILL) reports nothing more, but the layout lease it
wrote before its first apply (vsup/lease.py) says who it was, what it replaced and when:
while its pid is gone and one of its layouts still runs, `advice()` gives a `bench_abandoned`
advice (critical) saying so and how to put the original back (`vsup bench --restore`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vsup.clock import Clock
from vsup.control.liveness import process_matches
from vsup.engine import proc
from vsup.lease import Lease, lease_path, read_lease
from vsup.snapshot import BENCH_PHASES, Advice, BenchStatus, StatusSnapshot

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

    def __init__(
        self,
        clock: Clock,
        stale_s: float = STALE_S,
        *,
        home: Path | None = None,
        running_layout: Callable[[], str | None] | None = None,
    ) -> None:
        """`home` holds the layout lease; `running_layout()` gives the running layout's text."""
        self.clock = clock
        self.stale_s = stale_s
        self.home = Path(home) if home is not None else None
        self.running_layout = running_layout
        self._report: _Report | None = None
        self.version = 0  # counts reports taken: the daemon's snapshot follows it
        self._lease: Lease | None = None
        self._lease_id: tuple[int, int, int] | None = None

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

    @property
    def running(self) -> bool:
        """A bench or tune reports progress (not done, not stale, its sender alive)."""
        return self._report is not None and self.current() is not None

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
            "tool": body.get("tool", "bench"),
            # counted down by the daemon's clock between reports, as elapsed_s counts up
            "eta_s": None if body.get("eta_s") is None else round(max(0.0, body["eta_s"] - age), 1),
        }

    # ---------------------------------------------------------------- a bench that died

    def abandoned(self) -> Lease | None:
        """The lease of a bench that is gone while one of its layouts still runs, else None."""
        if self.home is None or self.running_layout is None:
            return None
        lease = self._read_lease()
        if lease is None or lease.alive():
            return None
        return lease if lease.holds(self.running_layout()) else None

    def advice(self) -> list[Advice]:
        """`bench_abandoned` while a dead bench's layout replaces the one it took down."""
        lease = self.abandoned()
        if lease is None:
            return []
        original = lease.replaced_name()
        replaced = f"replaced layout {original}" if original else "applied its layouts"
        back = f"put {original} back" if original else "stop its instances (nothing ran before)"
        return [
            Advice(
                kind="bench_abandoned",
                severity="critical",
                message=(
                    f"vsup {lease.owner} (pid {lease.pid}) {replaced} at {lease.started_at} "
                    f"and ended without restoring it: run `vsup bench --restore` to {back}, "
                    "or `vsup up FILE` to apply another layout"
                ),
            )
        ]

    def _read_lease(self) -> Lease | None:
        """The lease file, read again only when it changed (one stat a call)."""
        assert self.home is not None
        try:
            st = os.stat(lease_path(self.home))
        except OSError:
            self._lease, self._lease_id = None, None
            return None
        ident = (st.st_ino, st.st_mtime_ns, st.st_size)
        if ident != self._lease_id:
            self._lease, self._lease_id = read_lease(self.home), ident
        return self._lease


def decode_bench(doc: dict[str, Any]) -> BenchStatus:
    """A report as `BenchStatus` (the snapshot's own JSON reading, so the two cannot drift)."""
    return StatusSnapshot.decode_part(BenchStatus, doc)
