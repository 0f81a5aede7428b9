"""vLLM's sleep mode in a running daemon (docs/sleep.md), on vLLM emulators with faithful sleep
endpoints and a fake HBM that the real NvmlProbe reads (tests/unit/control/fakehbm.py): the
swap group's start order, sleep and wake with the memory seen released, swap, the faults (a wake
that answers 500, a sleep that keeps the memory, a sleep while requests run), a daemon restart
while one sleeps, and a sleeper that dies while its group mate is awake."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from dataclasses import dataclass

import httpx
import pytest

from vsup.engine import sleep as sleep_engine

from tests.unit.control.fakehbm import FakeHbmGpus
from tests.unit.control.helpers import EMULATOR, free_port, instance, until

pytestmark = pytest.mark.timeout(180)
GiB = 2**30


@dataclass
class Member:
    group: bool = True  # in swap group g0 (GPU 0); else alone on GPU 1
    sleep: bool = True  # has a sleep table
    args: str = ""  # more emulator flags, TOML inline-table items
    cpu: bool = False


def layout(gpus: FakeHbmGpus, members: dict[str, Member], util: float = 0.9) -> str:
    """Emulators that hold 64 GiB awake and 1.7 GiB asleep in their fake HBM; a swap group
    of two at 0.9 of one GPU validates (it counts by its largest member, docs/layout.md)."""
    cmd = json.dumps([sys.executable, str(EMULATOR)])
    text = f"""[layout]
name = "sleepers"

[defaults]
model = "test/fake"
command = {cmd}
host = "127.0.0.1"
health_interval_s = 0.1
stop_grace_s = 5
drain_timeout_s = 2
restart = {{ policy = "on-failure", backoff_s = 0.2, backoff_max_s = 1, stable_s = 60, max_failures = 3 }}
"""
    for name, m in members.items():
        gpu = 0 if m.group else 1
        # idle figures (the emulator's default `serve` shows requests running all the time,
        # which a sleep's drain would wait for); its own completions still count in /load
        mode = gpus.root / f"{name}.mode"
        mode.write_text("idle")
        args = gpus.toml_args(gpu, name, 64.0, 1.7) + f', mode-file = "{mode}"'
        args += f", {m.args}" if m.args else ""
        text += f"""
