"""The daemon's telemetry loop: /metrics scrapes, rates, log watchers and the GPU probe.

Each poll starts one scrape per live instance that has none in flight and waits for them only
up to a fraction of the poll interval: a slow or wedged server keeps its scrape running in the
background (bounded by the scraper's timeout) while the others' figures are used at once, so
one instance never delays the rest, and never the API (everything here is async or runs in a
worker thread). Figures older than `STALE_S` are reported unknown rather than stale.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from supervisor.clock import Clock
from supervisor.snapshot import GpuStatus
from supervisor.telemetry.hbm import InstanceRef, ProcessTable, attribute, gpu_statuses
from supervisor.telemetry.logwatch import LogWatcher
from supervisor.telemetry.metrics import VllmMetrics
from supervisor.telemetry.rates import InstanceRates
from supervisor.telemetry.scrape import Scraper, ScrapeResult

log = logging.getLogger("vsup.monitor")

SCRAPE_TIMEOUT_S = 5.0
STALE_S = 5.0  # figures older than this (monotonic seconds) are unknown


@dataclass(frozen=True)
class Target:
    """One instance as the monitor sees it this poll."""

    name: str
    base_url: str
    run: int
    pid: int | None
    pgid: int | None
    gpus: tuple[int, ...]
    live: bool  # ready or unhealthy: a server that answers /metrics
    log_path: Path | None
    attention_flag: object = None  # the spec's --attention-backend, if any


@dataclass
class InstanceTelemetry:
    """The latest telemetry of one instance (None = unknown)."""

    metrics: VllmMetrics | None = None
    scraped_at: float | None = None  # monotonic time of the last good scrape
    error: str | None = None
    generation_tokens_per_s: float | None = None
    prompt_tokens_per_s: float | None = None
    preemptions_per_min: float | None = None
    prefix_cache_hit_rate: float | None = None
    backend: str | None = None
    backend_source: str | None = None
    hbm_bytes: int | None = None
    hbm_source: str = "unavailable"


@dataclass
class _Watch:
    run: int
    path: Path
    watcher: LogWatcher
    flag: object = None


@dataclass
class Monitor:
    clock: Clock
    poll_interval: float = 1.0
    probe: object = None  # a telemetry.gpu probe; opened by `open()` when None
    scraper: Scraper | None = None
    tel: dict[str, InstanceTelemetry] = field(default_factory=dict)
    gpus: tuple[GpuStatus, ...] = ()
    _rates: dict[str, InstanceRates] = field(default_factory=dict)
    _runs: dict[str, int] = field(default_factory=dict)
    _inflight: dict[str, asyncio.Task] = field(default_factory=dict)
    _logs: dict[str, _Watch] = field(default_factory=dict)

    async def open(self) -> None:
        """Open the GPU probe (NVML init can take a moment: in a thread) and the scraper."""
        if self.probe is None:
            from supervisor.telemetry.gpu import open_probe

            self.probe = await asyncio.to_thread(open_probe, "auto")
        if self.scraper is None:
            self.scraper = Scraper(timeout_s=SCRAPE_TIMEOUT_S)

    async def close(self) -> None:
        for task in self._inflight.values():
            task.cancel()
        for task in list(self._inflight.values()):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self.scraper is not None:
            await self.scraper.aclose()
        if self.probe is not None:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self.probe.close)

    @property
    def vendor(self) -> str:
        return getattr(self.probe, "vendor", "none")

    @property
    def gpu_count(self) -> int:
        return int(getattr(self.probe, "count", 0) or 0)

    def get(self, name: str) -> InstanceTelemetry:
        """The instance's telemetry; metric figures of a stale scrape are dropped."""
        tel = self.tel.get(name)
        if tel is None:
            return InstanceTelemetry()
        if tel.scraped_at is None or self.clock.monotonic() - tel.scraped_at > STALE_S:
            return InstanceTelemetry(
                backend=tel.backend, backend_source=tel.backend_source,
                hbm_bytes=tel.hbm_bytes, hbm_source=tel.hbm_source, error=tel.error,
            )
        return tel

    async def poll(self, targets: Iterable[Target]) -> None:
        """One poll of every target (see the module doc for what waits on what)."""
        targets = list(targets)
        names = {t.name for t in targets}
        for name in list(self.tel):
            if name not in names:
                self._forget(name)
        for t in targets:
            if self._runs.get(t.name) != t.run:
                # A new process: nothing of the old one may pass for it.
                self._runs[t.name] = t.run
                old = self.tel.get(t.name)
                self.tel[t.name] = InstanceTelemetry(
                    hbm_source=old.hbm_source if old else "unavailable"
                )
                if t.name in self._rates:
                    self._rates[t.name].clear()
        started = []
        for t in targets:
            if t.live and t.name not in self._inflight and self.scraper is not None:
                task = asyncio.create_task(self._scrape(t), name=f"scrape {t.name}")
                self._inflight[t.name] = task
                task.add_done_callback(lambda _t, n=t.name: self._inflight.pop(n, None))
                started.append(task)
        side = [asyncio.create_task(self._poll_logs(targets)), asyncio.create_task(self._poll_gpus(targets))]
        if started:
            await asyncio.wait(started, timeout=max(0.1, 0.5 * self.poll_interval))
        await asyncio.gather(*side, return_exceptions=True)

    async def _scrape(self, t: Target) -> None:
        assert self.scraper is not None
        result: ScrapeResult = await self.scraper.scrape(t.base_url)
        if self._runs.get(t.name) != t.run:
            return  # the instance restarted while this scrape was in flight
        tel = self.tel.setdefault(t.name, InstanceTelemetry())
        if not result.ok:
            tel.error = result.error
            return
        now = self.clock.monotonic()
        rates = self._rates.setdefault(t.name, InstanceRates(self.clock)).observe(
            result.metrics, run=t.run, t=now
        )
        tel.metrics = result.metrics
        tel.scraped_at = now
        tel.error = None
        tel.generation_tokens_per_s = rates.generation_tokens_per_s
        tel.prompt_tokens_per_s = rates.prompt_tokens_per_s
        tel.preemptions_per_min = rates.preemptions_per_min
        tel.prefix_cache_hit_rate = rates.prefix_cache_hit_rate

    async def _poll_logs(self, targets: list[Target]) -> None:
        """Follow each run's log for the attention backend (in a thread: file reads)."""
        for t in targets:
            w = self._logs.get(t.name)
            if t.log_path is None:
                continue
            if w is None or w.run != t.run or w.path != t.log_path:
                self._logs[t.name] = _Watch(t.run, t.log_path, LogWatcher(t.log_path), t.attention_flag)
        watches = [(name, w) for name, w in self._logs.items() if w.watcher.backend.name is None]
        if not watches:
            return
        await asyncio.to_thread(lambda: [w.watcher.poll() for _n, w in watches])
        for name, w in watches:
            info = w.watcher.backend_info(flag=w.flag)
            tel = self.tel.setdefault(name, InstanceTelemetry())
            tel.backend = info.name if info else None
            tel.backend_source = info.source if info else None

    async def _poll_gpus(self, targets: list[Target]) -> None:
        """GPU samples, per-instance HBM and foreign processes (in a thread: driver calls and
        a /proc scan). Nodes without GPUs skip it entirely."""
        if not self.gpu_count:
            return
        refs = [InstanceRef(t.name, t.pid, t.gpus, t.pgid) for t in targets if t.pid]

        def work():
            samples = self.probe.snapshot()
            attribution = attribute(refs, samples, ProcessTable.scan())
            return samples, attribution

        try:
            samples, attribution = await asyncio.to_thread(work)
        except Exception:
            log.exception("GPU probe failed")
            return
        self.gpus = gpu_statuses(samples, attribution)
        for t in targets:
            tel = self.tel.setdefault(t.name, InstanceTelemetry())
            fig = attribution.instances.get(t.name)
            tel.hbm_bytes = fig.bytes if fig else None
            tel.hbm_source = fig.source if fig else "unavailable"

    async def gpu_released(self, pids: frozenset[int], gpus: tuple[int, ...]) -> bool:
        """Whether none of `pids` holds memory on `gpus` any more (the engine asks after an
        exit, before a co-tenant may start). Without per-process figures it cannot tell, and
        says released rather than block the GPU forever."""
        if not self.gpu_count or not gpus:
            return True
        try:
            samples = await asyncio.to_thread(self.probe.snapshot)
        except Exception:
            log.exception("GPU probe failed")
            return True
        for sample in samples:
            if sample.index in gpus and sample.per_process_supported:
                if any(p.pid in pids for p in sample.processes):
                    return False
        return True

    def _forget(self, name: str) -> None:
        self.tel.pop(name, None)
        self._rates.pop(name, None)
        self._runs.pop(name, None)
        self._logs.pop(name, None)
        task = self._inflight.pop(name, None)
        if task is not None:
            task.cancel()
