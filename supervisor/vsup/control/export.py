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
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from vsup.layout.listen import parse_listen
from vsup.snapshot import (
    ROLLOUT_STATES,
    STATES,
    THROTTLE_REASONS,
    WAIT_KINDS,
    GpuStatus,
    RouterStatus,
    StatusSnapshot,
)
from vsup.states import RolloutState, SleepState, State

if TYPE_CHECKING:
    from vsup.control.server import ServedApp

log = logging.getLogger(__name__)

SLEEP_STATES = tuple(s.value for s in SleepState)
GPU_LABELS = ("gpu", "gpu_name")


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


class Series(NamedTuple):
    """One family read off an attribute: `attr` of the snapshot part (dotted: `memory.hbm_bytes`
    is an instance's part's attribute), the family's `name` and `help`. A value that is None
    (unknown, or a part that is None) is left out, never exported as a made-up number."""

    attr: str
    name: str
    help: str


# (attribute of InstanceStatus's parts, family, help): a gauge per instance, labelled `name`
INSTANCE_GAUGES = (
    Series(
        "memory.hbm_bytes", "vsup_instance_hbm_bytes", "GPU memory held by the instance's processes"
    ),
    Series(
        "memory.planned_hbm_bytes",
        "vsup_instance_planned_hbm_bytes",
        "gpu_memory_utilization x the memory of its GPUs",
    ),
    Series(
        "telemetry.kv_cache_usage", "vsup_instance_kv_cache_usage_ratio", "KV cache in use (0-1)"
    ),
    Series(
        "telemetry.kv_capacity_tokens",
        "vsup_instance_kv_capacity_tokens",
        "Tokens the KV cache holds",
    ),
    Series(
        "telemetry.requests_running", "vsup_instance_requests_running", "Requests being decoded"
    ),
    Series("telemetry.requests_waiting", "vsup_instance_requests_waiting", "Requests queued"),
    Series(
        "telemetry.requests_in_flight",
        "vsup_instance_requests_in_flight",
        "Requests in flight at vLLM's API server (its /load; with load tracking only)",
    ),
    Series(
        "telemetry.generation_tokens_per_s",
        "vsup_instance_generation_tokens_per_second",
        "Generated tokens per second",
    ),
    Series(
        "telemetry.prompt_tokens_per_s",
        "vsup_instance_prompt_tokens_per_second",
        "Prompt tokens per second",
    ),
    Series(
        "telemetry.preemptions_per_min",
        "vsup_instance_preemptions_per_minute",
        "Preemptions per minute",
    ),
    Series(
        "lifecycle.uptime_s", "vsup_instance_uptime_seconds", "Seconds since this run was spawned"
    ),
    Series(
        "stall.stalled",
        "vsup_instance_stalled",
        "1 while a ready instance has work and makes no progress (stall_after_s)",
    ),
    Series(
        "stall.for_s",
        "vsup_instance_stalled_seconds",
        "Seconds a stalled instance has processed no token",
    ),
)
INSTANCE_PREEMPTIONS = Series(
    "telemetry.preemptions_total",
    "vsup_instance_preemptions",
    "vLLM's preemption counter (resets when the instance restarts)",
)

# (attribute of GpuStatus, family, help): a gauge per GPU, labelled `gpu`, `gpu_name`
GPU_GAUGES = (
    Series("hbm_used_bytes", "vsup_gpu_hbm_used_bytes", "HBM in use"),
    Series("hbm_total_bytes", "vsup_gpu_hbm_total_bytes", "HBM size"),
    Series("util_pct", "vsup_gpu_utilization_percent", "GPU busy percent"),
    Series("temp_c", "vsup_gpu_temperature_celsius", "GPU temperature"),
    Series("power_w", "vsup_gpu_power_watts", "GPU power draw"),
)

