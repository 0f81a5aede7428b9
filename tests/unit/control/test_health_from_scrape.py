"""A ready instance's `/health` check rides on its telemetry scrape: the scrape asks /health,
/load and /metrics together on one kept-alive connection (pipelined), and the engine takes that
answer as its check instead of a request of its own (the daemon's CPU at 64 and 128 instances:
docs/benchmarks.md). The emulator logs which connection carried each request."""

from __future__ import annotations

import asyncio
import time

import psutil

from tests.unit.control.helpers import emulator_layout, free_port


def requests(log) -> list[tuple[int, str]]:
    if not log.exists():
        return []
    out = []
    for line in log.read_text().splitlines():
        conn, _, path = line.partition(" ")
        out.append((int(conn), path))
    return out


async def test_a_ready_instance_is_checked_through_its_scrape_with_no_health_request_of_its_own(
    daemons, tmp_path
):
    log = tmp_path / "requests.log"
    daemon, client = await daemons.start()  # polls every 0.2 s
    layout = emulator_layout({"a": free_port()}, args=f'args = {{ request-log = "{log}" }}')
    layout = layout.replace("health_interval_s = 0.1", "health_interval_s = 0.5")
    await client.apply(layout, "/tmp/fakes.toml")
    assert await daemon.engine.wait("a", ("ready",), timeout=30) == "ready"
    start = len(requests(log))
    deadline = time.monotonic() + 60
    while True:  # at least 4 health-loop periods of steady state
        tail = requests(log)[start:]
        if (
            sum(1 for _c, p in tail if p.startswith("/metrics")) >= 15
            or time.monotonic() > deadline
        ):
            break
        await asyncio.sleep(0.2)
    scrape_conns = {c for c, p in tail if p.startswith("/metrics")}
    with_scrape = [c for c, p in tail if p == "/health" and c in scrape_conns]
    own = [c for c, p in tail if p == "/health" and c not in scrape_conns]
    assert sum(1 for _c, p in tail if p.startswith("/metrics")) >= 15, tail
    # the scrape asks /health on the /metrics connection, once per scrape
    assert len(with_scrape) >= 15, tail
    # the health loop (every 0.5 s, each time a scrape answered since its last check) asks
    # nothing itself; a scrape that came late under load may leave it one check of its own
    assert len(own) <= 2, tail
    status = (await client.status())["instances"][0]
    assert status["state"] == "ready"


async def test_an_engine_that_dies_while_its_checks_ride_on_scrapes_is_unhealthy_and_restarted(
    daemons, tmp_path
):
    """The health loop sleeps for several intervals while the scrapes answer 200 for it; the
    503 of a dead engine, answered to a scrape, wakes it, and the run ends as vLLM's would."""
    log = tmp_path / "requests.log"
    daemon, client = await daemons.start()
    args = f'args = {{ request-log = "{log}", engine-child = true, dead-exit-after = 60 }}'
    layout = emulator_layout({"a": free_port()}, args=args)
    await client.apply(
        layout.replace("health_interval_s = 0.1", "health_interval_s = 0.5"), "/tmp/fakes.toml"
    )
    assert await daemon.engine.wait("a", ("ready",), timeout=30) == "ready"
    start = len(requests(log))
    while sum(1 for _c, p in requests(log)[start:] if p.startswith("/metrics")) < 10:
        await asyncio.sleep(0.2)  # the steady state: scrapes answer, the loop naps
    inst = daemon.engine.instances["a"]
    server, run = inst.pid, inst.run
    (core,) = psutil.Process(server).children()  # the EngineCore (--engine-child)
    core.kill()
    assert await daemon.engine.wait("a", ("unhealthy", "backoff", "starting"), timeout=30)
    assert await daemon.engine.wait("a", ("ready",), timeout=30) == "ready"
    assert inst.run == run + 1 and inst.pid != server
    last = inst.lifecycle.last_exit
    assert last is not None and last.reason == "engine_dead", last
