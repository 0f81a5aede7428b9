"""Prometheus export: the daemon's snapshot as `vsup_*` series, on an opt-in listener.

A layout opts in with `[layout] metrics_listen = "127.0.0.1:9400"`. The daemon then serves
`GET /metrics` there (its own small HTTP listener on the daemon's event loop); the exposition
is rendered once per snapshot, in a worker thread, and every scrape until the next snapshot
gets the same bytes (`MetricsListener.exposition`). Values come from the latest snapshot
only: an unknown value is left out, never exported as a made-up number. The instance label is
`name`, because Prometheus itself sets `instance` to the scrape target.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from vsup.layout.listen import parse_listen
from vsup.snapshot import ROLLOUT_STATES, STATES, THROTTLE_REASONS, WAIT_KINDS, StatusSnapshot
from vsup.states import RolloutState, SleepState, State

if TYPE_CHECKING:
    from vsup.control.server import ServedApp

log = logging.getLogger(__name__)

SLEEP_STATES = tuple(s.value for s in SleepState)


class SnapshotCollector:
    """A prometheus_client collector that renders whatever snapshot `source()` returns."""

    def __init__(self, source: Callable[[], StatusSnapshot | None]) -> None:
        self._source = source

    def describe(self) -> list[Metric]:
        # Registering must not call source(): the daemon may not have a snapshot yet.
        return []

    def collect(self) -> Iterator[Metric]:
        snap = self._source()
        if snap is None:
            return
        yield from snapshot_metrics(snap)


def snapshot_metrics(snap: StatusSnapshot) -> Iterator[Metric]:
    """Every vsup_* metric family for one snapshot."""
    host = snap.node.hostname
    sup = GaugeMetricFamily(
        "vsup_supervisor_info", "The vsup daemon (value 1)", labels=["version", "layout", "node"]
    )
    sup.add_metric([snap.supervisor.version, snap.supervisor.layout or "", host], 1)
    yield sup
    uptime = GaugeMetricFamily("vsup_supervisor_uptime_seconds", "Seconds since the daemon started")
    uptime.add_metric([], snap.supervisor.uptime_s)
    yield uptime

    labels = ["name"]
    info = GaugeMetricFamily(
        "vsup_instance_info",
        "One series per instance (value 1); model, backend and placement as labels",
        labels=["name", "model", "backend", "backend_name", "backend_source", "port", "gpus"],
    )
    state = GaugeMetricFamily(
        "vsup_instance_state",
        "1 for the instance's current state, 0 for the others",
        labels=["name", "state"],
    )
    up = GaugeMetricFamily("vsup_instance_up", "1 when the instance is ready", labels=labels)
    restarts = CounterMetricFamily(
        "vsup_instance_restarts", "Restarts vsup made after failures", labels=labels
    )
    gauges = {
        "hbm_bytes": GaugeMetricFamily(
            "vsup_instance_hbm_bytes", "GPU memory held by the instance's processes", labels=labels
        ),
        "planned_hbm_bytes": GaugeMetricFamily(
            "vsup_instance_planned_hbm_bytes",
            "gpu_memory_utilization x the memory of its GPUs",
            labels=labels,
        ),
        "kv_cache_usage": GaugeMetricFamily(
            "vsup_instance_kv_cache_usage_ratio", "KV cache in use (0-1)", labels=labels
        ),
        "kv_capacity_tokens": GaugeMetricFamily(
            "vsup_instance_kv_capacity_tokens", "Tokens the KV cache holds", labels=labels
        ),
        "requests_running": GaugeMetricFamily(
            "vsup_instance_requests_running", "Requests being decoded", labels=labels
        ),
        "requests_waiting": GaugeMetricFamily(
            "vsup_instance_requests_waiting", "Requests queued", labels=labels
        ),
        "requests_in_flight": GaugeMetricFamily(
            "vsup_instance_requests_in_flight",
            "Requests in flight at vLLM's API server (its /load; with load tracking only)",
            labels=labels,
        ),
        "generation_tokens_per_s": GaugeMetricFamily(
            "vsup_instance_generation_tokens_per_second",
            "Generated tokens per second",
            labels=labels,
        ),
        "prompt_tokens_per_s": GaugeMetricFamily(
            "vsup_instance_prompt_tokens_per_second", "Prompt tokens per second", labels=labels
        ),
        "preemptions_per_min": GaugeMetricFamily(
            "vsup_instance_preemptions_per_minute", "Preemptions per minute", labels=labels
        ),
        "uptime_s": GaugeMetricFamily(
            "vsup_instance_uptime_seconds", "Seconds since this run was spawned", labels=labels
        ),
        "stalled": GaugeMetricFamily(
            "vsup_instance_stalled",
            "1 while a ready instance has work and makes no progress (stall_after_s)",
            labels=labels,
        ),
        "stalled_for_s": GaugeMetricFamily(
            "vsup_instance_stalled_seconds",
            "Seconds a stalled instance has processed no token",
            labels=labels,
        ),
    }
    rank_stalled = GaugeMetricFamily(
        "vsup_instance_rank_stalled",
        "Data parallel: 1 for a rank with work and no progress (stall_after_s), 0 for the others",
        labels=["name", "rank"],
    )
    preemptions = CounterMetricFamily(
        "vsup_instance_preemptions",
        "vLLM's preemption counter (resets when the instance restarts)",
        labels=labels,
    )
    for inst in snap.instances:
        info.add_metric(
            [
                inst.name,
                inst.model or "",
                inst.backend or "",
                inst.backend_name or "",
                inst.backend_source or "",
                "" if inst.port is None else str(inst.port),
                ",".join(str(g) for g in inst.gpus),
            ],
            1,
        )
        for s in STATES:
            state.add_metric([inst.name, s], 1 if inst.state == s else 0)
        up.add_metric([inst.name], 1 if inst.is_ready else 0)
        restarts.add_metric([inst.name], inst.restarts)
        for key, fam in gauges.items():
            value = getattr(inst, key)
            if value is not None:
                fam.add_metric([inst.name], float(value))
        if inst.preemptions_total is not None:
            preemptions.add_metric([inst.name], float(inst.preemptions_total))
        if inst.stalled is not None:
            for r in inst.ranks:
                rank_stalled.add_metric(
                    [inst.name, str(r.rank)], 1 if r.rank in inst.stalled_ranks else 0
                )
    yield info
    yield state
    yield up
    yield restarts
    yield from gauges.values()
    yield rank_stalled
    yield preemptions

    glabels = ["gpu", "gpu_name"]
    gpu_fams = {
        "hbm_used_bytes": GaugeMetricFamily(
            "vsup_gpu_hbm_used_bytes", "HBM in use", labels=glabels
        ),
        "hbm_total_bytes": GaugeMetricFamily(
            "vsup_gpu_hbm_total_bytes", "HBM size", labels=glabels
        ),
        "util_pct": GaugeMetricFamily(
            "vsup_gpu_utilization_percent", "GPU busy percent", labels=glabels
        ),
        "temp_c": GaugeMetricFamily(
            "vsup_gpu_temperature_celsius", "GPU temperature", labels=glabels
        ),
        "power_w": GaugeMetricFamily("vsup_gpu_power_watts", "GPU power draw", labels=glabels),
    }
    foreign = GaugeMetricFamily(
        "vsup_gpu_foreign_processes", "Processes on the GPU that no instance owns", labels=glabels
    )
    for gpu in snap.gpus:
        lv = [str(gpu.index), gpu.name or ""]
        for key, fam in gpu_fams.items():
            value = getattr(gpu, key)
            if value is not None:
                fam.add_metric(lv, float(value))
        foreign.add_metric(lv, sum(1 for p in gpu.processes if p.instance is None))
    yield from gpu_fams.values()
    yield foreign
    yield from gpu_health_metrics(snap)

    advice = GaugeMetricFamily(
        "vsup_advice_active",
        "Live advice in force (value 1)",
        labels=["kind", "severity", "name", "gpu"],
    )
    for a in snap.advice:
        advice.add_metric(
            [a.kind, a.severity, a.instance or "", "" if a.gpu is None else str(a.gpu)], 1
        )
    yield advice
    yield from router_metrics(snap)
    yield from rollout_metrics(snap)
    yield from wait_metrics(snap)
    yield from sleep_metrics(snap)


def sleep_metrics(snap: StatusSnapshot) -> Iterator[Metric]:
    """Sleep mode (docs/sleep.md), for the instances that use it (none for the others):
    `vsup_instance_sleep_state{name,state}` 1 for its current SleepState, 0 for the others (a
    sleeper's `vsup_instance_state` stays `ready`); its level; how long the last sleep and wake
    took; what it keeps while asleep; seconds until idle sleep. Unknown values are left out."""
    state = GaugeMetricFamily(
        "vsup_instance_sleep_state",
        "Sleep mode: 1 for the instance's current sleep state (awake, falling_asleep, asleep, "
        "waking; unknown: adopted, the server has not said yet), 0 for the others",
        labels=["name", "state"],
    )
    level = GaugeMetricFamily(
        "vsup_instance_sleep_level",
        "Sleep mode: the level of the current or last sleep (1: weights in host RAM, 2: dropped)",
        labels=["name"],
    )
    gauges = {
        "since_s": GaugeMetricFamily(
            "vsup_instance_sleep_state_seconds",
            "Sleep mode: seconds in the current sleep state",
            labels=["name"],
        ),
        "last_sleep_s": GaugeMetricFamily(
            "vsup_instance_sleep_last_sleep_seconds",
            "Sleep mode: how long the last sleep took (until its memory was seen released)",
            labels=["name"],
        ),
        "last_wake_s": GaugeMetricFamily(
            "vsup_instance_sleep_last_wake_seconds",
            "Sleep mode: how long the last wake took (until the server answered again)",
            labels=["name"],
        ),
        "held_bytes": GaugeMetricFamily(
            "vsup_instance_sleep_held_bytes",
            "Sleep mode: GPU memory the instance keeps while asleep",
            labels=["name"],
        ),
        "idle_sleep_in_s": GaugeMetricFamily(
            "vsup_instance_sleep_idle_seconds_remaining",
            "Sleep mode: seconds until idle sleep (after_idle_s) puts the instance to sleep",
            labels=["name"],
        ),
    }
    failed = GaugeMetricFamily(
        "vsup_instance_sleep_failed",
        "Sleep mode: 1 while the last sleep or wake failed (status JSON sleep.error says why)",
        labels=["name"],
    )
    for inst in snap.instances:
        s = inst.sleep
        if s is None:
            continue
        for st in sorted(set(SLEEP_STATES) | {s.state}):
            state.add_metric([inst.name, st], 1 if s.state == st else 0)
        level.add_metric([inst.name], s.level)
        for key, fam in gauges.items():
            value = getattr(s, key)
            if value is not None:
                fam.add_metric([inst.name], float(value))
        failed.add_metric([inst.name], 1 if s.error else 0)
    yield state
    yield level
    yield from gauges.values()
    yield failed


def router_metrics(snap: StatusSnapshot) -> Iterator[Metric]:
    """`vsup_router_*`: the layout's vllm-router (nothing without one; unknown values left
    out). Shares are of the requests the router sent since it started."""
    router = snap.router
    if router is None:
        return
    labels = ["port"]
    port = str(router.port)
    state = GaugeMetricFamily(
        "vsup_router_state", "1 for the router's current state", labels=[*labels, "state"]
    )
    for s in STATES:
        state.add_metric([port, s], 1 if router.state == s else 0)
    up = GaugeMetricFamily("vsup_router_up", "1 when the router serves", labels=labels)
    up.add_metric([port], 1 if router.state == State.READY else 0)
    restarts = CounterMetricFamily(
        "vsup_router_restarts", "Automatic restarts of the router", labels=labels
    )
    restarts.add_metric([port], router.restarts or 0)
    gauges = {
        "requests_per_s": GaugeMetricFamily(
            "vsup_router_requests_per_second", "Requests the router took", labels=labels
        ),
        "errors_per_s": GaugeMetricFamily(
            "vsup_router_errors_per_second",
            "Requests the router answered with an error",
            labels=labels,
        ),
    }
    for key, fam in gauges.items():
        value = getattr(router, key)
        if value is not None:
            fam.add_metric([port], value)
    share = GaugeMetricFamily(
        "vsup_router_worker_share",
        "A member instance's fraction of the router's requests",
        labels=[*labels, "name"],
    )
    member = GaugeMetricFamily(
        "vsup_router_worker_in_router",
        "1 when the instance is in the router's worker set",
        labels=[*labels, "name"],
    )
    for w in router.workers:
        if w.share is not None:
            share.add_metric([port, w.name], w.share)
        if w.in_router is not None:
            member.add_metric([port, w.name], 1 if w.in_router else 0)
    yield state
    yield up
    yield restarts
    yield from gauges.values()
    yield share
    yield member


def rollout_metrics(snap: StatusSnapshot) -> Iterator[Metric]:
    """`vsup_rollout_*`: the latest rolling apply (nothing before one). `running` is 1 while
    it restarts instances; `interrupted` 1 when a daemon ended in the middle of it and
    instances still run the old spec (`old_config`); `failed` 1 when a wave did not come
    back."""
    r = snap.rollout
    if r is None:
        return
    state = GaugeMetricFamily(
        "vsup_rollout_state", "1 for the latest rollout's state, 0 for the others", labels=["state"]
    )
    for s in ROLLOUT_STATES:
        state.add_metric([s], 1 if r.state == s else 0)
    yield state
    for key, value, what in (
        (
            "running",
            1 if r.state == RolloutState.RUNNING else 0,
            "1 while a rolling apply restarts instances",
        ),
        (
            "failed",
            1 if r.state == RolloutState.FAILED else 0,
            "1 when the latest rollout's wave failed",
        ),
        (
            "interrupted",
            1 if r.state == RolloutState.INTERRUPTED else 0,
            "1 when a daemon ended in the middle of the latest rollout",
        ),
        ("wave", r.wave, "The wave under way (or the last one), 1-based"),
        ("waves", r.waves, "Waves of the latest rollout"),
        ("done", r.done, "Instances the latest rollout restarted with the new spec"),
        ("total", r.total, "Instances the latest rollout restarts"),
        ("old_config", len(r.old_config), "Instances of the latest rollout on their old spec"),
    ):
        fam = GaugeMetricFamily(f"vsup_rollout_{key}", what)
        fam.add_metric([], value)
        yield fam


def wait_metrics(snap: StatusSnapshot) -> Iterator[Metric]:
    """`vsup_instance_waiting{name,kind}`: 1 while the instance waits for its next start, for
    that reason (snapshot.WAIT_KINDS); `vsup_instance_wait_seconds_remaining` for a backoff;
    `vsup_instance_outdated`: 1 while it runs another spec than the layout."""
    waiting = GaugeMetricFamily(
        "vsup_instance_waiting",
        "1 while the instance waits for its next start, for the reason `kind`",
        labels=["name", "kind"],
    )
    remaining = GaugeMetricFamily(
        "vsup_instance_wait_seconds_remaining",
        "Seconds until a backing-off instance's next start",
        labels=["name"],
    )
    outdated = GaugeMetricFamily(
        "vsup_instance_outdated",
        "1 while the instance runs another spec than the running layout",
        labels=["name"],
    )
    for inst in snap.instances:
        wait = inst.wait
        kinds = set(WAIT_KINDS) | ({wait.kind} if wait is not None else set())
        for kind in sorted(kinds):
            waiting.add_metric(
                [inst.name, kind], 1 if wait is not None and wait.kind == kind else 0
            )
        if wait is not None and wait.remaining_s is not None:
            remaining.add_metric([inst.name], wait.remaining_s)
        if inst.outdated is not None:
            outdated.add_metric([inst.name], 1 if inst.outdated else 0)
    yield waiting
    yield remaining
    yield outdated


def gpu_health_metrics(snap: StatusSnapshot) -> Iterator[Metric]:
    """The GPUs' health series (snapshot `gpus[].health`); unknown figures are left out."""
    glabels = ["gpu", "gpu_name"]
    ecc = CounterMetricFamily(
        "vsup_gpu_ecc_errors",
        "ECC errors; scope volatile: since the driver loaded, aggregate: the GPU's lifetime",
        labels=[*glabels, "kind", "scope"],
    )
    xid = CounterMetricFamily(
        "vsup_gpu_xid_errors", "XID errors NVML reported since vsup began watching", labels=glabels
    )
    throttle = GaugeMetricFamily(
        "vsup_gpu_throttle_active",
        "1 while the clocks are held down for this reason",
        labels=[*glabels, "reason"],
    )
    rows = GaugeMetricFamily(
        "vsup_gpu_remapped_rows", "Memory rows remapped", labels=[*glabels, "kind"]
    )
    clock = GaugeMetricFamily(
        "vsup_gpu_clock_megahertz", "Current clock", labels=[*glabels, "clock"]
    )
    clock_max = GaugeMetricFamily(
        "vsup_gpu_clock_max_megahertz", "Maximum clock", labels=[*glabels, "clock"]
    )
    flags = {
        "ecc_enabled": GaugeMetricFamily(
            "vsup_gpu_ecc_enabled", "1 when ECC is on", labels=glabels
        ),
        "retired_pages_pending": GaugeMetricFamily(
            "vsup_gpu_retired_pages_pending",
            "1 while a page retirement waits for a GPU reset",
            labels=glabels,
        ),
        "row_remap_pending": GaugeMetricFamily(
            "vsup_gpu_row_remap_pending",
            "1 while a row remap waits for a GPU reset",
            labels=glabels,
        ),
        "row_remap_failed": GaugeMetricFamily(
            "vsup_gpu_row_remap_failed", "1 when a row remap failed", labels=glabels
        ),
    }
    gauges = {
        "retired_pages": GaugeMetricFamily(
            "vsup_gpu_retired_pages", "Memory pages retired (bad pages on AMD)", labels=glabels
        ),
        "bad_pages_unreservable": GaugeMetricFamily(
            "vsup_gpu_bad_pages_unreservable", "Bad pages that could not be retired", labels=glabels
        ),
        "power_limit_w": GaugeMetricFamily(
            "vsup_gpu_power_limit_watts", "The enforced power cap", labels=glabels
        ),
    }
    ecc_keys = (
        ("ecc_volatile_corrected", "corrected", "volatile"),
        ("ecc_volatile_uncorrected", "uncorrected", "volatile"),
        ("ecc_aggregate_corrected", "corrected", "aggregate"),
        ("ecc_aggregate_uncorrected", "uncorrected", "aggregate"),
        ("ecc_deferred", "deferred", "volatile"),
    )
    for gpu in snap.gpus:
        h = gpu.health
        if h is None:
            continue
        lv = [str(gpu.index), gpu.name or ""]
        for key, kind, scope in ecc_keys:
            value = getattr(h, key)
            if value is not None:
                ecc.add_metric([*lv, kind, scope], float(value))
        if h.xid_count is not None:
            xid.add_metric(lv, float(h.xid_count))
        if h.throttle_reasons is not None:
            for reason in THROTTLE_REASONS:
                throttle.add_metric([*lv, reason], 1 if reason in h.throttle_reasons else 0)
        for key, kind in (
            ("rows_remapped_correctable", "correctable"),
            ("rows_remapped_uncorrectable", "uncorrectable"),
        ):
            value = getattr(h, key)
            if value is not None:
                rows.add_metric([*lv, kind], float(value))
        for name, now, top in (
            ("sm", h.sm_clock_mhz, h.sm_clock_max_mhz),
            ("mem", h.mem_clock_mhz, h.mem_clock_max_mhz),
        ):
            if now is not None:
                clock.add_metric([*lv, name], now)
            if top is not None:
                clock_max.add_metric([*lv, name], top)
        for key, fam in flags.items():
            value = getattr(h, key)
            if value is not None:
                fam.add_metric(lv, 1 if value else 0)
        for key, fam in gauges.items():
            value = getattr(h, key)
            if value is not None:
                fam.add_metric(lv, float(value))
    yield ecc
    yield xid
    yield throttle
    yield rows
    yield clock
    yield clock_max
    yield from flags.values()
    yield from gauges.values()