# GpuHealth: the counters by (kind, scope) and (kind), the clocks by clock, the 1/0 flags, the
# plain gauges
ECC_COUNTS = (
    ("ecc_volatile_corrected", ("corrected", "volatile")),
    ("ecc_volatile_uncorrected", ("uncorrected", "volatile")),
    ("ecc_aggregate_corrected", ("corrected", "aggregate")),
    ("ecc_aggregate_uncorrected", ("uncorrected", "aggregate")),
    ("ecc_deferred", ("deferred", "volatile")),
)
REMAPPED_ROWS = (
    ("rows_remapped_correctable", ("correctable",)),
    ("rows_remapped_uncorrectable", ("uncorrectable",)),
)
CLOCKS = (("sm_clock_mhz", ("sm",)), ("mem_clock_mhz", ("mem",)))
CLOCKS_MAX = (("sm_clock_max_mhz", ("sm",)), ("mem_clock_max_mhz", ("mem",)))
GPU_XIDS = Series(
    "xid_count", "vsup_gpu_xid_errors", "XID errors NVML reported since vsup began watching"
)
GPU_HEALTH_FLAGS = (
    Series("ecc_enabled", "vsup_gpu_ecc_enabled", "1 when ECC is on"),
    Series(
        "retired_pages_pending",
        "vsup_gpu_retired_pages_pending",
        "1 while a page retirement waits for a GPU reset",
    ),
    Series(
        "row_remap_pending",
        "vsup_gpu_row_remap_pending",
        "1 while a row remap waits for a GPU reset",
    ),
    Series("row_remap_failed", "vsup_gpu_row_remap_failed", "1 when a row remap failed"),
)
GPU_HEALTH_GAUGES = (
    Series("retired_pages", "vsup_gpu_retired_pages", "Memory pages retired (bad pages on AMD)"),
    Series(
        "bad_pages_unreservable",
        "vsup_gpu_bad_pages_unreservable",
        "Bad pages that could not be retired",
    ),
    Series("power_limit_w", "vsup_gpu_power_limit_watts", "The enforced power cap"),
)

# (attribute of SleepStatus, family, help): a gauge per sleeping-mode instance
SLEEP_GAUGES = (
    Series(
        "since_s",
        "vsup_instance_sleep_state_seconds",
        "Sleep mode: seconds in the current sleep state",
    ),
    Series(
        "last_sleep_s",
        "vsup_instance_sleep_last_sleep_seconds",
        "Sleep mode: how long the last sleep took (until its memory was seen released)",
    ),
    Series(
        "last_wake_s",
        "vsup_instance_sleep_last_wake_seconds",
        "Sleep mode: how long the last wake took (until the server answered again)",
    ),
    Series(
        "held_bytes",
        "vsup_instance_sleep_held_bytes",
        "Sleep mode: GPU memory the instance keeps while asleep",
    ),
    Series(
        "idle_sleep_in_s",
        "vsup_instance_sleep_idle_seconds_remaining",
        "Sleep mode: seconds until idle sleep (after_idle_s) puts the instance to sleep",
    ),
)

ROUTER_GAUGES = (
    Series("requests_per_s", "vsup_router_requests_per_second", "Requests the router took"),
    Series(
        "errors_per_s",
        "vsup_router_errors_per_second",
        "Requests the router answered with an error",
    ),
)

# A row: one snapshot part (an instance, a GPU's health, ...) and the label values of its series
Row = tuple[Any, list[str]]
Family = type[GaugeMetricFamily] | type[CounterMetricFamily]


def _read(obj: Any, path: str) -> Any:
    """`obj`'s attribute at the dotted `path`; None where a part on the way is None."""
    for name in path.split("."):
        if obj is None:
            return None
        obj = getattr(obj, name)
    return obj


def _flag(value: object) -> int:
    return 1 if value else 0