[[instance]]
name = "{name}"
port = {free_port()}
args = {{ {args} }}
"""
        text += "gpus = []\n" if m.cpu else f"gpus = [{gpu}]\ngpu_memory_utilization = {util}\n"
        if m.group:
            text += 'swap_group = "g0"\n'
        if m.sleep:
            text += "sleep = { level = 1 }\n"
    return text


async def events(client, kind: str) -> list[dict]:
    return [e for e in (await client.events()).to_json()["events"] if e["kind"] == kind]


def asleep(i: dict) -> bool:
    return i["state"] == "ready" and (i["sleep"] or {}).get("state") == "asleep"


def awake(i: dict) -> bool:
    return i["state"] == "ready" and (i["sleep"] or {}).get("state") == "awake"


async def is_sleeping(client, name: str) -> bool:
    port = (await instance(client, name))["port"]
    async with httpx.AsyncClient() as http:
        return (await http.get(f"http://127.0.0.1:{port}/is_sleeping")).json()["is_sleeping"]


async def test_a_group_starts_one_awake_and_swaps_with_the_memory_seen_released(
    daemons, tmp_path
) -> None:
    gpus = FakeHbmGpus(tmp_path / "hbm", count=2)
    _daemon, client = await daemons.start(gpu_probe=gpus.probe())
    answer = await client.apply(
        layout(gpus, {"a": Member(), "b": Member()}), str(tmp_path / "l.toml")
    )
    assert answer.get("applied"), answer
    a = await until(client, "a", awake)
    b = await until(client, "b", asleep)
    assert a["sleep"]["group"] == "g0" and b["sleep"]["level"] == 1
    # b started first and slept before a's start: vLLM profiles the free memory at its start
    spawns = [e["instance"] for e in await events(client, "spawn")]
    assert spawns == ["b", "a"], spawns
    (slept,) = await events(client, "sleep")
    assert slept["instance"] == "b" and slept["why"] == "started asleep"
    assert slept["held_before"] == 64 * GiB and slept["held_after"] == int(1.7 * GiB)
    assert b["sleep"]["held_bytes"] == int(1.7 * GiB) and b["hbm_bytes"] == int(1.7 * GiB)
    a = await until(client, "a", lambda i: i["hbm_bytes"] is not None)  # the next poll's
    assert a["hbm_bytes"] == 64 * GiB and a["sleep"]["held_bytes"] is None

    answer = await client.action("swap", ["a", "b"])
    assert answer["errors"] == [], answer
    result = answer["result"]
    assert result["slept"]["instance"] == "a" and result["woke"]["instance"] == "b"
    assert result["slept"]["held_bytes"] == int(1.7 * GiB)
    a, b = await instance(client, "a"), await instance(client, "b")
    assert asleep(a) and awake(b), (a["sleep"], b["sleep"])
    assert a["sleep"]["last_sleep_s"] is not None and b["sleep"]["last_wake_s"] is not None
    assert await is_sleeping(client, "a") and not await is_sleeping(client, "b")
    # the held bytes follow the emulators' fake HBM on the next poll
    b = await until(client, "b", lambda i: i["hbm_bytes"] == 64 * GiB)
    (swap,) = await events(client, "swap")
    assert swap["instance"] == "b" and swap["slept"] == "a" and swap["took_s"] > 0

    # waking the sleeper puts the awake member to sleep first
    answer = await client.action("wake", ["a"])
    assert answer["errors"] == [], answer
    assert awake(await instance(client, "a")) and asleep(await instance(client, "b"))
    last = (await events(client, "sleep"))[-1]
    assert last["instance"] == "b" and last["why"] == "a wakes in swap group g0"
    # level 2 on request: the wake reloads the weights
    answer = await client.action("sleep", ["a"], level=2)
    assert answer["errors"] == [] and answer["result"]["level"] == 2, answer
    answer = await client.action("wake", ["a"])
    assert answer["errors"] == [], answer
    assert awake(await instance(client, "a"))
    doc = await client.status()
    assert not [x for x in doc["advice"] if x["kind"] == "sleep_failed"], doc["advice"]


async def test_refusals_and_faults_leave_a_clear_state(daemons, tmp_path, monkeypatch) -> None:
    gpus = FakeHbmGpus(tmp_path / "hbm", count=2)
    daemon, client = await daemons.start(gpu_probe=gpus.probe())
    members = {
        "a": Member(),
        "b": Member(args='wake-fail = "1"'),
        # on GPU 1, no group: its sleep answers 200 and keeps the memory (some ROCm builds)
        "k": Member(group=False, args="sleep-keeps-memory = true"),
        "plain": Member(group=False, sleep=False, cpu=True),
    }
    text = layout(gpus, members)
    answer = await client.apply(text, str(tmp_path / "l.toml"))
    assert answer.get("applied"), answer
    for name in ("a", "k"):
        await until(client, name, awake)
    await until(client, "b", asleep)

    # a wake that answers 500: b stays asleep with the error, a is woken again
    answer = await client.action("swap", ["a", "b"])
    (err,) = answer["errors"]
    assert "b did not wake" in err["error"] and "HTTP 500" in err["error"], err
    assert "a is awake again" in err["error"], err
    a, b = await instance(client, "a"), await instance(client, "b")
    assert awake(a) and asleep(b), (a["sleep"], b["sleep"])
    assert b["sleep"]["error"].startswith("wake failed"), b["sleep"]
    doc = await client.status()
    (advice,) = [x for x in doc["advice"] if x["kind"] == "sleep_failed"]
    assert advice["instance"] == "b" and advice["severity"] == "critical", advice
    (failed,) = await events(client, "wake_failed")
    assert failed["instance"] == "b" and "500" in failed["error"]
    # the emulator fails one wake only: the next swap works and clears the error
    answer = await client.action("swap", ["a", "b"])
    assert answer["errors"] == [], answer
    b = await instance(client, "b")
    assert awake(b) and b["sleep"]["error"] is None

    # a sleep that keeps the memory: asleep (vLLM says so), with the error and the advice.
    # The sleeper gives up on the release after RELEASE_TIMEOUT_S (30 s); k never releases,
    # so this daemon (in this process) waits 2 s instead of waiting the 30 s out.
    with monkeypatch.context() as patch:
        patch.setattr(sleep_engine, "RELEASE_TIMEOUT_S", 2.0)
        answer = await client.action("sleep", ["k"])
    (err,) = answer["errors"]
    assert "GPU memory was not released" in err["error"], err
    k = await instance(client, "k")
    assert asleep(k) and "not released" in k["sleep"]["error"]
    doc = await client.status()
    assert any(x["kind"] == "sleep_failed" and x["instance"] == "k" for x in doc["advice"])

    # a level-1 sleep without the host RAM for the weights: refused before anything happens
    daemon.engine.sleeper.weights_of = lambda name: 60 * GiB
    daemon.engine.sleeper.host_available = lambda: 20 * GiB
    answer = await client.action("sleep", ["b"])  # b is the group's awake member now
    (err,) = answer["errors"]
    assert "copies its 60.0 GiB of weights to host RAM and only 20.0 GiB" in err["error"], err
    assert "--level 2" in err["error"] and awake(await instance(client, "b"))
    answer = await client.action("sleep", ["b"], level=2)  # level 2 needs no host RAM
    assert answer["errors"] == [], answer
    daemon.engine.sleeper.weights_of = lambda name: None

    # no sleep table: refused, naming it
    answer = await client.action("sleep", ["plain"])
    (err,) = answer["errors"]
    assert "plain does not use sleep mode" in err["error"], err


async def test_a_sleep_while_requests_run_waits_then_refuses(daemons, tmp_path) -> None:
    gpus = FakeHbmGpus(tmp_path / "hbm", count=2)
    _daemon, client = await daemons.start(gpu_probe=gpus.probe())
    # completions answered 4 s after they come, counted by /load only (on their way into the
    # engine, or a count vLLM never took back)
    members = {"s": Member(group=False, args='request-s = "4", enable-server-load-tracking = true')}
    answer = await client.apply(layout(gpus, members), str(tmp_path / "l.toml"))
    assert answer.get("applied"), answer
    s = await until(client, "s", awake)
    mode = gpus.root / "s.mode"

    # the engine runs a request (a long prefill) past drain_timeout_s = 2: refused, awake
    mode.write_text("prefill")
    answer = await client.action("sleep", ["s"])
    (err,) = answer["errors"]
    assert "still runs 1 request(s) after 2 s" in err["error"], err
    assert "nothing slept" in err["error"], err
    s = await instance(client, "s")
    assert awake(s) and s["sleep"]["error"].startswith("sleep failed"), s["sleep"]
    (failed,) = await events(client, "sleep_failed")
    assert failed["instance"] == "s"

    # /load above 0 while the engine holds nothing: it sleeps, and the request is held by
    # the sleeping server and answered after the wake, not lost
    mode.write_text("idle")
    url = f"http://127.0.0.1:{s['port']}/v1/completions"
    async with httpx.AsyncClient(timeout=60) as http:
        held = asyncio.create_task(http.post(url, json={"model": "test/fake", "prompt": "x"}))
        await asyncio.sleep(0.5)
        answer = await client.action("sleep", ["s"])
        assert answer["errors"] == [], answer
        drains = [e for e in await events(client, "drain") if e["instance"] == "s"]
        assert drains and "sleeps anyway" in drains[-1]["why"], drains
        answer = await client.action("wake", ["s"])
        assert answer["errors"] == [], answer
        assert (await held).status_code == 200


async def test_a_new_daemon_keeps_the_sleeper_asleep_and_a_dead_sleeper_waits_for_its_wake(
    daemons, tmp_path
) -> None:
    gpus = FakeHbmGpus(tmp_path / "hbm", count=2)
    daemon, client = await daemons.start(gpu_probe=gpus.probe())
    answer = await client.apply(
        layout(gpus, {"a": Member(), "b": Member()}), str(tmp_path / "l.toml")
    )
    assert answer.get("applied"), answer
    await until(client, "a", awake)
    b = await until(client, "b", asleep)
    await daemons.stop(daemon)  # like SIGTERM: the instances go on
    _daemon2, client = await daemons.start(gpu_probe=gpus.probe())
    b2 = await until(client, "b", lambda i: i["pid"] == b["pid"] and asleep(i))
    assert b2["restarts"] == 0
    assert awake(await instance(client, "a"))

    # b dies asleep: its restart waits while a is awake (vLLM would profile a full GPU)
    os.kill(b["pid"], signal.SIGKILL)
    waiting = await until(
        client, "b", lambda i: (i.get("wait") or {}).get("kind") == "swap_group", 30
    )
    assert "a is awake in swap group g0" in waiting["wait"]["message"], waiting["wait"]
    assert waiting["pid"] is None
    # waking it puts a to sleep and starts b cold, awake
    answer = await client.action("wake", ["b"])
    seen = [
        (e["kind"], e.get("instance"), e.get("to") or e.get("reason") or e.get("why"))
        for e in (await client.events()).to_json()["events"]
        if e.get("instance") == "b" or e["kind"] in ("sleep", "wake")
    ]
    assert answer["errors"] == [], (answer, seen)
    assert answer["result"]["cold"] is True
    b3 = await instance(client, "b")
    assert awake(b3) and b3["pid"] not in (None, b["pid"])
    assert asleep(await instance(client, "a"))