def _render_or_empty(snap: StatusSnapshot | None) -> bytes:
    return render(snap) if snap is not None else b""


def render(snap: StatusSnapshot) -> bytes:
    """The exposition text of one snapshot (what `/metrics` answers)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(lambda: snap))
    return generate_latest(registry)


class MetricsListener:
    """The HTTP listener serving `/metrics`: uvicorn on the daemon's loop.

    The exposition is rendered once per snapshot (the daemon builds one a poll) and the same
    bytes answer every scrape until the next: 16 scrapers at 216 requests/s rendered it 216
    times a second, took 82 % of the daemon's core and delayed crash detection from ~2 ms to
    64 ms. A render runs in a worker thread, so the loop keeps supervising meanwhile; scrapes
    that arrive during it wait for that one render."""

    def __init__(self, source: Callable[[], StatusSnapshot | None]) -> None:
        self._source = source
        self._served: ServedApp | None = None
        self.address: tuple[str, int] | None = None
        self._cached: tuple[StatusSnapshot | None, bytes] | None = None
        self._rendering: asyncio.Future[bytes] | None = None
        self._rendering_for: StatusSnapshot | None = None
        self.renders = 0  # expositions built (tests read it: once per snapshot)

    @property
    def running(self) -> bool:
        return self._served is not None

    async def exposition(self) -> bytes:
        """The exposition of the latest snapshot, rendered at most once per snapshot."""
        snap = self._source()
        cached = self._cached
        if cached is not None and cached[0] is snap:
            return cached[1]
        if self._rendering is not None and self._rendering_for is snap:
            return await asyncio.shield(self._rendering)
        self.renders += 1
        self._rendering_for = snap
        future = asyncio.ensure_future(asyncio.to_thread(_render_or_empty, snap))
        self._rendering = future
        try:
            body = await asyncio.shield(future)
        finally:
            if self._rendering is future:
                self._rendering = None
                self._rendering_for = None
        if future.done() and not future.cancelled():
            self._cached = (snap, body)
        return body

    def app(self) -> Starlette:
        """The ASGI app: `GET /metrics` in the Prometheus text format."""

        async def metrics(request: Request) -> Response:
            return Response(await self.exposition(), media_type=CONTENT_TYPE_LATEST)

        async def index(request: Request) -> Response:
            return PlainTextResponse("vsup metrics: /metrics\n")

        return Starlette(routes=[Route("/metrics", metrics), Route("/", index)])

    async def start(self, listen: tuple[str, int] | str) -> None:
        """Listen on `listen` ((host, port) as the compiled layout has it, or HOST:PORT),
        replacing a listener on another address.

        Raises ValueError for a malformed address and OSError when it cannot be bound."""
        from vsup.control.server import ServedApp, bind_tcp_socket

        host, port = parse_listen(listen) if isinstance(listen, str) else listen
        if self._served is not None and self.address == (host, port):
            return
        await self.stop()
        sock = bind_tcp_socket(host, port)
        served = ServedApp(self.app(), sock, name=f"metrics {host}:{port}")
        await served.start()
        self._served = served
        self.address = (host, sock.getsockname()[1])
        log.info("Prometheus metrics on http://%s:%d/metrics", host, self.address[1])

    async def stop(self) -> None:
        if self._served is not None:
            await self._served.stop()
            self._served = None
            self.address = None