def _known(
    table: Iterable[Series],
    labels: Sequence[str],
    rows: Iterable[Row],
    family: Family = GaugeMetricFamily,
    value: Callable[[Any], float] = float,
) -> list[Metric]:
    """One family per series of `table`, with a sample for each row whose value is known."""
    families = [(s.attr, family(s.name, s.help, labels=labels)) for s in table]
    for obj, lv in rows:
        for attr, fam in families:
            v = _read(obj, attr)
            if v is not None:
                fam.add_metric(lv, value(v))
    return [fam for _, fam in families]


def _by_label(
    fam: GaugeMetricFamily | CounterMetricFamily,
    table: Iterable[tuple[str, tuple[str, ...]]],
    rows: Iterable[Row],
) -> Metric:
    """`fam` with a sample per row and known attribute of `table`, labelled by the table's
    extra label values."""
    for obj, lv in rows:
        for attr, extra in table:
            v = getattr(obj, attr)
            if v is not None:
                fam.add_metric([*lv, *extra], float(v))
    return fam


def _one_hot(fam: GaugeMetricFamily, lv: list[str], choices: Iterable[str], now: object) -> None:
    """A sample per choice: 1 for the one in force (`now`), 0 for the others."""
    for choice in choices:
        fam.add_metric([*lv, choice], 1 if now == choice else 0)


def snapshot_metrics(snap: StatusSnapshot) -> Iterator[Metric]:
    """Every vsup_* metric family for one snapshot."""
    yield from supervisor_metrics(snap)
    yield from instance_metrics(snap)
    yield from gpu_metrics(snap)
    yield from gpu_health_metrics(snap)
    yield advice_metrics(snap)
    yield from router_metrics(snap)
    yield from rollout_metrics(snap)
    yield from wait_metrics(snap)
    yield from sleep_metrics(snap)


def supervisor_metrics(snap: StatusSnapshot) -> Iterator[Metric]:
    """The daemon itself: what it is and how long it has run."""
    sup = GaugeMetricFamily(
        "vsup_supervisor_info", "The vsup daemon (value 1)", labels=["version", "layout", "node"]
    )
    sup.add_metric([snap.supervisor.version, snap.supervisor.layout or "", snap.node.hostname], 1)
    yield sup
    uptime = GaugeMetricFamily("vsup_supervisor_uptime_seconds", "Seconds since the daemon started")
    uptime.add_metric([], snap.supervisor.uptime_s)
    yield uptime


def instance_metrics(snap: StatusSnapshot) -> Iterator[Metric]:
    """`vsup_instance_*`: what each instance runs, its state, its figures, its ranks."""
    rows = [(inst, [inst.name]) for inst in snap.instances]
    yield _instance_info(snap)
    yield _span_info(snap)
    state = GaugeMetricFamily(
        "vsup_instance_state",
        "1 for the instance's current state, 0 for the others",
        labels=["name", "state"],
    )
    up = GaugeMetricFamily("vsup_instance_up", "1 when the instance is ready", labels=["name"])
    restarts = CounterMetricFamily(
        "vsup_instance_restarts", "Restarts vsup made after failures", labels=["name"]
    )
    for inst, lv in rows:
        _one_hot(state, lv, STATES, inst.lifecycle.state)
        up.add_metric(lv, 1 if inst.is_ready else 0)
        restarts.add_metric(lv, inst.lifecycle.restarts)
    yield from (state, up, restarts)
    yield from _known(INSTANCE_GAUGES, ["name"], rows)
    yield _rank_stalled(snap)
    yield from _known((INSTANCE_PREEMPTIONS,), ["name"], rows, family=CounterMetricFamily)


def _instance_info(snap: StatusSnapshot) -> Metric:
    info = GaugeMetricFamily(
        "vsup_instance_info",
        "One series per instance (value 1); model, backend and placement as labels",
        labels=["name", "model", "backend", "backend_name", "backend_source", "port", "gpus"],
    )
    for inst in snap.instances:
        info.add_metric(
            [
                inst.name,
                inst.model or "",
                inst.telemetry.backend or "",
                inst.telemetry.backend_name or "",
                inst.telemetry.backend_source or "",
                "" if inst.port is None else str(inst.port),
                ",".join(str(g) for g in inst.gpus),
            ],
            1,
        )
    return info


