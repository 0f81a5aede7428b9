"""Counters -> rates, and the per-instance history the dashboard draws sparklines from.

vLLM's counters (tokens, preemptions, prefix-cache queries and hits) only grow while a server
runs and start again from zero when it restarts. A `CounterRate` turns successive readings into
a rate over a sliding window, Prometheus-style: a reading below the previous one is a reset, and
the new reading counts as the increase since the reset. A reset the values cannot show (the
new server overtook the old count between two scrapes) is told by the caller: `process_start_time_s`
from the payload, or the supervisor's run number, changes.

Time comes from the caller (an injected clock's `monotonic()`), so tests drive it without
sleeping.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from vsup.clock import Clock
from vsup.telemetry.metrics import VllmMetrics

TOKENS_WINDOW_S = 10.0  # short: tokens/s should follow the load within seconds
PREEMPTIONS_WINDOW_S = 60.0  # a per-minute figure is read over a minute
HISTORY_SPAN_S = 600.0


class CounterRate:
    """The per-second rate of one counter over the last `window_s` seconds, reset-aware.

    `update(t, value)` records a reading at monotonic time `t`; `rate(now)` is the increase
    over the window divided by the time it spans, or None with fewer than two readings in it,
    or when the newest reading is older than the window (the counter stopped being read).
    """

    def __init__(self, window_s: float) -> None:
        if window_s <= 0:
            raise ValueError("window_s must be positive")
        self.window_s = window_s
        # (t, cumulative increase since the first reading); one point older than the window is
        # kept so that the window is covered from its start.
        self._points: deque[tuple[float, float]] = deque()
        self._last_value: float | None = None
        self._total = 0.0

    def update(self, t: float, value: float | None, *, reset: bool = False) -> None:
        """Record `value` read at `t`. `reset=True`: the counter restarted since the last
        reading (even if `value` is not lower), so all of `value` is new increase."""
        if value is None or not math.isfinite(value):
            return
        if self._points and t <= self._points[-1][0]:
            return  # readings out of order or twice at one instant carry no rate
        if self._last_value is not None:
            if reset or value < self._last_value:
                self._total += value
            else:
                self._total += value - self._last_value
        self._last_value = value
        self._points.append((t, self._total))
        horizon = t - self.window_s
        while len(self._points) > 2 and self._points[1][0] <= horizon:
            self._points.popleft()

    def rate(self, now: float | None = None) -> float | None:
        """Increase per second over the window ending at the newest reading."""
        if len(self._points) < 2:
            return None
        t_last, total_last = self._points[-1]
        if now is not None and now - t_last > self.window_s:
            return None
        t_first, total_first = self._points[0]
        span = t_last - t_first
        if span <= 0:
            return None
        return (total_last - total_first) / span

    def fresh_until(self) -> float | None:
        """Until when `rate(now)` answers what it answers now (its newest reading stays
        within the window); None while it has no rate to lose."""
        if len(self._points) < 2:
            return None
        return self._points[-1][0] + self.window_s

    def clear(self) -> None:
        self._points.clear()
        self._last_value = None
        self._total = 0.0


@dataclass(frozen=True)
class Rates:
    """Rates derived from an instance's counters; None until two readings exist."""

    generation_tokens_per_s: float | None = None
    prompt_tokens_per_s: float | None = None
    preemptions_per_min: float | None = None
    # Hits / queries over the tokens window; the since-start ratio when no query happened in it.
    prefix_cache_hit_rate: float | None = None


