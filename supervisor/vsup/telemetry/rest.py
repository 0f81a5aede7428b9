"""Whether an instance is at rest: nothing in flight and nothing moving, so asking it every
second tells nothing new.

The daemon scrapes each live instance once a poll (/health, /load and /metrics on one
connection). An instance at rest is asked only every `rest_interval_s` instead
(control/monitor.py), which is most of what a supervisor of a packed node spends: most replicas
wait for work most of the time. At rest, from its figures alone, means its last
`QUIET_SCRAPES` good scrapes in a row all showed:
- no request in flight: `/load` 0 where it is read, and every engine's running + waiting 0;
- no figure moving: token, finished-request and preemption counters, KV usage and the sleep
  state the same as the scrape before (a sleeping engine's frozen figures are at rest);
- no sleep or wake call in flight at the server, and vLLM's figures there at all (a server
  without them, `--disable-log-stats`, cannot say it is idle: never at rest).
A failed scrape (or a /health answer other than 200 with it), or any scrape that shows
something moving, ends the rest at once, so the next poll asks it again. What is not in the
figures (a transition: a start, stop, drain, sleep or wake by vsup, a rolling apply, a bench)
is the daemon's to say (`Target.rest_s`).

Pure: fed each scrape's result by InstanceTelemetry.observe.
"""

from __future__ import annotations

from vsup.telemetry.metrics import VllmMetrics

# good scrapes in a row that showed nothing in flight or moving before an instance rests
QUIET_SCRAPES = 3
# how often an instance at rest is asked (the layout's `rest_interval_s` default)
DEFAULT_REST_INTERVAL_S = 3.0

_Signature = tuple[object, ...]


def _signature(m: VllmMetrics) -> _Signature:
    """The figures that move when a server works, per engine and for the server."""
    engines = tuple(
        (
            name,
            f.prompt_tokens_total,
            f.generation_tokens_total,
            f.request_success_total,
            f.kv_cache_usage,
            f.sleeping,
        )
        for name, f in m.per_engine.items()
    )
    return (
        engines,
        m.prompt_tokens_total,
        m.generation_tokens_total,
        m.request_success_total,
        m.preemptions_total,
        m.kv_cache_usage,
        m.sleeping,
        m.sleep_level,
        m.process_start_time_s,
    )


def _in_flight(m: VllmMetrics, server_load: int | None) -> bool:
    """Any request or sleep/wake call in flight, or no way to tell (no request gauges)."""
    if server_load:
        return True
    if m.sleeps_in_flight or m.wakes_in_flight:
        return True
    if not m.vllm_seen or m.requests_running is None:
        return True
    if m.requests_running or m.requests_waiting:
        return True
    return any(f.busy for f in m.per_engine.values())


class RestWatch:
    """One instance's quiet scrapes in a row (see the module doc)."""

    def __init__(self, quiet_scrapes: int = QUIET_SCRAPES) -> None:
        self.quiet_scrapes = quiet_scrapes
        self.quiet = 0  # good scrapes in a row with nothing in flight or moving
        self._last: _Signature | None = None

    def clear(self) -> None:
        """A new run, or the process stopped: nothing known."""
        self.quiet = 0
        self._last = None

    def observe(self, ok: bool, metrics: VllmMetrics | None, server_load: int | None) -> None:
        """One scrape: `ok` with its figures and `/load` count (None where not read)."""
        if not ok or metrics is None:
            self.clear()
            return
        sig = _signature(metrics)
        moved = self._last is None or sig != self._last
        self._last = sig
        if moved or _in_flight(metrics, server_load):
            self.quiet = 0
        else:
            self.quiet += 1

    @property
    def at_rest(self) -> bool:
        return self.quiet >= self.quiet_scrapes
