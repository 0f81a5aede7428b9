"""Prometheus exposition of a snapshot."""

from __future__ import annotations

from dataclasses import replace

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from vsup.control.export import MetricsListener, parse_listen, render
from vsup.routerview import as_router
from vsup.snapshot import (
    Advice,
    GpuHealth,
    GpuProcess,
    GpuStatus,
    NodeInfo,
    RolloutStatus,
    StatusSnapshot,
    SupervisorInfo,
    WaitReason,
    empty_instance,
)

GiB = 1024**3


def snapshot() -> StatusSnapshot:
    return StatusSnapshot(
        supervisor=SupervisorInfo(pid=1, version="0.1.0", uptime_s=12.5, layout="l8"),
        node=NodeInfo(hostname="node1", gpu_vendor="nvidia", gpu_count=1),
        gpus=(
            GpuStatus(
                0,
                "H200",
                141 * GiB,
                70 * GiB,
                93.0,
                61.0,
                512.5,
                (GpuProcess(10, 60 * GiB, "g0"), GpuProcess(77, GiB, None)),
                health=GpuHealth(
                    ecc_volatile_uncorrected=0,
                    xid_count=0,
                    throttle_reasons=("power_cap",),
                    sm_clock_mhz=1800.0,
                    sm_clock_max_mhz=1980.0,
                ),
            ),
        ),
        instances=(
            empty_instance(
                "g0",
                state="ready",
                pid=10,
                port=8000,
                gpus=(0,),
                model="m",
                restarts=2,
                hbm_bytes=60 * GiB,
                hbm_source="process",
                planned_hbm_bytes=63 * GiB,
                kv_cache_usage=0.42,
                preemptions_total=7.0,
                requests_running=3.0,
                requests_waiting=0.0,
                generation_tokens_per_s=812.5,
                backend="FLASH_ATTN",
                backend_source="log",
            ),
            empty_instance("g1", state="backoff", port=8001, gpus=(0,), restarts=1),
        ),
        advice=(Advice("foreign_process", "warning", "pid 77", gpu=0),),
    )


