"""Eviction by memory (docs/sleep.md): sleep-mode instances that share a GPU without a swap
group are awake together while their memory fits; waking one puts the least recently used
awake ones to sleep until it fits - never one still running requests (its drain must end
first, else it is passed over). On vLLM emulators whose fake HBM the real NvmlProbe reads
(tests/unit/control/fakehbm.py): three servers of 64 GiB on a 139.8 GiB GPU, two fit."""

from __future__ import annotations

import json
import sys

import pytest

from tests.unit.control.fakehbm import FakeHbmGpus
from tests.unit.control.helpers import EMULATOR, free_port, instance, until
from tests.unit.control.test_sleep_daemon import asleep, awake, events

pytestmark = pytest.mark.timeout(180)
GiB = 2**30


def pool_layout(gpus: FakeHbmGpus, names: list[str]) -> str:
    cmd = json.dumps([sys.executable, str(EMULATOR)])
    text = f"""[layout]
name = "pool"

[defaults]
model = "test/fake"
command = {cmd}
host = "127.0.0.1"
health_interval_s = 0.1
stop_grace_s = 5
drain_timeout_s = 2
"""
    for name in names:
        mode = gpus.root / f"{name}.mode"
        mode.write_text("idle")
        args = gpus.toml_args(0, name, 64.0, 1.7) + f', mode-file = "{mode}"'
        text += f"""
[[instance]]
name = "{name}"
port = {free_port()}
args = {{ {args} }}
gpus = [0]
gpu_memory_utilization = 0.45
sleep = {{ level = 1 }}
"""
    return text


async def test_waking_one_puts_the_least_recently_used_idle_one_to_sleep(daemons, tmp_path) -> None:
    gpus = FakeHbmGpus(tmp_path / "hbm", count=1)
    _daemon, client = await daemons.start(gpu_probe=gpus.probe())
    answer = await client.apply(pool_layout(gpus, ["p0", "p1", "p2"]), str(tmp_path / "l.toml"))
    assert answer.get("applied"), answer
    # two fit awake (0.45 + 0.45 of the GPU), the third starts first and sleeps
    await until(client, "p0", awake)
    await until(client, "p1", awake)
    await until(client, "p2", asleep)
    spawns = [e["instance"] for e in await events(client, "spawn")]
    assert spawns[0] == "p2", spawns
    assert sum(gpus.held(0).values()) == int((64 + 64 + 1.7) * GiB)

    # the least recently used is the one that started, woke or had work longest ago: p0
    # started before p1
    answer = await client.action("wake", ["p2"])
    assert answer["errors"] == [], answer
    evicted = [s["instance"] for s in answer["result"]["group_slept"]]
    assert evicted == ["p0"], answer["result"]
    assert awake(await instance(client, "p1")) and awake(await instance(client, "p2"))
    p0 = await instance(client, "p0")
    assert asleep(p0) and p0["sleep"]["held_bytes"] == int(1.7 * GiB), p0["sleep"]
    (slept,) = [e for e in await events(client, "sleep") if e["instance"] == "p0"]
    assert "p2 wakes: least recently used" in slept["why"], slept
    assert sum(gpus.held(0).values()) == int((64 + 64 + 1.7) * GiB)

    # p2 just woke, p1 started before that: p1 goes
    answer = await client.action("wake", ["p0"])
    assert answer["errors"] == [], answer
    assert [s["instance"] for s in answer["result"]["group_slept"]] == ["p1"], answer
    assert asleep(await instance(client, "p1")) and awake(await instance(client, "p2"))

    # the least recently used (p2) runs a request past its drain_timeout_s: it is passed
    # over, awake, and the next one (p0) sleeps instead
    (gpus.root / "p2.mode").write_text("prefill")
    answer = await client.action("wake", ["p1"])
    assert answer["errors"] == [], answer
    assert [s["instance"] for s in answer["result"]["group_slept"]] == ["p0"], answer
    assert awake(await instance(client, "p2")) and awake(await instance(client, "p1"))
    assert asleep(await instance(client, "p0"))

    # nothing left that can sleep (p2 and p1 both busy): the wake is refused, nothing moved
    (gpus.root / "p1.mode").write_text("prefill")
    answer = await client.action("wake", ["p0"])
    (err,) = answer["errors"]
    assert "p0 stays asleep: it needs" in err["error"], err
    assert "no awake instance there could be put to sleep" in err["error"], err
    assert "still runs 1 request(s)" in err["error"], err
    assert asleep(await instance(client, "p0"))
    assert awake(await instance(client, "p1")) and awake(await instance(client, "p2"))


async def test_without_a_read_of_the_gpu_the_shares_decide(daemons, tmp_path) -> None:
    gpus = FakeHbmGpus(tmp_path / "hbm", count=1)
    daemon, client = await daemons.start(gpu_probe=gpus.probe())
    answer = await client.apply(pool_layout(gpus, ["p0", "p1", "p2"]), str(tmp_path / "l.toml"))
    assert answer.get("applied"), answer
    await until(client, "p0", awake)
    await until(client, "p1", awake)
    await until(client, "p2", asleep)
    # the telemetry's once-a-second sample would not show an eviction a moment ago: without
    # a read of the GPU now, the utilizations count (0.45 x 3 > 0.95: one must sleep)
    daemon.engine.sleeper.gpu_memory_now = None
    answer = await client.action("wake", ["p2"])
    assert answer["errors"] == [], answer
    assert [s["instance"] for s in answer["result"]["group_slept"]] == ["p0"], answer
    assert awake(await instance(client, "p1")) and awake(await instance(client, "p2"))