class InstanceRates:
    """All the rates of one instance, fed one `VllmMetrics` per scrape."""

    def __init__(
        self,
        clock: Clock,
        tokens_window_s: float = TOKENS_WINDOW_S,
        preemptions_window_s: float = PREEMPTIONS_WINDOW_S,
    ) -> None:
        self._clock = clock
        self._gen = CounterRate(tokens_window_s)
        self._prompt = CounterRate(tokens_window_s)
        self._preempt = CounterRate(preemptions_window_s)
        self._queries = CounterRate(tokens_window_s)
        self._hits = CounterRate(tokens_window_s)
        self._start_time: float | None = None
        self._run: Any = None
        self._last_metrics: VllmMetrics | None = None
        # The last `rates()` answer, (asked at, good until, rates): it stays the answer until
        # the next reading or until a window it read from runs out (the daemon reads the rates
        # of every instance for each snapshot, and a reading comes once a second).
        self._memo: tuple[float, float, Rates] | None = None

    def observe(self, metrics: VllmMetrics, run: Any = None, t: float | None = None) -> Rates:
        """Record one scrape (read at `t`, default the clock's now) and return the rates.
        `run` is the caller's identity of the server process (the supervisor's run number);
        a change, like a change of the payload's process start time, marks a counter reset."""
        now = self._clock.monotonic() if t is None else t
        reset = False
        if run is not None:
            reset |= self._run is not None and run != self._run
            self._run = run
        start = metrics.process_start_time_s
        if start is not None:
            reset |= self._start_time is not None and start != self._start_time
            self._start_time = start
        self._gen.update(now, metrics.generation_tokens_total, reset=reset)
        self._prompt.update(now, metrics.prompt_tokens_total, reset=reset)
        self._preempt.update(now, metrics.preemptions_total, reset=reset)
        self._queries.update(now, metrics.prefix_cache_queries_total, reset=reset)
        self._hits.update(now, metrics.prefix_cache_hits_total, reset=reset)
        self._last_metrics = metrics
        self._memo = None
        return self.rates(now)

    def rates(self, now: float | None = None) -> Rates:
        """The rates as of `now` (default the clock's now); stale windows give None."""
        now = self._clock.monotonic() if now is None else now
        memo = self._memo
        if memo is not None and memo[0] <= now <= memo[1]:
            return memo[2]
        preempt = self._preempt.rate(now)
        queries = self._queries.rate(now)
        hits = self._hits.rate(now)
        if queries and hits is not None:
            hit_rate: float | None = min(1.0, max(0.0, hits / queries))
        elif self._last_metrics is not None:
            hit_rate = self._last_metrics.prefix_cache_hit_rate
        else:
            hit_rate = None
        rates = Rates(
            generation_tokens_per_s=self._gen.rate(now),
            prompt_tokens_per_s=self._prompt.rate(now),
            preemptions_per_min=None if preempt is None else preempt * 60.0,
            prefix_cache_hit_rate=hit_rate,
        )
        until = math.inf
        for c in (self._gen, self._prompt, self._preempt, self._queries, self._hits):
            fresh_until = c.fresh_until()
            if fresh_until is not None and now <= fresh_until:
                until = min(until, fresh_until)
        self._memo = (now, until, rates)
        return rates

    def clear(self) -> None:
        """Forget every reading (the instance was stopped)."""
        for c in (self._gen, self._prompt, self._preempt, self._queries, self._hits):
            c.clear()
        self._memo = None
        self._start_time = None
        self._run = None
        self._last_metrics = None


@dataclass(frozen=True)
class HistoryPoint:
    t: float  # wall-clock seconds (epoch), so clients can label the axis
    kv_cache_usage: float | None
    generation_tokens_per_s: float | None
    preemptions_per_min: float | None


class History:
    """A ring buffer of the last `span_s` seconds of one instance's headline figures.

    Bounded twice: by time (points older than `span_s` before the newest are dropped) and by
    count (`max_points`), so a fast poll can never grow it without limit."""

    def __init__(self, span_s: float = HISTORY_SPAN_S, max_points: int = 1200) -> None:
        self.span_s = span_s
        self._points: deque[HistoryPoint] = deque(maxlen=max_points)
        # kv_peak's last answer: (window, the newest point then, the peak); points come and go
        # only with a new newest point, and the daemon asks for every instance at every poll
        self._peak: tuple[float, HistoryPoint, float | None] | None = None

    def append(
        self,
        t: float,
        kv_cache_usage: float | None,
        generation_tokens_per_s: float | None,
        preemptions_per_min: float | None,
    ) -> None:
        """Add one point at wall time `t`; a point not after the newest one replaces nothing
        and is dropped (wall time can step back; the series must stay ordered)."""
        if self._points and t <= self._points[-1].t:
            return
        self._points.append(
            HistoryPoint(t, kv_cache_usage, generation_tokens_per_s, preemptions_per_min)
        )
        horizon = t - self.span_s
        while self._points and self._points[0].t < horizon:
            self._points.popleft()

    def points(self) -> tuple[HistoryPoint, ...]:
        return tuple(self._points)

    def kv_peak(self, window_s: float) -> float | None:
        """The highest KV-cache usage seen in the last `window_s` seconds, or None."""
        if not self._points:
            return None
        last = self._points[-1]
        memo = self._peak
        if memo is not None and memo[1] is last and memo[0] == window_s:
            return memo[2]
        since = last.t - window_s
        peak: float | None = None
        # newest first, and stop at the window's start: the daemon asks for every instance at
        # every poll, and the history holds 10 minutes (a walk of it all cost O(history))
        for p in reversed(self._points):
            if p.t < since:
                break
            v = p.kv_cache_usage
            if v is not None and (peak is None or v > peak):
                peak = v
        self._peak = (window_s, last, peak)
        return peak

    def __len__(self) -> int:
        return len(self._points)

    def clear(self) -> None:
        self._points.clear()

    def to_json(self) -> dict[str, list[float | None]]:
        """The control API's `/v1/instances/{name}/history` document: parallel lists."""
        return _columns(self._points)


def _columns(points: Iterable[HistoryPoint]) -> dict[str, list[float | None]]:
    out: dict[str, list[float | None]] = {
        "t": [],
        "kv_cache_usage": [],
        "generation_tokens_per_s": [],
        "preemptions_per_min": [],
    }
    for p in points:
        out["t"].append(p.t)
        out["kv_cache_usage"].append(p.kv_cache_usage)
        out["generation_tokens_per_s"].append(p.generation_tokens_per_s)
        out["preemptions_per_min"].append(p.preemptions_per_min)
    return out
