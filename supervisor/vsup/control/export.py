"""Prometheus export: the daemon's snapshot as `vsup_*` series, on an opt-in listener.

A layout opts in with `[layout] metrics_listen = "127.0.0.1:9400"`. The daemon then serves
`GET /metrics` there (its own small HTTP listener on the daemon's event loop; rendering a
snapshot takes well under a millisecond). Values come from the latest snapshot only: an unknown
value is left out, never exported as a made-up number. The instance label is `name`, because
Prometheus itself sets `instance` to the scrape target.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from vsup.layout.listen import parse_listen
from vsup.snapshot import STATES, StatusSnapshot

log = logging.getLogger(__name__)


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
    }
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
    yield info
    yield state
    yield up
    yield restarts
    yield from gauges.values()
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


def render(snap: StatusSnapshot) -> bytes:
    """The exposition text of one snapshot (what `/metrics` answers)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(lambda: snap))
    return generate_latest(registry)


class MetricsListener:
    """The HTTP listener serving `/metrics`: uvicorn on the daemon's loop."""

    def __init__(self, source: Callable[[], StatusSnapshot | None]) -> None:
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(SnapshotCollector(source))
        self._served = None
        self.address: tuple[str, int] | None = None

    @property
    def running(self) -> bool:
        return self._served is not None

    def app(self) -> Starlette:
        """The ASGI app: `GET /metrics` in the Prometheus text format."""

        async def metrics(request: Request) -> Response:
            return Response(generate_latest(self._registry), media_type=CONTENT_TYPE_LATEST)

        async def index(request: Request) -> Response:
            return PlainTextResponse("vsup metrics: /metrics\n")

        return Starlette(routes=[Route("/metrics", metrics), Route("/", index)])

    async def start(self, listen: str) -> None:
        """Listen on `listen` (HOST:PORT), replacing a listener on another address.

        Raises ValueError for a malformed address and OSError when it cannot be bound."""
        from vsup.control.server import ServedApp, bind_tcp_socket

        host, port = parse_listen(listen)
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