def _span_info(snap: StatusSnapshot) -> Metric:
    """A server across nodes: this node's part and its head. A follower exports no server
    figures (they would be its head's, the whole unit's: counted there once); this series
    points at the node that has them."""
    info = GaugeMetricFamily(
        "vsup_instance_span_info",
        "A server across nodes, one series per member instance (value 1): this node's part "
        "(head or follower, its first rank and rank count) and its head; a follower's server "
        "figures are exported at its head only",
        labels=["name", "node", "role", "start_rank", "ranks", "size", "head_node", "head_url"],
    )
    for inst in snap.instances:
        span = inst.span
        if span is None:
            continue
        head = span.nodes[0].node if span.nodes else ""
        info.add_metric(
            [
                inst.name,
                span.node,
                "head" if span.head else "follower",
                str(span.start_rank),
                str(span.ranks),
                str(span.size),
                head,
                f"http://{span.address}:{span.port}",
            ],
            1,
        )
    return info


def _rank_stalled(snap: StatusSnapshot) -> Metric:
    rank_stalled = GaugeMetricFamily(
        "vsup_instance_rank_stalled",
        "Data parallel: 1 for a rank with work and no progress (stall_after_s), 0 for the others",
        labels=["name", "rank"],
    )
    for inst in snap.instances:
        if inst.stall is None:
            continue
        for r in inst.ranks:
            rank_stalled.add_metric(
                [inst.name, str(r.rank)], 1 if r.rank in inst.stall.ranks else 0
            )
    return rank_stalled


def _gpu_labels(gpu: GpuStatus) -> list[str]:
    return [str(gpu.index), gpu.name or ""]


def gpu_metrics(snap: StatusSnapshot) -> Iterator[Metric]:
    """`vsup_gpu_*` figures of each GPU, and the processes on it that no instance owns."""
    rows = [(gpu, _gpu_labels(gpu)) for gpu in snap.gpus]
    yield from _known(GPU_GAUGES, GPU_LABELS, rows)
    foreign = GaugeMetricFamily(
        "vsup_gpu_foreign_processes",
        "Processes on the GPU that no instance owns",
        labels=GPU_LABELS,
    )
    for gpu, lv in rows:
        foreign.add_metric(lv, sum(1 for p in gpu.processes if p.instance is None))
    yield foreign


def advice_metrics(snap: StatusSnapshot) -> Metric:
    advice = GaugeMetricFamily(
        "vsup_advice_active",
        "Live advice in force (value 1)",
        labels=["kind", "severity", "name", "gpu"],
    )
    for a in snap.advice:
        advice.add_metric(
            [a.kind, a.severity, a.instance or "", "" if a.gpu is None else str(a.gpu)], 1
        )
    return advice


def sleep_metrics(snap: StatusSnapshot) -> Iterator[Metric]:
    """Sleep mode (docs/sleep.md), for the instances that use it (none for the others):
    `vsup_instance_sleep_state{name,state}` 1 for its current SleepState, 0 for the others (a
    sleeper's `vsup_instance_state` stays `ready`); its level; how long the last sleep and wake
    took; what it keeps while asleep; seconds until idle sleep. Unknown values are left out."""
    rows = [(inst.sleep, [inst.name]) for inst in snap.instances if inst.sleep is not None]
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
    for s, lv in rows:
        _one_hot(state, lv, sorted(set(SLEEP_STATES) | {s.state}), s.state)
        level.add_metric(lv, s.level)
    yield from (state, level)
    yield from _known(SLEEP_GAUGES, ["name"], rows)
    failed = GaugeMetricFamily(
        "vsup_instance_sleep_failed",
        "Sleep mode: 1 while the last sleep or wake failed (status JSON sleep.error says why)",
        labels=["name"],
    )
    for s, lv in rows:
        failed.add_metric(lv, 1 if s.error else 0)
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
    _one_hot(state, [port], STATES, router.state)
    up = GaugeMetricFamily("vsup_router_up", "1 when the router serves", labels=labels)
    up.add_metric([port], 1 if router.state == State.READY else 0)
    restarts = CounterMetricFamily(
        "vsup_router_restarts", "Automatic restarts of the router", labels=labels
    )
    restarts.add_metric([port], router.restarts or 0)
    yield from (state, up, restarts)
    yield from _known(ROUTER_GAUGES, labels, [(router, [port])])
    yield from _router_workers(router)


