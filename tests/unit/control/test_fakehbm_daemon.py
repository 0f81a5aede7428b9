"""The fake HBM through the whole daemon: emulators on GPU 0 write what they hold
(tests/programs/vllm_emulator.py --fake-hbm-file), `FakeHbmGpus.probe()` is the daemon's GPU
probe (the real NvmlProbe over the pynvml fake), and the status document attributes the memory
to each instance, a sleep's release included. The daemon's own sleep verb is not used here: the
emulator's /sleep is called directly, as an operator's curl would, so this checks only the
accounting path that sleep mode's tests build on."""

from __future__ import annotations

import asyncio
import json
import sys

import httpx
import pytest

from tests.unit.control.fakehbm import FakeHbmGpus, GiB
from tests.unit.control.helpers import EMULATOR, free_port

pytestmark = pytest.mark.timeout(120)


def layout(gpus: FakeHbmGpus, ports: dict[str, int]) -> str:
    cmd = json.dumps([sys.executable, str(EMULATOR)])
    text = f"""[layout]
name = "fakehbm"

[defaults]
model = "test/fake"
command = {cmd}
host = "127.0.0.1"
health_interval_s = 0.1
stop_grace_s = 5
gpu_memory_utilization = 0.45
"""
    for name, port in ports.items():
        text += f"""
[[instance]]
name = "{name}"
gpus = [0]
port = {port}
sleep = {{ level = 1 }}
args = {{ {gpus.toml_args(0, name, 60.0, keep_gib=1.5)} }}
"""
    return text


async def hbm_of(client, name: str) -> int | None:
    doc = await client.status()
    return next(i["hbm_bytes"] for i in doc["instances"] if i["name"] == name)


async def until_hbm(client, name: str, want: int, timeout: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while (got := await hbm_of(client, name)) != want:
        assert asyncio.get_running_loop().time() < deadline, f"{name}: hbm {got}, want {want}"
        await asyncio.sleep(0.1)


async def test_the_daemon_attributes_the_fake_hbm_and_sees_a_sleep_release_it(daemons, tmp_path):
    gpus = FakeHbmGpus(tmp_path / "hbm", count=1)
    ports = {"a": free_port(), "b": free_port()}
    daemon, client = await daemons.start(gpu_probe=gpus.probe())
    answer = await client.apply(layout(gpus, ports), "/tmp/fakehbm.toml")
    assert answer["applied"], answer
    for name in ports:
        assert await daemon.engine.wait(name, ("ready",), timeout=30) == "ready"
    await until_hbm(client, "a", 60 * GiB)
    await until_hbm(client, "b", 60 * GiB)
    doc = await client.status()
    gpu = doc["gpus"][0]
    assert {p["instance"] for p in gpu["processes"]} == {"a", "b"}
    assert gpu["hbm_used_bytes"] == 600 * 2**20 + 120 * GiB

    async with httpx.AsyncClient(trust_env=False) as http:
        # the sleep table gave b --enable-sleep-mode and VLLM_SERVER_DEV_MODE=1
        url = f"http://127.0.0.1:{ports['b']}"
        assert (await http.post(f"{url}/sleep", params={"level": 1})).status_code == 200
        await until_hbm(client, "b", int(1.5 * GiB))
        assert await hbm_of(client, "a") == 60 * GiB
        assert (await http.post(f"{url}/wake_up")).status_code == 200
        await until_hbm(client, "b", 60 * GiB)
