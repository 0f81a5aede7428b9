"""A worker someone else adds to the router, seen from a running daemon: the real vllm-router in
front of a vLLM emulator, a foreign server added through the router's open worker API
(`POST /add_worker`), and what the operator gets - the journal event, the `router` object's
`foreign_workers`, advice `router_foreign_worker`, and the alert on a webhook on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import pytest

from tests.programs.intruder import ForeignServer, add_worker, listed
from tests.unit.control.helpers import emulator_layout, free_port
from tests.unit.control.webhook_receiver import Receiver

ROUTER = Path(sys.executable).parent / "vllm-router"
pytestmark = pytest.mark.timeout(120)


async def until(check, what: str, timeout: float = 90.0):  # CI is shared and slow
    deadline = time.monotonic() + timeout
    while True:
        got = await check()
        if got:
            return got
        assert time.monotonic() < deadline, f"never saw {what}"
        await asyncio.sleep(0.05)


@pytest.mark.skipif(not ROUTER.exists(), reason="vllm-router (the router extra)")
async def test_a_foreign_worker_is_removed_journaled_advised_and_alerted(
    daemons, monkeypatch
) -> None:
    receiver = Receiver()
    monkeypatch.setenv("VSUP_TEST_HOOK", receiver.url)
    port = free_port()
    layout = emulator_layout({"a": free_port()}) + (
        f'\n[router]\nport = {port}\nmetrics_port = {free_port()}\npolicy = "round_robin"\n'
        f"command = {json.dumps([str(ROUTER)])}\n"
        '\n[alerts]\nwebhook_env = "VSUP_TEST_HOOK"\nkinds = ["router_foreign_worker"]\n'
    )
    base = f"http://127.0.0.1:{port}"
    try:
        _daemon, client = await daemons.start()
        answer = await client.apply(layout, "/tmp/fakes.toml")
        assert answer["applied"], answer
        # no [router] host: loopback, and no warning about an open worker API
        assert not any("worker API" in w["message"] for w in answer["warnings"])

        async def serving() -> bool:
            router = (await client.status())["router"]
            return router["state"] == "ready" and all(w["in_router"] for w in router["workers"])

        await until(serving, "the router serving a")
        async with ForeignServer(free_port()) as intruder:
            assert await add_worker(base, intruder.url) == 200
            await until(
                lambda: _absent(base, intruder.url), "the foreign worker removed", timeout=5
            )

            async def advised() -> list[dict]:
                doc = await client.status()
                return [a for a in doc["advice"] if a["kind"] == "router_foreign_worker"]

            (advice,) = await until(advised, "advice router_foreign_worker")
        assert advice["severity"] == "critical" and intruder.url in advice["message"]
        assert f"127.0.0.1:{port}" in advice["message"]
        router = (await client.status())["router"]
        (shown,) = router["foreign_workers"]
        # the router drops a worker asynchronously: a sync in between can remove it again
        assert shown["url"] == intruder.url and 1 <= shown["removals"] <= 3
        events = (await client.events()).to_json()["events"]
        (event,) = [e for e in events if e["kind"] == "router_foreign_worker"]
        assert event["url"] == intruder.url and event["router"] == port

        async def alerted() -> list[str]:
            return [t for t in receiver.texts if "router_foreign_worker" in t]

        (text,) = await until(alerted, "the alert")
        assert "CRITICAL router_foreign_worker" in text and intruder.url in text
    finally:
        receiver.close()


async def _absent(base: str, url: str) -> bool:
    return url not in await listed(base)


async def test_a_router_on_every_address_is_a_warning_that_names_the_open_worker_api(
    daemons,
) -> None:
    layout = emulator_layout({"a": free_port()}) + (
        f'\n[router]\nport = {free_port()}\nhost = "0.0.0.0"\ncommand = ["vllm-router"]\n'
    )
    _daemon, client = await daemons.start()
    answer = await client.apply(layout, "/tmp/fakes.toml", dry_run=True)
    (warning,) = [w for w in answer["warnings"] if w.get("key") == "host"]
    assert "worker API (POST /add_worker) has no authentication" in warning["message"]
    assert warning["table"] == "[router]"
