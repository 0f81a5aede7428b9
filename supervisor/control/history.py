"""Per-instance history for the dashboard's sparklines: the last 10 minutes at the poll rate."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from supervisor.snapshot import InstanceStatus

WINDOW_S = 600.0
SERIES = ("kv_cache_usage", "generation_tokens_per_s", "preemptions_per_min", "preemptions_total")


@dataclass(frozen=True)
class Point:
    t: float  # wall-clock seconds
    kv_cache_usage: float | None
    generation_tokens_per_s: float | None
    preemptions_per_min: float | None
    preemptions_total: float | None


class History:
    """Ring buffers of recent samples, one per instance; a gap in telemetry stays `None`."""

    def __init__(self, window_s: float = WINDOW_S, max_points: int = 1200) -> None:
        self.window_s = window_s
        self._max = max_points
        self._points: dict[str, deque[Point]] = {}

    def record(self, t: float, inst: InstanceStatus) -> None:
        """Add one sample of `inst` taken at wall time `t`."""
        buf = self._points.setdefault(inst.name, deque(maxlen=self._max))
        buf.append(
            Point(
                t,
                inst.kv_cache_usage,
                inst.generation_tokens_per_s,
                inst.preemptions_per_min,
                inst.preemptions_total,
            )
        )
        while buf and buf[0].t < t - self.window_s:
            buf.popleft()

    def forget(self, names: set[str]) -> None:
        """Drop the history of instances no longer in the layout."""
        for name in list(self._points):
            if name not in names:
                del self._points[name]

    def points(self, name: str) -> list[Point]:
        return list(self._points.get(name, ()))

    def series(self, name: str) -> dict[str, list[Any]]:
        """The `/v1/instances/{name}/history` document: parallel lists, oldest first."""
        pts = self.points(name)
        doc: dict[str, list[Any]] = {"t": [round(p.t, 3) for p in pts]}
        for key in SERIES:
            doc[key] = [getattr(p, key) for p in pts]
        return doc

    def preemptions_rising(self, name: str, now: float, within_s: float = 120.0) -> bool:
        """Whether the preemption counter went up in the last `within_s` seconds."""
        # Newest first, stopping at the window's start: this runs for every instance on every
        # status request, and a buffer holds up to 10 minutes of points.
        later = None
        for p in reversed(self._points.get(name, ())):
            if p.t < now - within_s:
                break
            if p.preemptions_total is None:
                continue
            # A restart resets the counter; only increases count.
            if later is not None and later > p.preemptions_total:
                return True
            later = p.preemptions_total
        return False
