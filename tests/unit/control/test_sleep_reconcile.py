"""vsup's view of a sleep follows the server's when vsup did not see the sleep happen (issue 35,
item 4; docs/sleep.md "Starts, deaths, daemon restarts"): a sleep or wake sent to the server by
someone else, and a sleep that ends after a new daemon adopted the server. On vLLM emulators
(tests/programs/vllm_emulator.py: vLLM's dev-mode sleep endpoints and its sleep-state gauge).
The same on real CPU vLLM, with the daemon SIGKILLed while vLLM does its sleep:
tests/integration/test_sleep_vllm.py."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.unit.control.fakehbm import FakeHbmGpus
from tests.unit.control.helpers import instance, until
from tests.unit.control.test_sleep_daemon import Member, asleep, awake, is_sleeping, layout

pytestmark = pytest.mark.timeout(180)


async def post(client, name: str, path: str) -> int:
    port = (await instance(client, name))["port"]
    async with httpx.AsyncClient(timeout=60) as http:
        return (await http.post(f"http://127.0.0.1:{port}{path}")).status_code


async def test_a_sleep_and_a_wake_sent_by_someone_else_show_in_the_status(daemons, tmp_path):
    gpus = FakeHbmGpus(tmp_path / "hbm", count=2)
    _daemon, client = await daemons.start(gpu_probe=gpus.probe())
    answer = await client.apply(layout(gpus, {"a": Member(group=False)}), str(tmp_path / "l.toml"))
    assert answer.get("applied"), answer
    await until(client, "a", awake)
    # another user of the dev-mode endpoints puts it to sleep at level 2
    assert await post(client, "a", "/sleep?level=2") == 200
    a = await until(client, "a", asleep, 30)
    assert a["sleep"]["level"] == 2, a["sleep"]  # read from vLLM's gauge: the wake reloads
    # vsup wakes it (level 2: weights, reload_weights, KV cache)
    answer = await client.action("wake", ["a"])
    assert answer["errors"] == [], answer
    assert awake(await instance(client, "a")) and not await is_sleeping(client, "a")
    # and a wake sent by someone else shows too
    assert await post(client, "a", "/sleep?level=1") == 200
    await until(client, "a", asleep, 30)
    assert await post(client, "a", "/wake_up") == 200
    await until(client, "a", awake, 30)


async def test_a_sleep_that_ends_after_a_new_daemon_adopted_the_server_shows(daemons, tmp_path):
    gpus = FakeHbmGpus(tmp_path / "hbm", count=2)
    daemon, client = await daemons.start(gpu_probe=gpus.probe())
    members = {"a": Member(group=False, args="sleep-s = 3")}
    answer = await client.apply(layout(gpus, members), str(tmp_path / "l.toml"))
    assert answer.get("applied"), answer
    first = await until(client, "a", awake)
    port = first["port"]
    await daemons.stop(daemon)  # its instances go on
    async with httpx.AsyncClient(timeout=60) as http:
        # a sleep under way (the emulator answers /is_sleeping false for its 3 s, then true)
        sleep = asyncio.create_task(http.post(f"http://127.0.0.1:{port}/sleep?level=1"))
        await asyncio.sleep(0.3)
        _daemon2, client = await daemons.start(gpu_probe=gpus.probe())
        assert (await sleep).status_code == 200
    a = await until(client, "a", asleep, 30)
    assert a["pid"] == first["pid"] and a["restarts"] == 0
    answer = await client.action("wake", ["a"])
    assert answer["errors"] == [], answer
    assert awake(await instance(client, "a")) and not await is_sleeping(client, "a")