def _router_workers(router: RouterStatus) -> Iterator[Metric]:
    labels = ["port", "name"]
    port = str(router.port)
    share = GaugeMetricFamily(
        "vsup_router_worker_share",
        "A member instance's fraction of the router's requests",
        labels=labels,
    )
    member = GaugeMetricFamily(
        "vsup_router_worker_in_router",
        "1 when the instance is in the router's worker set",
        labels=labels,
    )
    for w in router.workers:
        if w.share is not None:
            share.add_metric([port, w.name], w.share)
        if w.in_router is not None:
            member.add_metric([port, w.name], 1 if w.in_router else 0)
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
        wait = inst.lifecycle.wait
        kinds = set(WAIT_KINDS) | ({wait.kind} if wait is not None else set())
        for kind in sorted(kinds):
            waiting.add_metric(
                [inst.name, kind], 1 if wait is not None and wait.kind == kind else 0
            )
        if wait is not None and wait.remaining_s is not None:
            remaining.add_metric([inst.name], wait.remaining_s)
        if inst.lifecycle.outdated is not None:
            outdated.add_metric([inst.name], 1 if inst.lifecycle.outdated else 0)
    yield waiting
    yield remaining
    yield outdated


def gpu_health_metrics(snap: StatusSnapshot) -> Iterator[Metric]:
    """The GPUs' health series (snapshot `gpus[].health`); unknown figures are left out."""
    rows = [(gpu.health, _gpu_labels(gpu)) for gpu in snap.gpus if gpu.health is not None]
    ecc = CounterMetricFamily(
        "vsup_gpu_ecc_errors",
        "ECC errors; scope volatile: since the driver loaded, aggregate: the GPU's lifetime",
        labels=[*GPU_LABELS, "kind", "scope"],
    )
    yield _by_label(ecc, ECC_COUNTS, rows)
    yield from _known((GPU_XIDS,), GPU_LABELS, rows, family=CounterMetricFamily)
    yield _throttle(rows)
    rows_remapped = GaugeMetricFamily(
        "vsup_gpu_remapped_rows", "Memory rows remapped", labels=[*GPU_LABELS, "kind"]
    )
    yield _by_label(rows_remapped, REMAPPED_ROWS, rows)
    clock = GaugeMetricFamily(
        "vsup_gpu_clock_megahertz", "Current clock", labels=[*GPU_LABELS, "clock"]
    )
    yield _by_label(clock, CLOCKS, rows)
    clock_max = GaugeMetricFamily(
        "vsup_gpu_clock_max_megahertz", "Maximum clock", labels=[*GPU_LABELS, "clock"]
    )
    yield _by_label(clock_max, CLOCKS_MAX, rows)
    yield from _known(GPU_HEALTH_FLAGS, GPU_LABELS, rows, value=_flag)
    yield from _known(GPU_HEALTH_GAUGES, GPU_LABELS, rows)


def _throttle(rows: list[Row]) -> Metric:
    throttle = GaugeMetricFamily(
        "vsup_gpu_throttle_active",
        "1 while the clocks are held down for this reason",
        labels=[*GPU_LABELS, "reason"],
    )
    for h, lv in rows:
        if h.throttle_reasons is not None:
            for reason in THROTTLE_REASONS:
                throttle.add_metric([*lv, reason], 1 if reason in h.throttle_reasons else 0)
    return throttle


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
