"""The daemon's telemetry loop: /metrics scrapes, log watchers and the GPU probe.

Per instance, telemetry's `InstanceTelemetry` keeps the figures, rates, history, backend and
log tail; this module decides when each is fed. Each poll starts one scrape per live instance
that has none in flight and waits for them only up to half the poll interval: a slow or wedged
server keeps its scrape running in the background (bounded by the scraper's timeout) while the
others' figures are used at once, so one instance never delays the rest, and never the API
(everything here is async or runs in a worker thread). Plain-http servers (every vLLM vsup
starts) are scraped together by one worker thread per poll (telemetry/batch.py: a selector
over kept-alive sockets, the pages parsed there), whose finished results come back to the
loop in a few batches; other URLs get a task each (`Scraper.scrape`). Figures older than telemetry's
`STALE_AFTER_S` read as unknown.

An instance at rest (telemetry/rest.py: nothing in flight, nothing moving over its last
scrapes) whose target allows it (`Target.rest_s` > 0: the daemon says no transition is under
way) is scraped only every `rest_s` instead of every poll; the engine is told
(`on_rest`) so that its health loop does not ask /health itself in the seconds between. The
first scrape that shows anything moving, or a target that no longer allows it, puts it back
on every poll.

Nobody watching: while no status request came for `WATCH_S` (no dashboard, no `vsup status`
loop, no fleet view), a busy instance whose target allows a slower pace (`rest_s` > 0: no
transition under way) is scraped every `UNWATCHED_S` instead of every poll, its /health with
it (the engine is told, as for a rest): the pace of a rest (`rest_interval_s`, 3 s by default;
`UNWATCHED_S` at most), so that while nobody looks every instance is read at one pace, busy or
idle. What reads the figures then is the daemon's own judgement: stalls, alerts and idle
sleep, which count in tens of seconds, and rates taken over whatever time passed between two
scrapes. The first status request puts every instance back on every poll, from the poll after
it; a transition does at once. A busy replica's scrapes while nobody looks are a third (the
daemon's CPU at 64 busy instances x0.6: docs/benchmarks.md, 2026-12-07); `rest_interval_s = 0`
in a layout keeps its instances on every poll.

Stall detection's I/O is here too: a scrape of an instance started with vLLM's load tracking
also reads `/load`, and an idle `ready` instance whose `canary_interval_s` is set gets one
`max_tokens = 1` request that often (data parallel: each rank in turn), bounded by its
`stall_after_s`; telemetry/stall.py judges what they show.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from vsup.clock import Clock, iso_utc
from vsup.engine.memory import GpuMemory, Holder
from vsup.snapshot import GpuStatus
from vsup.telemetry.batch import Job, ScrapeBatch, batch_for
from vsup.telemetry.gpu.base import GpuProbe, GpuSample
from vsup.telemetry.hbm import (
    Attribution,
    HbmFigure,
    InstanceRef,
    ProcessTable,
    attribute,
    gpu_statuses,
)
from vsup.telemetry.instance import InstanceTelemetry
from vsup.telemetry.metrics import VllmMetrics
from vsup.telemetry.scrape import CanaryOutcome, Scraper, ScrapeResult
from vsup.telemetry.stall import StallView

log = logging.getLogger("vsup.monitor")
# How often the release check re-reads the GPUs while a dead instance's memory is still listed.
GPU_RELEASE_POLL_S = 0.1

SCRAPE_TIMEOUT_S = 5.0
# Nobody watching (the module's docstring): a status request counts as someone reading for this
# long (a dashboard asks every second, a fleet view every few), and while nobody does a busy
# instance is scraped this often (every poll where its `stall_after_s` is under 3 of these).
WATCH_S = 5.0
UNWATCHED_S = 3.0
# The keys of telemetry's fields() that describe a running server (blank when it is not live).
LIVE_KEYS = (
    "kv_cache_usage",
    "kv_capacity_tokens",
    "preemptions_total",
    "preemptions_per_min",
    "requests_running",
    "requests_waiting",
    "generation_tokens_per_s",
    "prompt_tokens_per_s",
    "prefix_cache_hit_rate",
    "requests_in_flight",
)


class StallFields(TypedDict):
    """The InstanceStatus keys of stall detection (`Monitor.stall_fields`)."""

    stalled: bool | None
    stalled_since: str | None
    stalled_for_s: float | None
    stall_evidence: str | None
    stalled_ranks: tuple[int, ...]


NO_STALL_FIELDS = StallFields(
    stalled=None, stalled_since=None, stalled_for_s=None, stall_evidence=None, stalled_ranks=()
)


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
    ready: bool = False  # /health answers 200 (a canary goes only to a ready server)
    load_tracking: bool = False  # started with --enable-server-load-tracking: read /load
    canary_interval_s: float = 0.0  # 0: no canary
    stall_after_s: float = 0.0  # a canary's deadline
    dp_ranks: int = 1  # data-parallel ranks (engines) behind the API server
    canary_headers: tuple[tuple[str, str], ...] = ()  # e.g. the API key, for /v1 routes
    # at rest (telemetry/rest.py), scraped only this often; 0: every poll (a transition, or
    # the layout's rest_interval_s = 0)
    rest_s: float = 0.0


class Monitor:
    """Telemetry of every instance, fed by `poll()`; read with `fields()` and friends."""

    def __init__(
        self, clock: Clock, poll_interval: float = 1.0, probe: GpuProbe | None = None
    ) -> None:
        self.clock = clock
        self.poll_interval = poll_interval
        self.probe = probe  # a telemetry.gpu probe; `open()` opens one when None
        self.scraper: Scraper | None = None
        self.gpus: tuple[GpuStatus, ...] = ()
        self._tel: dict[str, InstanceTelemetry] = {}
        self._runs: dict[str, int] = {}
        self._live: dict[str, bool] = {}
        self._hbm: dict[str, HbmFigure] = {}
        self._inflight: dict[str, asyncio.Task[None]] = {}
        # plain-http servers' scrapes: one worker thread per poll (telemetry/batch.py)
        self._batch: ScrapeBatch | None = None
        self._dropped: list[str] = []  # forgotten names whose batch exchange is abandoned
        self._canaries: dict[str, asyncio.Task[None]] = {}
        self._tracking: dict[str, bool] = {}
        self._unresolved: set[tuple[int, int]] = set()
        self._gpu_refs: list[InstanceRef] = []  # the last GPU poll's instances (hbm_now)
        # Told `(name, run, status)` of each `/health` a scrape asked with its /metrics (on
        # the same connection, pipelined): the engine takes it for its own check that second
        # (engine/runner.py). None: scrapes do not ask /health.
        # None for a status: a scrape that asked /health got no answer (the engine's loop
        # then asks itself at once).
        self.on_health: Callable[[str, int, int | None], None] | None = None
        # Told `(name, run, window_s)` when an instance starts or ends a rest: while resting,
        # its health loop takes an answer up to `window_s` old as current (the scrapes, with
        # their /health, come every rest_s); 0: every second again. None: nobody is told.
        self.on_rest: Callable[[str, int, float], None] | None = None
        self._jobs: dict[str, Job[Target]] = {}  # name -> its latest batch job
        self._asked: dict[str, float] = {}  # name -> when its latest scrape was started
        self._rest_told: dict[str, float] = {}  # name -> the window `on_rest` was last told
        self._read_at = -WATCH_S  # when a status request last came (`read`)

    def read(self) -> None:
        """Someone reads the figures (a status request): every busy instance is scraped every
        poll for the next `WATCH_S`."""
        self._read_at = self.clock.monotonic()

    async def open(self) -> None:
        """Open the GPU probe (NVML init can take a moment: in a thread) and the scraper."""
        if self.probe is None:
            from vsup.telemetry.gpu import open_probe

            self.probe = await asyncio.to_thread(open_probe, "auto")
        if self.scraper is None:
            self.scraper = Scraper(timeout_s=SCRAPE_TIMEOUT_S)
        if self._batch is None:
            self._batch = batch_for(self.scraper)

    async def close(self) -> None:
        for task in [*self._inflight.values(), *self._canaries.values()]:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._batch is not None:
            await self._batch.aclose()
        if self.scraper is not None:
            await self.scraper.aclose()
        if self.probe is not None:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self.probe.close)

    @property
    def vendor(self) -> str:
        return self.probe.vendor if self.probe is not None else "none"

    @property
    def gpu_count(self) -> int:
        return int(self.probe.count or 0) if self.probe is not None else 0

    # ----------------------------------------------------------------- reading

    def fields(self, name: str, live: bool) -> dict[str, object]:
        """The InstanceStatus keys telemetry owns (values of those keys' types); server
        figures only while `live`. `load_tracking`: whether vsup reads the instance's /load
        (None while it does not run)."""
        tel = self._tel.get(name)
        hbm = self._hbm.get(name)
        if tel is None:
            out: dict[str, object] = {}
            if hbm is not None:
                out.update(hbm_bytes=hbm.bytes, hbm_source=hbm.source)
            return out
        out = dict(tel.fields(hbm))
        out["load_tracking"] = self._tracking.get(name) if live else None
        if not live:
            out.update({k: None for k in LIVE_KEYS})
        return out

    def stall_view(self, name: str, ready: bool, stall_after_s: float | None) -> StallView | None:
        """Stall detection's verdict (telemetry/stall.py), judged only while the instance is
        `ready` (its /health answers 200); None otherwise."""
        tel = self._tel.get(name)
        return tel.stall_view(stall_after_s) if tel is not None and ready else None

    def stall_fields(self, name: str, ready: bool, stall_after_s: float | None) -> StallFields:
        """The InstanceStatus stall keys (`stall_view`); unknown when it cannot tell."""
        view = self.stall_view(name, ready, stall_after_s)
        if view is None or view.stalled is None:
            return NO_STALL_FIELDS
        return StallFields(
            stalled=view.stalled,
            stalled_since=iso_utc(view.since_wall) if view.since_wall is not None else None,
            stalled_for_s=round(view.for_s, 1) if view.for_s is not None else None,
            stall_evidence=str(view.evidence) if view.evidence is not None else None,
            stalled_ranks=view.ranks,
        )

    def metrics(self, name: str) -> VllmMetrics | None:
        tel = self._tel.get(name)
        return tel.metrics if tel is not None else None

    def cache_config(self, name: str) -> dict[str, str] | None:
        tel = self._tel.get(name)
        return tel.cache_config if tel is not None else None

    def kv_peak(self, name: str, window_s: float) -> float | None:
        """The highest KV-cache usage scraped from `name` in the last `window_s` seconds."""
        tel = self._tel.get(name)
        return tel.history.kv_peak(window_s) if tel is not None else None

    def history_json(self, name: str) -> dict[str, list[float | None]]:
        tel = self._tel.get(name)
        if tel is None:
            return {
                "t": [],
                "kv_cache_usage": [],
                "generation_tokens_per_s": [],
                "preemptions_per_min": [],
            }
        return tel.history_json()

    # ----------------------------------------------------------------- polling

    async def poll(self, targets: Iterable[Target]) -> None:
        """One poll of every target (see the module doc for what waits on what)."""
        targets = list(targets)
        names = {t.name for t in targets}
        for name in list(self._tel):
            if name not in names:
                self._forget(name)
        for t in targets:
            tel = self._tel.get(t.name)
            if tel is None:
                tel = self._tel[t.name] = InstanceTelemetry(
                    self.clock,
                    attention_backend=t.attention_flag,
                    platform="cpu" if not t.gpus else None,
                )
            if t.run and self._runs.get(t.name) != t.run:
                # A new process: follow its log from the start (the backend line is there).
                self._runs[t.name] = t.run
                tel.start_run(t.run, t.log_path)
                canary = self._canaries.pop(t.name, None)
                if canary is not None:
                    canary.cancel()  # the old run's: it says nothing of this one
                self._asked.pop(t.name, None)
                self._rest_told.pop(t.name, None)  # a new run's lifecycle rests not
            if self._live.get(t.name) and not t.live:
                tel.stopped()
            self._live[t.name] = t.live
            self._tracking[t.name] = t.load_tracking
        started: list[asyncio.Future[None]] = []
        jobs: list[Job[Target]] = []
        batch = self._batch
        now = self.clock.monotonic()
        watched = now - self._read_at < WATCH_S
        for t in targets:
            if not t.live and self._rest_told.get(t.name) and self.on_rest is not None:
                self._rest_told[t.name] = 0.0
                self.on_rest(t.name, t.run, 0.0)
            if not t.live or t.name in self._inflight or self.scraper is None:
                continue
            if self._skipped(t, now, watched):
                continue
            self._asked[t.name] = now
            if batch is not None and t.base_url.startswith("http://"):
                job = self._jobs.get(t.name)
                with_health = self.on_health is not None
                # the same target as the last poll's (daemon.py keeps it): the same job
                if job is None or job.key is not t or job.with_health != with_health:
                    job = self._jobs[t.name] = Job(
                        t.name, t, t.base_url, with_load=t.load_tracking, with_health=with_health
                    )
                jobs.append(job)
                continue
            task = asyncio.create_task(self._scrape(t), name=f"scrape {t.name}")
            self._inflight[t.name] = task
            task.add_done_callback(functools.partial(self._scrape_done, t.name))
            started.append(task)
        wait_s = max(0.1, 0.5 * self.poll_interval)
        if batch is not None and (jobs or self._dropped or batch.busy):
            dropped, self._dropped = self._dropped, []
            started.append(asyncio.ensure_future(batch.run(jobs, wait_s, self._scraped, dropped)))
        self._start_canaries(targets)
        side = [
            asyncio.create_task(self._poll_logs()),
            asyncio.create_task(self._poll_gpus(targets)),
        ]
        if started:
            await asyncio.wait(started, timeout=wait_s)
        for result in await asyncio.gather(*side, return_exceptions=True):
            if isinstance(result, Exception):
                log.error("telemetry poll failed", exc_info=result)

    def _every_s(self, t: Target, watched: bool) -> float:
        """How often `t` is scraped: 0 every poll; its `rest_s` at rest; `UNWATCHED_S` while
        busy and nobody watches, unless its `stall_after_s` is under 3 of those. Only a target
        that allows a slower pace (`rest_s` > 0: no transition) gets one."""
        if t.rest_s <= 0:
            return 0.0
        tel = self._tel.get(t.name)
        if tel is None:
            return 0.0
        if tel.rest.at_rest:
            return t.rest_s
        if watched:
            return 0.0
        if 0 < t.stall_after_s < 3 * UNWATCHED_S:
            return 0.0  # a stall window that short wants a scrape every poll
        every = min(UNWATCHED_S, t.rest_s)
        return every if every > self.poll_interval else 0.0

    def _skipped(self, t: Target, now: float, watched: bool) -> bool:
        """Whether `t` was asked less than its pace (`_every_s`) ago: no scrape this poll.
        Tells the engine when a slower pace begins, changes or ends."""
        every = self._every_s(t, watched)
        # the scrapes' health answers come every `every`, taken by a health loop that ticks
        # each second: an answer is current for that long and a poll and a half more
        window = every + 1.5 * self.poll_interval if every > 0 else 0.0
        if self._rest_told.get(t.name, 0.0) != window and self.on_rest is not None:
            self._rest_told[t.name] = window
            self.on_rest(t.name, t.run, window)
        if every <= 0:
            return False
        asked = self._asked.get(t.name)
        # polls come every poll_interval, not to the microsecond: half of one is slack
        return asked is not None and now - asked + 0.5 * self.poll_interval < every

    def _scrape_done(self, name: str, _task: asyncio.Task[None]) -> None:
        self._inflight.pop(name, None)

    async def _scrape(self, t: Target) -> None:
        assert self.scraper is not None
        result = await self.scraper.scrape(
            t.base_url, with_load=t.load_tracking, with_health=self.on_health is not None
        )
        self._take(t, result)

    def _scraped(self, results: list[tuple[Job[Target], ScrapeResult]]) -> None:
        """The batch's finished scrapes (on the event loop)."""
        for job, result in results:
            self._take(job.key, result)

    def _take(self, t: Target, result: ScrapeResult) -> None:
        """One scrape's result to the instance's telemetry (and its /health to the engine)."""
        tel = self._tel.get(t.name)
        if tel is None or self._runs.get(t.name) != t.run:
            return  # forgotten, or restarted while this scrape was in flight
        if self.on_health is not None:
            self.on_health(t.name, t.run, result.health_status)
        tel.observe(result)

    def _start_canaries(self, targets: list[Target]) -> None:
        """A canary for each ready, idle instance that is owed one (`canary_interval_s`)."""
        if self.scraper is None:
            return
        for t in targets:
            tel = self._tel.get(t.name)
            if (
                tel is None
                or not t.ready
                or t.stall_after_s <= 0
                or t.name in self._canaries
                or not tel.canary_due(t.canary_interval_s)
            ):
                continue
            task = asyncio.create_task(self._canary(t, tel), name=f"canary {t.name}")
            self._canaries[t.name] = task
            task.add_done_callback(functools.partial(self._canary_done, t.name))

    def _canary_done(self, name: str, task: asyncio.Task[None]) -> None:
        if self._canaries.get(name) is task:
            del self._canaries[name]

    async def _canary(self, t: Target, tel: InstanceTelemetry) -> None:
        assert self.scraper is not None
        sent = tel.canary_sent()
        headers = dict(t.canary_headers)
        rank: int | None = None
        if t.dp_ranks > 1:
            rank = tel.canary_rank % t.dp_ranks
            tel.canary_rank = rank + 1
        result = None
        refused_before = tel.canary_error
        try:
            if tel.canary_model is None:
                tel.canary_model = await self.scraper.served_model(t.base_url, headers=headers)
            if tel.canary_model is not None:
                result = await self.scraper.canary(
                    t.base_url, tel.canary_model, t.stall_after_s, rank=rank, headers=headers
                )
        finally:
            if self._tel.get(t.name) is tel and self._runs.get(t.name) == t.run:
                tel.canary_done(result, str(rank) if rank is not None else None, sent)
        if result is None:
            return
        if result.outcome == CanaryOutcome.TIMED_OUT:
            log.warning("%s: canary got no answer: %s", t.name, result.error)
        elif tel.canary_error is not None and tel.canary_error != refused_before:
            log.warning("%s: canary failed (no stall verdict from it): %s", t.name, result.error)

    async def _poll_logs(self) -> None:
        """New log lines of every run (backend, tail for exits): file reads, in one thread."""
        tels = [tel for tel in self._tel.values() if tel.watcher is not None]
        if tels:
            await asyncio.to_thread(lambda: [tel.poll_log() for tel in tels])

    async def _poll_gpus(self, targets: list[Target]) -> None:
        """GPU samples, per-instance HBM and foreign processes (in a thread: driver calls and
        a /proc scan). Nodes without GPUs skip it entirely."""
        if not self.gpu_count:
            return
        refs = [InstanceRef(t.name, t.pid, t.gpus, t.pgid) for t in targets if t.pid]

        probe = self.probe
        assert probe is not None

        def work() -> tuple[tuple[GpuSample, ...], Attribution]:
            samples = probe.snapshot()
            return samples, attribute(refs, samples, ProcessTable.scan())

        self._gpu_refs = refs
        samples, attribution = await asyncio.to_thread(work)
        self.gpus = gpu_statuses(samples, attribution)
        self._hbm = dict(attribution.instances)
        # pids the GPU lists that this node's process table lacks (another pid namespace)
        self._unresolved = {(u.gpu, u.pid) for u in attribution.unresolved}

    async def gpu_released(self, pids: frozenset[int], gpus: tuple[int, ...]) -> bool:
        """Wait until none of `pids` holds memory on `gpus` (the engine asks after an exit,
        before the instance or a co-tenant may start there, and bounds the wait). A killed
        process's memory stays listed until the driver has torn its context down, so this
        polls NVML/amdsmi rather than answering from one sample. Without per-process figures
        it cannot tell, and says released rather than block the GPU forever."""
        probe = self.probe
        if probe is None or not self.gpu_count or not gpus:
            return True
        while True:
            try:
                samples = await asyncio.to_thread(probe.snapshot)
            except Exception:
                log.exception("GPU probe failed")
                return True
            held = [
                p.pid
                for sample in samples
                if sample.index in gpus and sample.per_process_supported
                for p in sample.processes
                if p.pid in pids
            ]
            if not held:
                return True
            await asyncio.sleep(GPU_RELEASE_POLL_S)

    async def hbm_now(self, ref: InstanceRef) -> int | None:
        """What instance `ref` holds on its GPUs, read from the driver now rather than the
        last poll's sample (a sleep awaiting its release reads it every few tens of ms:
        engine/sleep.py); the other instances of the last poll are counted as co-tenants.
        None: no GPU, or the figures do not tell."""
        probe = self.probe
        if probe is None or not self.gpu_count or not ref.gpus:
            return None
        refs = [r for r in self._gpu_refs if r.name != ref.name] + [ref]

        def work() -> Attribution:
            return attribute(refs, probe.snapshot(), ProcessTable.scan())

        figure = (await asyncio.to_thread(work)).instances.get(ref.name)
        return figure.bytes if figure is not None else None

    async def gpu_memory_now(self, gpus: tuple[int, ...]) -> list[GpuMemory] | None:
        """`gpu_memory`, read from the driver now (a wake that evicts by memory reads the
        free memory after each sleep: engine/sleep.py)."""
        probe = self.probe
        if probe is None or not self.gpu_count or not gpus:
            return None
        refs = list(self._gpu_refs)

        def work() -> tuple[tuple[GpuSample, ...], Attribution]:
            samples = probe.snapshot()
            return samples, attribute(refs, samples, ProcessTable.scan())

        samples, attribution = await asyncio.to_thread(work)
        by_index = {g.index: g for g in gpu_statuses(samples, attribution)}
        unresolved = {(u.gpu, u.pid) for u in attribution.unresolved}
        return _memory_of(gpus, by_index, unresolved)

    def gpu_memory(self, gpus: tuple[int, ...]) -> list[GpuMemory] | None:
        """The GPUs' memory and who holds it, as of the last poll (the engine's
        `gpu_memory` view: engine/memory.py); None when a GPU has no figures."""
        return _memory_of(gpus, {g.index: g for g in self.gpus}, self._unresolved)

    def _forget(self, name: str) -> None:
        self._tel.pop(name, None)
        self._runs.pop(name, None)
        self._live.pop(name, None)
        self._hbm.pop(name, None)
        self._tracking.pop(name, None)
        self._asked.pop(name, None)
        self._rest_told.pop(name, None)
        self._jobs.pop(name, None)
        if self._batch is not None:
            self._dropped.append(name)
        for tasks in (self._inflight, self._canaries):
            task = tasks.pop(name, None)
            if task is not None:
                task.cancel()


def _memory_of(
    gpus: tuple[int, ...], by_index: Mapping[int, GpuStatus], unresolved: set[tuple[int, int]]
) -> list[GpuMemory] | None:
    """The engine's view (memory.GpuMemory) of `gpus`; None when one has no figures."""
    out = []
    for index in gpus:
        g = by_index.get(index)
        if g is None or g.hbm_total_bytes is None or g.hbm_used_bytes is None:
            return None
        holders = tuple(
            Holder(p.pid, p.hbm_bytes, p.instance, (index, p.pid) not in unresolved)
            for p in g.processes
        )
        out.append(GpuMemory(index, g.hbm_total_bytes, g.hbm_used_bytes, holders))
    return out
