"""Put-backs do not wait behind each other: a member someone else removes while vsup is still
putting back another (the router answers that add only once the member answers its /health,
slow on a busy replica) is put back at once, not after the slow one. The real vllm-router in
front of two vLLM emulators, `a` answering /health only after 1.5 s. (How fast, under a remove
loop: benchmarks/router_putback.py; against real vLLM: tests/integration/router.)"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.unit.control.helpers import EMULATOR, free_port
from tests.unit.control.test_router_foreign_daemon import until

ROUTER = Path(sys.executable).parent / "vllm-router"
# vllm-router is part of the test environment (`make venv` installs the router extra): a missing
# one fails the test rather than skipping it
pytestmark = pytest.mark.timeout(120)
SLOW_HEALTH_S = 1.5


def layout(port: int, metrics_port: int, members: dict[str, int]) -> str:
    cmd = json.dumps([sys.executable, str(EMULATOR)])
    text = f"""[layout]
name = "putback"

[defaults]
model = "test/fake"
command = {cmd}
host = "127.0.0.1"
health_interval_s = 1.0
restart = {{ policy = "on-failure", backoff_s = 0.2, backoff_max_s = 1, max_failures = 3 }}

[router]
port = {port}
metrics_port = {metrics_port}
policy = "round_robin"
command = {json.dumps([str(ROUTER)])}
"""
    for name, member_port in members.items():
        args = f"args = {{ health-s = {SLOW_HEALTH_S} }}\n" if name == "a" else ""
        text += f'\n[[instance]]\nname = "{name}"\ngpus = []\nport = {member_port}\n{args}'
    return text


async def test_a_member_removed_during_a_slow_put_back_is_put_back_without_waiting_for_it(
    daemons,
) -> None:
    port = free_port()
    members = {"a": free_port(), "b": free_port()}
    base = f"http://127.0.0.1:{port}"
    a, b = (f"http://127.0.0.1:{p}" for p in members.values())
    _daemon, client = await daemons.start()
    answer = await client.apply(layout(port, free_port(), members), "/tmp/putback.toml")
    assert answer["applied"], answer

    async def serving() -> bool:
        router = (await client.status())["router"]
        return router["state"] == "ready" and all(w["in_router"] for w in router["workers"])

    await until(serving, "the router serving a and b", timeout=60)
    async with httpx.AsyncClient(timeout=10) as http:
        await _remove(http, base, a)
        # the watch (every 0.1 s) sees `a` missing and asks the router to add it back, which
        # the router answers only once `a` answers its /health, 1.5 s later
        await asyncio.sleep(0.5)
        await _remove(http, base, b)
        removed_b = time.monotonic()
        seen: list[list[str]] = []
        while a not in (listed := await _list(http, base)):
            seen.append(listed)
            assert time.monotonic() - removed_b < 30, "a was not put back"
            await asyncio.sleep(0.005)
    # b came back while a's put-back still waited for the router, not after it
    assert any(b in urls for urls in seen), f"b was back only with a: {seen[-3:]}"

    # the daemon records a put-back once the router's answer reaches it, which can be a
    # moment after the router lists the member again
    async def both_recorded() -> bool:
        removed = (await client.status())["router"]["removed_workers"]
        return {w["name"] for w in removed} == {"a", "b"}

    await until(both_recorded, "a and b both recorded as put back", timeout=30)
    events = (await client.events())["events"]
    assert sorted(e["url"] for e in events if e["kind"] == "router_worker_removed") == sorted(
        [a, b]
    )


async def _remove(http: httpx.AsyncClient, base: str, url: str) -> None:
    resp = await http.post(f"{base}/remove_worker", params={"url": url})
    assert resp.status_code == 200, resp.text


async def _list(http: httpx.AsyncClient, base: str) -> list[str]:
    return list((await http.get(f"{base}/list_workers")).json()["urls"])
