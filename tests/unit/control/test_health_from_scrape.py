"""A ready instance's `/health` check rides on its telemetry scrape: the scrape asks /health,
/load and /metrics together on one kept-alive connection (pipelined), and the engine takes that
answer as its check instead of a request of its own (the daemon's CPU at 64 and 128 instances:
docs/benchmarks.md). The emulator logs which connection carried each request."""

from __future__ import annotations

import asyncio
import time

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
