"""A swap at vLLM's floor (docs/sleep.md, "Where a swap's time goes"): the sleep reads the GPU
itself while it awaits the release (not the telemetry's once-a-second sample), leaves the router
without a settle wait, drains only while requests run, and every sleep, wake and swap says
where its time went (`phases`), in its answer and its journal event. On vLLM emulators with a
fake HBM that the real NvmlProbe reads (tests/unit/control/fakehbm.py)."""

from __future__ import annotations

import asyncio
import json
import sys

import httpx
import pytest

from vsup.engine import sleep as sleep_engine

from tests.unit.control.fakehbm import FakeHbmGpus
from tests.unit.control.helpers import EMULATOR, free_port, instance, until
from tests.unit.control.test_sleep_daemon import Member, asleep, awake, events, layout

pytestmark = pytest.mark.timeout(180)
GiB = 2**30
SLEEP_PHASES = ["leave_router_s", "drain_s", "sleep_call_s", "release_seen_s"]
WAKE_PHASES = ["wake_call_s", "first_answer_s", "rejoin_s"]


async def test_a_swap_sees_the_release_on_the_gpu_and_says_where_its_time_went(
    daemons, tmp_path, monkeypatch
) -> None:
    gpus = FakeHbmGpus(tmp_path / "hbm", count=2)
    daemon, client = await daemons.start(gpu_probe=gpus.probe())
    answer = await client.apply(
        layout(gpus, {"a": Member(), "b": Member()}), str(tmp_path / "l.toml")
    )
    assert answer.get("applied"), answer
    await until(client, "a", lambda i: awake(i) and i["hbm_bytes"] == 64 * GiB)
    await until(client, "b", asleep)

    # the telemetry's sample stands still from now on (as a 1 Hz sampler does between its
    # polls): only a read of the GPU itself can see a's memory go
    engine = daemon.engine
    frozen = engine.gpu_memory((0,))
    monkeypatch.setattr(engine, "gpu_memory", lambda gpus_: frozen)
    # and the router's removal is watched: no settle wait when nothing runs
    leaves: list[dict] = []
    leave = engine.router.leave

    async def watched(name: str, **kw) -> None:
        leaves.append({"name": name, **kw})
        await leave(name, **kw)

    monkeypatch.setattr(engine.router, "leave", watched)
    monkeypatch.setattr(sleep_engine, "RELEASE_TIMEOUT_S", 2.0)  # today's 30 s, shortened

    answer = await client.action("swap", ["a", "b"])
    assert answer["errors"] == [], answer
    result = answer["result"]
    assert result["slept"]["held_bytes"] == int(1.7 * GiB), result
    assert asleep(await instance(client, "a")) and awake(await instance(client, "b"))
    assert (await instance(client, "a"))["sleep"]["error"] is None
    assert leaves == [{"name": "a"}], leaves
    # where the time went: the sleep's steps, then the wake's, each a figure in seconds
    assert list(result["slept"]["phases"]) == SLEEP_PHASES, result["slept"]
    assert list(result["woke"]["phases"]) == WAKE_PHASES, result["woke"]
    assert list(result["phases"]) == SLEEP_PHASES + WAKE_PHASES, result
    assert all(v >= 0 for v in result["phases"].values()), result
    assert sum(result["phases"].values()) <= result["took_s"] + 0.01, result
    (swap,) = await events(client, "swap")
    assert swap["phases"] == result["phases"], swap
    sleep_event = [e for e in await events(client, "sleep") if e["instance"] == "a"][-1]
    assert sleep_event["phases"] == result["slept"]["phases"], sleep_event
    assert sleep_event["held_after"] == int(1.7 * GiB) and sleep_event["error"] is None
    wake_event = [e for e in await events(client, "wake") if e["instance"] == "b"][-1]
    assert wake_event["phases"] == result["woke"]["phases"], wake_event


async def test_a_sleep_drains_the_requests_that_run_then_sleeps(daemons, tmp_path) -> None:
    gpus = FakeHbmGpus(tmp_path / "hbm", count=2)
    _daemon, client = await daemons.start(gpu_probe=gpus.probe())
    # completions answered 1 s after they come, counted by /load; the drain may wait 20 s
    members = {"s": Member(group=False, args='request-s = "1", enable-server-load-tracking = true')}
    text = layout(gpus, members).replace("drain_timeout_s = 2", "drain_timeout_s = 20")
    answer = await client.apply(text, str(tmp_path / "l.toml"))
    assert answer.get("applied"), answer
    s = await until(client, "s", awake)
    url = f"http://127.0.0.1:{s['port']}/v1/completions"
    async with httpx.AsyncClient(timeout=60) as http:
        running = asyncio.create_task(http.post(url, json={"model": "test/fake", "prompt": "x"}))
        await until(client, "s", lambda i: True)  # one status round trip: the request is in
        await asyncio.sleep(0.2)
        answer = await client.action("sleep", ["s"])
        assert answer["errors"] == [], answer
        reply = await running
    # the request ended before the sleep, answered (not held by a sleeping server)
    assert reply.status_code == 200
    phases = answer["result"]["phases"]
    assert list(phases) == SLEEP_PHASES, phases
    assert phases["drain_s"] > 0, phases
    assert asleep(await instance(client, "s"))