def samples(text: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_exposition_has_instance_and_gpu_series_and_parses():
    text = render(snapshot()).decode()
    got = samples(text)
    assert got[("vsup_instance_up", (("name", "g0"),))] == 1
    assert got[("vsup_instance_up", (("name", "g1"),))] == 0
    assert got[("vsup_instance_state", (("name", "g1"), ("state", "backoff")))] == 1
    assert got[("vsup_instance_state", (("name", "g1"), ("state", "ready")))] == 0
    assert got[("vsup_instance_restarts_total", (("name", "g0"),))] == 2
    assert got[("vsup_instance_hbm_bytes", (("name", "g0"),))] == 60 * GiB
    assert got[("vsup_instance_kv_cache_usage_ratio", (("name", "g0"),))] == 0.42
    assert got[("vsup_instance_preemptions_total", (("name", "g0"),))] == 7
    assert got[("vsup_instance_generation_tokens_per_second", (("name", "g0"),))] == 812.5
    info = [k for k in got if k[0] == "vsup_instance_info" and ("name", "g0") in k[1]]
    assert ("backend", "FLASH_ATTN") in info[0][1]
    gl = (("gpu", "0"), ("gpu_name", "H200"))
    assert got[("vsup_gpu_hbm_used_bytes", gl)] == 70 * GiB
    assert got[("vsup_gpu_hbm_total_bytes", gl)] == 141 * GiB
    assert got[("vsup_gpu_power_watts", gl)] == 512.5
    assert got[("vsup_gpu_foreign_processes", gl)] == 1


def test_unknown_values_are_left_out_not_zero():
    got = samples(render(snapshot()).decode())
    assert ("vsup_instance_kv_cache_usage_ratio", (("name", "g1"),)) not in got
    assert ("vsup_instance_hbm_bytes", (("name", "g1"),)) not in got


def test_every_series_is_documented_and_prefixed():
    for fam in text_string_to_metric_families(render(snapshot()).decode()):
        assert fam.name.startswith("vsup_") and fam.documentation


@pytest.mark.parametrize(
    "value,expected",
    [
        ("127.0.0.1:9400", ("127.0.0.1", 9400)),
        ("[::1]:9400", ("::1", 9400)),
        ("0.0.0.0:1", ("0.0.0.0", 1)),
    ],
)
def test_listen_addresses_parse(value, expected):
    assert parse_listen(value) == expected


@pytest.mark.parametrize("value", ["9400", "127.0.0.1", "127.0.0.1:x", "127.0.0.1:70000", ":9"])
def test_bad_listen_addresses_say_what_is_wrong(value):
    with pytest.raises(ValueError, match="metrics_listen"):
        parse_listen(value)


async def test_listener_serves_the_latest_snapshot(port):
    snap: dict[str, StatusSnapshot | None] = {"now": None}
    listener = MetricsListener(lambda: snap["now"])
    await listener.start(f"127.0.0.1:{port}")
    try:
        async with httpx.AsyncClient() as http:
            empty = await http.get(f"http://127.0.0.1:{port}/metrics")
            assert empty.status_code == 200 and "vsup_instance_up" not in empty.text
            snap["now"] = snapshot()
            full = await http.get(f"http://127.0.0.1:{port}/metrics")
            assert 'vsup_instance_up{name="g0"} 1.0' in full.text
            assert full.headers["content-type"].startswith("text/plain")
            assert (await http.get(f"http://127.0.0.1:{port}/nope")).status_code == 404
    finally:
        await listener.stop()
    with pytest.raises(httpx.ConnectError):
        async with httpx.AsyncClient() as http:
            await http.get(f"http://127.0.0.1:{port}/metrics")


def test_grafana_dashboard_uses_only_series_the_exporter_serves():
    import json
    import re
    from pathlib import Path

    dash = json.loads((Path(__file__).parents[3] / "configs" / "grafana-vsup.json").read_text())
    exprs: list[str] = []

    def walk(panels):
        for p in panels:
            exprs.extend(t["expr"] for t in p.get("targets", ()))
            walk(p.get("panels", ()))

    walk(dash["panels"])
    exprs.extend(v["definition"] for v in dash["templating"]["list"] if v["type"] == "query")
    used = {m for e in exprs for m in re.findall(r"vsup_[a-z_]+", e)}
    served = {
        s.name
        for fam in text_string_to_metric_families(
            render(replace(with_rollout_and_waits(), router=with_router().router)).decode()
        )
        for s in fam.samples
    }
    assert used and used <= served, used - served


ROUTER = {
    "state": "ready",
    "port": 8080,
    "restarts": 1,
    "requests_per_s": 12.5,
    "errors_per_s": None,
    "workers": [
        {"name": "g0", "in_router": True, "share": 0.75},
        {"name": "g1", "in_router": False, "share": 0.25},
    ],
}


def with_router() -> StatusSnapshot:
    return replace(snapshot(), router=as_router({**ROUTER, "errors_per_s": 0.0}))


def test_the_router_is_exported_with_its_workers_shares():
    got = samples(render(replace(snapshot(), router=as_router(ROUTER))).decode())
    port = ("port", "8080")
    assert got[("vsup_router_up", (port,))] == 1
    assert got[("vsup_router_state", (port, ("state", "ready")))] == 1
    assert got[("vsup_router_requests_per_second", (port,))] == 12.5
    assert ("vsup_router_errors_per_second", (port,)) not in got  # unknown: left out
    assert got[("vsup_router_worker_share", (("name", "g0"), port))] == 0.75
    assert got[("vsup_router_worker_in_router", (("name", "g1"), port))] == 0


def test_no_router_no_router_series():
    assert not any(
        name.startswith("vsup_router") for name, _ in samples(render(snapshot()).decode())
    )


def with_rollout_and_waits() -> StatusSnapshot:
    snap = snapshot()
    waiting = empty_instance(
        "g1",
        state="starting",
        wait=WaitReason("gpu_memory", "pid 77 holds 1.0 GiB", pids=(77,), held_bytes=GiB),
        outdated=True,
        outdated_fields=("args",),
    )
    backing_off = empty_instance(
        "g2",
        state="backoff",
        wait=WaitReason("backoff", "next start in 12s (after oom)", remaining_s=12.0),
        outdated=False,
    )
    rollout = RolloutStatus(
        state="running",
        wave=2,
        waves=3,
        done=1,
        total=3,
        current=("g1",),
        pending=("g2",),
        names=("g0", "g1", "g2"),
        restarted=("g0",),
        old_config=("g1",),
    )
    return replace(snap, instances=(*snap.instances, waiting, backing_off), rollout=rollout)


def test_the_rollout_and_each_wait_are_series():
    got = samples(render(with_rollout_and_waits()).decode())
    assert got[("vsup_rollout_running", ())] == 1
    assert got[("vsup_rollout_interrupted", ())] == 0 and got[("vsup_rollout_failed", ())] == 0
    assert (got[("vsup_rollout_wave", ())], got[("vsup_rollout_waves", ())]) == (2, 3)
    assert (got[("vsup_rollout_done", ())], got[("vsup_rollout_total", ())]) == (1, 3)
    assert got[("vsup_rollout_old_config", ())] == 1
    assert got[("vsup_rollout_state", (("state", "running"),))] == 1
    assert got[("vsup_rollout_state", (("state", "interrupted"),))] == 0
    assert got[("vsup_instance_waiting", (("kind", "gpu_memory"), ("name", "g1")))] == 1
    assert got[("vsup_instance_waiting", (("kind", "co_tenant"), ("name", "g1")))] == 0
    assert got[("vsup_instance_waiting", (("kind", "backoff"), ("name", "g2")))] == 1
    assert got[("vsup_instance_waiting", (("kind", "backoff"), ("name", "g0")))] == 0
    assert got[("vsup_instance_wait_seconds_remaining", (("name", "g2"),))] == 12.0
    assert got[("vsup_instance_outdated", (("name", "g1"),))] == 1
    assert got[("vsup_instance_outdated", (("name", "g2"),))] == 0
    assert ("vsup_instance_outdated", (("name", "g0"),)) not in got  # unknown: left out
    assert not any(
        name.startswith("vsup_rollout") for name, _ in samples(render(snapshot()).decode())
    )


async def test_the_exposition_is_rendered_once_per_snapshot_whatever_the_scrapers(
    port, monkeypatch
):
    import asyncio

    import vsup.control.export as export

    built = []
    real = export.snapshot_metrics
    monkeypatch.setattr(export, "snapshot_metrics", lambda s: (built.append(s), real(s))[1])  # type: ignore[func-returns-value]  # a spy
    snap = {"now": snapshot()}
    listener = MetricsListener(lambda: snap["now"])
    await listener.start(f"127.0.0.1:{port}")
    try:
        limits = httpx.Limits(max_connections=16)
        async with httpx.AsyncClient(limits=limits) as http:
            url = f"http://127.0.0.1:{port}/metrics"
            answers = await asyncio.gather(*(http.get(url) for _ in range(48)))
            assert {a.status_code for a in answers} == {200}
            assert len({a.content for a in answers}) == 1
            assert len(built) == 1  # 48 scrapes (16 at a time), one render
            snap["now"] = with_rollout_and_waits()  # the next poll's snapshot
            again = await asyncio.gather(*(http.get(url) for _ in range(16)))
            assert "vsup_rollout_running 1.0" in again[0].text
            assert len(built) == 2
    finally:
        await listener.stop()
