"""Telling the daemon what the bench is doing, so that the dashboard can show it.

The bench's main thread blocks for long stretches (an apply, clients importing vLLM, a
restore); a thread of its own sends the latest progress every second and at once on a change
of phase, over its own control client. The daemon forgets a report ten seconds after the last
one (control/benchprogress.py): the heartbeat is what keeps it shown. Reporting never fails the
bench: a daemon that does not answer, or that predates the route, is simply not told.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from vsup.control.errors import ControlError, DaemonUnavailable

if TYPE_CHECKING:
    from vsup.control.client import Client

INTERVAL_S = 1.0
# Keys a daemon older than them refuses (400, "unknown key"): after such a refusal the
# publisher sends its reports without them, so a new `vsup bench` still shows on an old daemon.
NEWER_KEYS = ("tool", "eta_s")


class ProgressPublisher:
    """`phase(...)` at each step, `requests(done, total)` while clients run, `close()` at the
    end (the daemon drops the report then)."""

    def __init__(
        self,
        make_client: Callable[[], Client],
        interval: float = INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        tool: str = "bench",
    ) -> None:
        """`tool`: who runs ("bench", or "tune": snapshot.BENCH_TOOLS), for the dashboard."""
        self.make_client = make_client
        self.tool = tool
        self.interval = interval
        self.clock = clock
        self.pid = os.getpid()
        self.started_at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        self.sent = 0  # reports the daemon took (tests read it)
        self._lock = threading.Lock()
        self._state: dict[str, Any] = {}
        self._phase_since = clock()
        self._eta_at: float | None = None  # by `clock`: when the whole run should be over
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._client: Client | None = None
        self._refused = False  # the daemon has no such route (an older vsup): stop asking
        self._lean = False  # the daemon refused NEWER_KEYS: leave them out

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="bench-progress", daemon=True)
        self._thread.start()

    def phase(
        self,
        phase: str,
        *,
        layout: str | None = None,
        index: int | None = None,
        count: int | None = None,
        requests_total: int | None = None,
    ) -> None:
        """A new phase (BENCH_PHASES); requests are unknown until `requests` says them."""
        with self._lock:
            self._state = {
                "phase": phase,
                "layout": layout,
                "index": index,
                "count": count,
                "requests_done": 0 if requests_total is not None else None,
                "requests_total": requests_total,
            }
            self._phase_since = self.clock()
        self._wake.set()

    def eta(self, seconds: float | None) -> None:
        """The whole run should be over in about `seconds` (None: unknown); each report
        counts it down."""
        with self._lock:
            self._eta_at = None if seconds is None else self.clock() + max(0.0, seconds)

    def requests(self, done: int, total: int) -> None:
        with self._lock:
            self._state["requests_done"] = done
            self._state["requests_total"] = total

    def report(self) -> dict[str, Any] | None:
        """The report as it would be sent now (None before the first phase)."""
        with self._lock:
            if not self._state:
                return None
            now = self.clock()
            report = {
                "pid": self.pid,
                **self._state,
                "elapsed_s": round(now - self._phase_since, 1),
                "started_at": self.started_at,
                "tool": self.tool,
            }
            if self._eta_at is not None:
                report["eta_s"] = round(max(0.0, self._eta_at - now), 1)
            return report

    def close(self) -> None:
        """Stop reporting and tell the daemon the bench is over."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(10)
        self._send({"pid": self.pid, "phase": "done"})
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()
            self._client = None

    def _loop(self) -> None:
        while not self._stop.is_set():
            report = self.report()
            if report is not None:
                self._send(report)
            self._wake.wait(self.interval)
            self._wake.clear()

    def _send(self, report: dict[str, Any]) -> None:
        if self._refused:
            return
        if self._lean:
            report = {k: v for k, v in report.items() if k not in NEWER_KEYS}
        try:
            if self._client is None:
                self._client = self.make_client()
            self._client.bench_progress(report)
            self.sent += 1
        except ControlError as exc:
            if exc.status in (404, 405):
                self._refused = True
            elif exc.status == 400 and not self._lean and any(k in report for k in NEWER_KEYS):
                self._lean = True  # an older daemon: the next report goes without them
        except (DaemonUnavailable, OSError):
            pass  # a daemon that restarts answers the next report
        except Exception:
            # httpx timeouts and the like: the next report tries again
            if self._client is not None:
                with contextlib.suppress(Exception):
                    self._client.close()
            self._client = None
