"""Everything telemetry keeps for one instance, behind the few calls the daemon makes.

```python
tel = InstanceTelemetry(clock, attention_backend=spec.arg("attention-backend"),
                        platform=None if spec.gpus else "cpu")
tel.start_run(run, log_path)            # each spawn (or adoption: pass the log offset)
await asyncio.to_thread(tel.poll_log)   # every poll: new log lines, backend, readiness hints
tel.observe(scrape_result)              # every scrape (ok or not)
tel.rest.at_rest                        # nothing in flight or moving: may be asked less often
status = status.with_wire(**tel.fields(hbm_figure))
tel.history_json()                      # GET /v1/instances/{name}/history
tel.stopped()                           # the instance stopped: nothing current to show
```
`fields()` also carries what vLLM's start-up log said about its memory (memprofile.py) and
`hbm_start_bytes`: the HBM the instance held when its log first said it serves (per-process
figures only), the baseline against which growth is judged (control/advice.py).

A failed scrape keeps the last good figures for `stale_after_s` (a blip does not blank the
dashboard), then they become unknown (a dead server's last KV usage is not its current one).
The history gets a point per scrape, with gaps (None) for failed ones.

Stall detection (stall.py) is fed each good scrape with its `/load` count, and the canary's
outcomes: `canary_due(interval_s)` says when an idle server is owed one, `canary_sent()` /
`canary_done(result, engine, sent)` bracket it (the I/O is the daemon's: control/monitor.py).
"""

from __future__ import annotations

import os
from typing import Any

from vsup.clock import Clock
from vsup.telemetry.backend import BackendInfo, resolve_backend
from vsup.telemetry.hbm import HbmFigure
from vsup.telemetry.logwatch import LogUpdate, LogWatcher
from vsup.telemetry.memprofile import EMPTY_FIELDS
from vsup.telemetry.metrics import VllmMetrics
from vsup.telemetry.rates import History, InstanceRates, Rates
from vsup.telemetry.rest import RestWatch
from vsup.telemetry.scrape import CanaryOutcome, CanaryResult, ScrapeResult
from vsup.telemetry.stall import StallView, StallWatch, Stamp
from vsup.telemetry.view import telemetry_fields

STALE_AFTER_S = 5.0


