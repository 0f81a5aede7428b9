"""A member someone else removes from the router, seen from a running daemon: the real
vllm-router in front of a vLLM emulator, the member removed through the router's open worker API
(`POST /remove_worker`), and what the operator gets - the member back in the router at once, the
journal event, the `router` object's `removed_workers`, advice `router_worker_removed` and the
alert on a webhook on 127.0.0.1. (Another user's remove loop against real vLLM, and the requests
it fails: tests/integration/router/test_router_vsup.py.)"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.unit.control.helpers import emulator_layout, free_port
from tests.unit.control.test_router_foreign_daemon import until
from tests.unit.control.webhook_receiver import Receiver

ROUTER = Path(sys.executable).parent / "vllm-router"
pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not ROUTER.exists(), reason="vllm-router (the router extra)"),
]


async def test_a_member_someone_removes_is_put_back_journaled_advised_and_alerted(
    daemons, monkeypatch
) -> None:
    receiver = Receiver()
    monkeypatch.setenv("VSUP_TEST_HOOK", receiver.url)
    port, member_port = free_port(), free_port()
    layout = emulator_layout({"a": member_port}) + (
        f'\n[router]\nport = {port}\nmetrics_port = {free_port()}\npolicy = "round_robin"\n'
        f"command = {json.dumps([str(ROUTER)])}\n"
        '\n[alerts]\nwebhook_env = "VSUP_TEST_HOOK"\nkinds = ["router_worker_removed"]\n'
    )
    base, member = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{member_port}"
    try:
        _daemon, client = await daemons.start()
        answer = await client.apply(layout, "/tmp/fakes.toml")
        assert answer["applied"], answer

        async def serving() -> bool:
            router = (await client.status())["router"]
            return router["state"] == "ready" and all(w["in_router"] for w in router["workers"])

        await until(serving, "the router serving a")
        async with httpx.AsyncClient(timeout=10) as http:
            resp = await http.post(f"{base}/remove_worker", params={"url": member})
            assert resp.status_code == 200, resp.text
            removed = time.monotonic()
            while member not in await _list(http, base):  # the watch puts it back
                assert time.monotonic() - removed < 10, "the member was not put back"
                await asyncio.sleep(0.005)
            back_s = time.monotonic() - removed

        async def advised() -> list[dict]:
            doc = await client.status()
            return [a for a in doc["advice"] if a["kind"] == "router_worker_removed"]

        (advice,) = await until(advised, "advice router_worker_removed")
        assert advice["severity"] == "critical"
        assert member in advice["message"] and f"127.0.0.1:{port}" in advice["message"]
        assert "someone removed" in advice["message"] and " a " in advice["message"]
        router = (await client.status())["router"]
        (shown,) = router["removed_workers"]
        assert shown["url"] == member and shown["name"] == "a" and shown["restores"] == 1
        assert router["foreign_workers"] == []
        events = (await client.events()).to_json()["events"]
        (event,) = [e for e in events if e["kind"] == "router_worker_removed"]
        assert event["url"] == member and event["router"] == port and event["restores"] == 1
        # putting it back is the incident's, not a membership change of vsup's own
        assert not [e for e in events if e["kind"] == "router_workers" and e.get("remove")]

        async def alerted() -> list[str]:
            return [t for t in receiver.texts if "router_worker_removed" in t]

        (text,) = await until(alerted, "the alert")
        assert "CRITICAL router_worker_removed" in text and member in text
        print(f"\na member removed through the worker API was back after {back_s * 1000:.0f} ms")
    finally:
        receiver.close()


async def _list(http: httpx.AsyncClient, base: str) -> list[str]:
    return list((await http.get(f"{base}/list_workers")).json()["urls"])