async def test_a_sleeper_shows_no_rate_of_its_last_awake_seconds(daemons, tmp_path) -> None:
    gpus = FakeHbmGpus(tmp_path / "hbm", count=2)
    _daemon, client = await daemons.start(gpu_probe=gpus.probe())
    answer = await client.apply(layout(gpus, {"s": Member(group=False)}), str(tmp_path / "l.toml"))
    assert answer.get("applied"), answer
    await until(client, "s", awake)
    mode = gpus.root / "s.mode"
    mode.write_text("serve")  # tokens flow: a rate over the last 10 s
    await until(client, "s", lambda i: (i["generation_tokens_per_s"] or 0) > 0)
    mode.write_text("idle")  # nothing runs (the drain has nothing to wait for)
    answer = await client.action("sleep", ["s"])
    assert answer["errors"] == [], answer
    s = await instance(client, "s")
    # the counters stand still while it sleeps, but the rate window still holds the seconds
    # before the sleep: a sleeper serves nothing, and says so
    assert asleep(s), s["sleep"]
    assert s["generation_tokens_per_s"] == 0.0, s["generation_tokens_per_s"]
    assert s["prompt_tokens_per_s"] == 0.0 and s["preemptions_per_min"] == 0.0, s
    answer = await client.action("wake", ["s"])
    assert answer["errors"] == [], answer
    mode.write_text("serve")
    await until(client, "s", lambda i: awake(i) and (i["generation_tokens_per_s"] or 0) > 0)


def leaking_layout(gpus: FakeHbmGpus) -> str:
    """`s` on GPU 0 and `r` on GPU 1, each sleep of either leaving 1 GiB more held for good
    (memory vLLM did not give back); `r` is recycled once it kept 1.5 GiB more than after its
    first sleep."""
    cmd = json.dumps([sys.executable, str(EMULATOR)])
    text = f"""[layout]
name = "leaks"

[defaults]
model = "test/fake"
command = {cmd}
host = "127.0.0.1"
health_interval_s = 0.1
stop_grace_s = 5
drain_timeout_s = 2
"""
    for gpu, (name, sleep) in enumerate(
        [("s", "{ level = 1 }"), ("r", "{ level = 1, recycle_growth_gib = 1.5 }")]
    ):
        mode = gpus.root / f"{name}.mode"
        mode.write_text("idle")
        args = gpus.toml_args(gpu, name, 64.0, 1.7) + f', mode-file = "{mode}"'
        args += ', sleep-leak-gib = "1"'
        text += f"""
[[instance]]
name = "{name}"
port = {free_port()}
args = {{ {args} }}
gpus = [{gpu}]
gpu_memory_utilization = 0.9
sleep = {sleep}
"""
    return text


async def test_what_each_sleep_keeps_is_recorded_its_growth_advised_and_recycled(
    daemons, tmp_path
) -> None:
    gpus = FakeHbmGpus(tmp_path / "hbm", count=2)
    _daemon, client = await daemons.start(gpu_probe=gpus.probe())
    answer = await client.apply(leaking_layout(gpus), str(tmp_path / "l.toml"))
    assert answer.get("applied"), answer
    await until(client, "s", awake)
    r0 = await until(client, "r", awake)
    # after the 1st, 2nd, 3rd sleep (each one's leak included)
    kept = [int(1.7 * GiB) + (n + 1) * GiB for n in range(3)]

    for n in range(2):
        if n:
            for name in ("s", "r"):
                assert (await client.action("wake", [name]))["errors"] == []
        for name in ("s", "r"):
            answer = await client.action("sleep", [name])
            assert answer["errors"] == [], answer
    s = await instance(client, "s")
    assert s["sleep"]["kept_bytes"] == kept[:2], s["sleep"]
    assert s["sleep"]["kept_growth_bytes"] == GiB
    # the growth is advised (1 GiB: the advice's threshold), not yet recycled (r: 1.5 GiB)
    doc = await client.status()
    grows = [a for a in doc["advice"] if a["kind"] == "sleep_kept_grows"]
    assert {a["instance"] for a in grows} == {"s", "r"}, grows
    assert "1.0 GiB more than after its first sleep (2 sleeps)" in grows[0]["message"], grows
    assert (await instance(client, "r"))["pid"] == r0["pid"]

    # a third sleep: r kept 2 GiB more than after its first, past its 1.5: restarted while
    # it sleeps, and back asleep with only what a first sleep keeps
    for name in ("s", "r"):
        assert (await client.action("wake", [name]))["errors"] == []
        assert (await client.action("sleep", [name]))["errors"] == []
    r = await until(
        client, "r", lambda i: i["pid"] not in (None, r0["pid"]) and asleep(i), timeout=60
    )
    assert r["sleep"]["kept_bytes"] == kept[:1], r["sleep"]
    assert r["sleep"]["kept_growth_bytes"] is None
    s = await instance(client, "s")  # no recycle_growth_gib: kept as it is, advised
    assert s["sleep"]["kept_bytes"] == kept and s["pid"] is not None
    doc = await client.status()
    grows = [a for a in doc["advice"] if a["kind"] == "sleep_kept_grows"]
    assert [a["instance"] for a in grows] == ["s"], grows


def test_the_sleep_line_says_how_much_more_it_keeps() -> None:
    from vsup.sleepview import detail_line
    from vsup.snapshot import SleepStatus
    from vsup.states import SleepState

    kept = (int(1.7 * GiB), int(2.7 * GiB), int(3.7 * GiB))
    s = SleepStatus(
        state=SleepState.ASLEEP,
        level=1,
        held_bytes=kept[-1],
        kept_bytes=kept,
        kept_growth_bytes=2 * GiB,
    )
    line = detail_line(s)
    assert "keeps 3.7 GiB of GPU memory · kept +2.0 GiB since its first sleep (3 sleeps)" in line