class InstanceTelemetry:
    def __init__(
        self,
        clock: Clock,
        *,
        attention_backend: object = None,
        platform: str | None = None,
        stale_after_s: float = STALE_AFTER_S,
        history: History | None = None,
    ) -> None:
        self._clock = clock
        self.attention_backend = attention_backend
        self.platform = platform
        self.stale_after_s = stale_after_s
        self.rates = InstanceRates(clock)
        self.history = history if history is not None else History()
        self.stall = StallWatch()
        self.rest = RestWatch()  # whether it may be asked less often (rest.py)
        self.watcher: LogWatcher | None = None
        self.run: int | None = None
        self._metrics: VllmMetrics | None = None
        self._metrics_at: float | None = None
        self._cache_config: dict[str, str] | None = None
        self._cache_config_of: object = None  # the scraped mapping `_cache_config` copies
        self._hbm_start: int | None = None
        self._server_load: int | None = None
        self.last_error: str | None = None
        self.canary_model: str | None = None  # this run's model id, for its canary requests
        self._canary_sent_at: float | None = None
        self._canary_in_flight = False
        self.canary_rank = 0  # data parallel: the rank the next canary goes to
        self.canary_error: str | None = None  # the last canary that failed (not a stall)

    def start_run(
        self, run: int, log_path: str | os.PathLike[str] | None, log_offset: int = 0
    ) -> None:
        """A new process of this instance: follow its log from `log_offset`; counters will
        restart, which the rates see through the run number."""
        self.run = run
        self.watcher = LogWatcher(log_path, offset=log_offset) if log_path is not None else None
        self._metrics = None
        self._metrics_at = None
        self._cache_config = None
        self._cache_config_of = None
        self._hbm_start = None
        self._server_load = None
        self.canary_model = None
        self._canary_sent_at = None
        self._canary_in_flight = False
        self.canary_error = None
        self.stall.clear()
        self.rest.clear()

    def poll_log(self) -> LogUpdate | None:
        """Read the log's new lines (blocking file I/O: call it from a worker thread)."""
        return self.watcher.poll() if self.watcher is not None else None

    def observe(self, result: ScrapeResult) -> None:
        """Take one scrape's result."""
        # the clock read once: the daemon takes a scrape of every instance each second
        now, wall = self._clock.monotonic(), self._clock.wall()
        rates: Rates | None = None
        if result.ok:
            self._metrics, self._metrics_at = result.metrics, now
            rates = self.rates.observe(result.metrics, run=self.run, t=now)
            self._server_load = result.server_load
            self.stall.observe(
                result.metrics,
                now,
                wall,
                server_load=result.server_load,
                load_failed=result.load_error is not None,
            )
            config = result.metrics.cache_config
            if config is not None and config is not self._cache_config_of:
                # a page of a known shape shares its shape's mapping: copied once per shape
                self._cache_config, self._cache_config_of = dict(config), config
            self.last_error = None
        else:
            self.last_error = result.error
        # a /health that is not 200 (503: the engine died) is a transition, whatever the figures
        healthy = result.health_status is None or result.health_status == 200
        self.rest.observe(result.ok and healthy, result.metrics, result.server_load)
        if rates is not None:  # figures of this very scrape: fresh, and their rates
            current: VllmMetrics | None = result.metrics
        else:
            current, rates = self.metrics, self.current_rates
        self.history.append(
            wall,
            current.kv_cache_usage if current else None,
            rates.generation_tokens_per_s,
            rates.preemptions_per_min,
        )

    def stopped(self) -> None:
        """The process is gone: no current figures, no rates (the history stays)."""
        self._metrics = None
        self._metrics_at = None
        self._server_load = None
        self.rates.clear()
        self.stall.clear()
        self.rest.clear()

    @property
    def metrics(self) -> VllmMetrics | None:
        """The latest good scrape, unless it is older than `stale_after_s`."""
        if self._metrics is None or self._metrics_at is None:
            return None
        if self._clock.monotonic() - self._metrics_at > self.stale_after_s:
            return None
        return self._metrics

    @property
    def server_load(self) -> int | None:
        """Requests in flight at the API server (`/load`) as of the latest good scrape, unless
        that is stale; None without load tracking."""
        return self._server_load if self.metrics is not None else None

    def stall_view(self, stall_after_s: float | None) -> StallView:
        """Whether this run has work and makes no progress (telemetry/stall.py)."""
        return self.stall.view(self._clock.monotonic(), stall_after_s, self.stale_after_s)

    def canary_due(self, interval_s: float) -> bool:
        """Whether an idle server is owed a canary now: fresh figures that show no work, none
        in flight, and `interval_s` since the last one was sent."""
        if interval_s <= 0 or self._canary_in_flight or self.metrics is None:
            return False
        if self.stall.idle is not True:
            return False
        last = self._canary_sent_at
        return last is None or self._clock.monotonic() - last >= interval_s

    def canary_sent(self) -> Stamp:
        """A canary leaves now; returns when (pass it to `canary_done`)."""
        self._canary_in_flight = True
        self._canary_sent_at = self._clock.monotonic()
        return Stamp(self._canary_sent_at, self._clock.wall())

    def canary_done(self, result: CanaryResult | None, engine: str | None, sent: Stamp) -> None:
        """A canary's outcome (None: it could not be sent, e.g. no model id yet). A timeout is
        a stall of `engine` from `sent`; an answer clears an earlier lost one; a failure is
        kept in `canary_error` and judges nothing."""
        self._canary_in_flight = False
        if result is None:
            return
        if result.outcome == CanaryOutcome.TIMED_OUT:
            self.stall.canary_lost(engine, sent.t, sent.wall)
        elif result.outcome == CanaryOutcome.ANSWERED:
            self.canary_error = None
            self.stall.canary_answered()
        else:
            self.canary_error = result.error

    @property
    def current_rates(self) -> Rates:
        if self.metrics is None:
            return Rates()
        return self.rates.rates(self._clock.monotonic())

    @property
    def backend(self) -> BackendInfo | None:
        if self.watcher is not None:
            return self.watcher.backend_info(self.attention_backend, self.platform)
        return resolve_backend(None, self.attention_backend, self.platform)

    @property
    def cache_config(self) -> dict[str, str] | None:
        """This run's `vllm:cache_config_info` labels, as last scraped (static per run)."""
        return self._cache_config

    @property
    def log_tail(self) -> str:
        """The last lines of this run's log, for exit classification."""
        return self.watcher.tail_text() if self.watcher is not None else ""

    def fields(self, hbm: HbmFigure | None = None) -> dict[str, Any]:
        """The `InstanceStatus` fields telemetry owns (see view.telemetry_fields), the memory
        figures of vLLM's start-up log and the HBM held once it served."""
        out = telemetry_fields(self.metrics, self.current_rates, self.backend, hbm)
        self._note_hbm(hbm)
        profile = self.watcher.memory.profile() if self.watcher is not None else None
        out.update(profile.fields() if profile is not None else EMPTY_FIELDS)
        out["hbm_start_bytes"] = self._hbm_start
        out["requests_in_flight"] = self.server_load
        return out

    def _note_hbm(self, hbm: HbmFigure | None) -> None:
        # The first per-process figure once the log says the server is up: vLLM has allocated
        # its KV cache and captured its CUDA graphs by then, so later growth is drift. A
        # per-device figure would count co-tenants and is no baseline.
        if (
            self._hbm_start is None
            and hbm is not None
            and hbm.bytes
            and hbm.source == "process"
            and self.watcher is not None
            and self.watcher.ready_logged
        ):
            self._hbm_start = hbm.bytes

    def history_json(self) -> dict[str, list[float | None]]:
        return self.history.to_json()
