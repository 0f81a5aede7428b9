"""Stall detection end to end in a running daemon, on vLLM emulators told what load to show
(`--mode-file`: stall, idle, prefill, serve, frozen-idle): the flag, the advice, the events, the
alert, `restart.on_stall` through the engine's restart policy, and a freeze that began while
idle, seen through /load (load tracking) or the canary (without it)."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import httpx
import pytest

from vsup.telemetry.metrics import parse_metrics

from tests.unit.control.helpers import EMULATOR, free_port, instance, until
from tests.unit.control.webhook_receiver import Receiver

pytestmark = pytest.mark.timeout(120)
STALL_AFTER_S = 2


def layout(
    modes: dict[str, Path],
    extra: str = "",
    restart: str = "",
    args: str = "",
    more: dict[str, str] | None = None,
) -> str:
    cmd = json.dumps([sys.executable, str(EMULATOR)])
    text = f"""[layout]
name = "stalls"

[defaults]
model = "test/fake"
command = {cmd}
host = "127.0.0.1"
health_interval_s = 0.1
stop_grace_s = 5
stall_after_s = {STALL_AFTER_S}
restart = {{ policy = "on-failure", backoff_s = 0.2, backoff_max_s = 1, stable_s = 60, max_failures = 3{restart} }}
"""
    for name, mode in modes.items():
        text += f"""
[[instance]]
name = "{name}"
gpus = []
port = {free_port()}
args = {{ mode-file = "{mode}"{args} }}
{(more or {}).get(name, "")}
"""
    return text + extra


def mode_files(tmp_path: Path, **modes: str) -> dict[str, Path]:
    out = {}
    for name, mode in modes.items():
        out[name] = tmp_path / f"{name}.mode"
        out[name].write_text(mode)
    return out


async def events_of(client, kind: str, at_least: int = 1, timeout: float = 10.0) -> list[dict]:
    """The journal's events of `kind`, once there are `at_least` (the daemon acts on a flag at
    its next poll; the status API builds its answer at once)."""
    deadline = time.monotonic() + timeout
    while True:
        found = [e for e in (await client.events()).to_json()["events"] if e["kind"] == kind]
        if len(found) >= at_least or time.monotonic() > deadline:
            return found
        await asyncio.sleep(0.1)


async def test_a_hung_engine_is_flagged_advised_alerted_and_clears(
    daemons, tmp_path, monkeypatch
) -> None:
    receiver = Receiver()
    monkeypatch.setenv("VSUP_TEST_HOOK", receiver.url)
    try:
        _daemon, client = await daemons.start()
        modes = mode_files(tmp_path, a="serve")
        alerts = (
            '\n[alerts]\nwebhook_env = "VSUP_TEST_HOOK"\nkinds = ["stalled"]\nresolve_after_s = 0\n'
        )
        await client.apply(layout(modes, alerts), str(tmp_path / "l.toml"))
        ready = await until(client, "a", lambda i: i["state"] == "ready" and i["stalled"] is False)
        assert ready["stalled_since"] is None and ready["stalled_for_s"] is None

        modes["a"].write_text("stall")
        t0 = time.monotonic()
        stalled = await until(client, "a", lambda i: i["stalled"])
        took = time.monotonic() - t0
        # not before stall_after_s from the last scrape that saw tokens (one poll, 0.2 s,
        # before the cue at most): a lower bound. How late after it is a machine's speed.
        assert took >= STALL_AFTER_S - 0.5, took
        assert stalled["state"] == "ready"
        assert stalled["requests_running"] == 3 and stalled["requests_waiting"] == 5
        assert stalled["stalled_for_s"] >= STALL_AFTER_S and stalled["stalled_since"]
        doc = await client.status()
        (advice,) = [a for a in doc["advice"] if a["kind"] == "stalled"]
        assert advice["instance"] == "a" and "3 running, 5 waiting" in advice["message"]
        (event,) = await events_of(client, "stalled")
        assert event["instance"] == "a" and event["on_stall"] is False
        assert event["requests_waiting"] == 5 and event["stall_after_s"] == STALL_AFTER_S
        for _ in range(100):
            if any("stalled" in t for t in receiver.texts):
                break
            await asyncio.sleep(0.1)
        assert any("CRITICAL stalled: a: stalled: 3 running" in t for t in receiver.texts)

        modes["a"].write_text("serve")
        await until(client, "a", lambda i: i["stalled"] is False)
        (cleared,) = await events_of(client, "stall_cleared")
        assert cleared["why"] == "progress" and cleared["lasted_s"] >= STALL_AFTER_S
        assert not [a for a in (await client.status())["advice"] if a["kind"] == "stalled"]
        assert (await instance(client, "a"))["restarts"] == 0  # on_stall is off by default
        for _ in range(100):
            if any("resolved" in t.lower() for t in receiver.texts):
                break
            await asyncio.sleep(0.1)
        assert any("resolved" in t.lower() and "stalled" in t for t in receiver.texts)
    finally:
        receiver.close()


async def test_idle_and_long_prefill_are_not_stalls(daemons, tmp_path) -> None:
    _daemon, client = await daemons.start()
    modes = mode_files(tmp_path, idle="serve", prefill="serve", hung="serve")
    await client.apply(layout(modes), str(tmp_path / "l.toml"))
    for name in modes:
        await until(client, name, lambda i: i["state"] == "ready" and i["stalled"] is False)
    modes["idle"].write_text("idle")
    modes["prefill"].write_text("prefill")
    modes["hung"].write_text("stall")  # the same setup, hung: the control case
    deadline = time.monotonic() + 3 * STALL_AFTER_S + 1
    seen: dict[str, set] = {n: set() for n in modes}
    while time.monotonic() < deadline:
        for inst in (await client.status())["instances"]:
            seen[inst["name"]].add(inst["stalled"])
        await asyncio.sleep(0.2)
    assert seen["idle"] == {False}
    assert seen["prefill"] == {False}
    assert True in seen["hung"]
    idle, prefill = await instance(client, "idle"), await instance(client, "prefill")
    assert (idle["requests_running"], idle["requests_waiting"]) == (0, 0)
    assert prefill["requests_running"] == 1
    # what the prefill looks like to vsup: token counters flat, KV usage creeping up
    a, b = await scrape(prefill["port"]), await scrape(prefill["port"])
    assert a.generation_tokens_total == b.generation_tokens_total
    assert a.prompt_tokens_total == b.prompt_tokens_total
    assert (b.kv_cache_usage or 0) > (a.kv_cache_usage or 0)


async def scrape(port: int):
    async with httpx.AsyncClient(trust_env=False) as http:
        answer = await http.get(f"http://127.0.0.1:{port}/metrics")
    return parse_metrics(answer.text)


async def test_on_stall_restarts_through_the_restart_policy_until_the_breaker_trips(
    daemons, tmp_path
) -> None:
    daemon, client = await daemons.start()
    modes = mode_files(tmp_path, a="serve")
    await client.apply(layout(modes, restart=", on_stall = true"), str(tmp_path / "l.toml"))
    first = await until(client, "a", lambda i: i["state"] == "ready")
    modes["a"].write_text("stall")  # every run of it hangs: restarts, then the breaker
    failed = await until(client, "a", lambda i: i["state"] == "failed", timeout=60)
    assert failed["last_exit"]["reason"] == "stalled"
    assert failed["restarts"] == 2 and "max_failures = 3" in failed["failed_why"]
    assert failed["run"] == first["run"] + 2
    restarts = await events_of(client, "stall_restart", 3)
    assert [e["run"] for e in restarts] == [1, 2, 3]
    assert "no token processed" in restarts[0]["why"]
    exits = await events_of(client, "exit", 3)
    assert [e["reason"] for e in exits] == ["stalled"] * 3
    scheduled = await events_of(client, "restart_scheduled", 2)
    assert [e["reason"] for e in scheduled] == ["stalled"] * 2
    (fail,) = await events_of(client, "failed")
    assert fail["reason"] == "stalled"
    assert len(await events_of(client, "stalled", 3)) == 3
    doc = await client.status()
    assert [a["kind"] for a in doc["advice"] if a["instance"] == "a"] == ["crash_loop"]

    modes["a"].write_text("serve")  # a person fixed it and starts it: it serves again
    await client.action("start", ["a"])
    await daemon.engine.wait("a", ("ready",), timeout=20)
    await asyncio.sleep(STALL_AFTER_S + 1)
    inst = await instance(client, "a")
    assert inst["state"] == "ready" and inst["stalled"] is False


async def test_a_freeze_while_idle_is_seen_through_load_or_the_canary(daemons, tmp_path) -> None:
    # `frozen-idle`: the gauges say idle, the API server holds 3 requests, completions hang
    _daemon, client = await daemons.start()
    tracked = mode_files(tmp_path, tracked="serve")
    await client.apply(layout(tracked), str(tmp_path / "l.toml"))
    ready = await until(
        client, "tracked", lambda i: i["state"] == "ready" and i["stalled"] is False
    )
    assert ready["load_tracking"] is True  # vsup added the flag (the venv's vLLM has it)
    cfg = await client.config("tracked")
    assert "--enable-server-load-tracking" in cfg["argv"]
    tracked["tracked"].write_text("idle")
    await until(client, "tracked", lambda i: i["requests_in_flight"] == 0)
    tracked["tracked"].write_text("frozen-idle")
    t0 = time.monotonic()
    stalled = await until(client, "tracked", lambda i: i["stalled"])
    assert time.monotonic() - t0 >= STALL_AFTER_S - 0.5
    assert stalled["stall_evidence"] == "server" and stalled["requests_in_flight"] == 3
    assert (stalled["requests_running"], stalled["requests_waiting"]) == (0, 0)
    (advice,) = [a for a in (await client.status())["advice"] if a["kind"] == "stalled"]
    assert "3 requests in flight at the API server and none at the engine" in advice["message"]
    (event,) = await events_of(client, "stalled")
    assert event["evidence"] == "server" and event["requests_in_flight"] == 3
    tracked["tracked"].write_text("serve")
    await until(client, "tracked", lambda i: i["stalled"] is False)

    # without load tracking the same freeze shows nothing, unless a canary goes there
    modes = mode_files(tmp_path, blind="idle", canary="idle")
    off = ", enable-server-load-tracking = false"
    text = layout(modes, args=off, more={"canary": "canary_interval_s = 1"})
    await client.apply(text, str(tmp_path / "l2.toml"))
    for name in modes:
        inst = await until(client, name, lambda i: i["state"] == "ready" and i["stalled"] is False)
        assert inst["load_tracking"] is False and inst["requests_in_flight"] is None
    for name in modes:
        modes[name].write_text("frozen-idle")
    stalled = await until(client, "canary", lambda i: i["stalled"], timeout=30)
    assert stalled["stall_evidence"] == "canary"
    assert (await instance(client, "blind"))["stalled"] is False  # the blind spot, without both
    modes["canary"].write_text("idle")
    await until(client, "canary", lambda i: i["stalled"] is False, timeout=30)


ROUTER = Path(sys.executable).parent / "vllm-router"


@pytest.mark.skipif(not ROUTER.exists(), reason="vllm-router (the router extra)")
async def test_a_stalled_instance_leaves_the_router_and_rejoins_when_it_clears(
    daemons, tmp_path
) -> None:
    """The real vllm-router in front of two emulators: a stall takes its instance out of the
    router's workers (no new request for a hung engine), progress puts it back."""
    from vsup.router import RouterClient

    _daemon, client = await daemons.start()
    modes = mode_files(tmp_path, a="serve", b="serve")
    port = free_port()
    router = f"""
[router]
port = {port}
metrics_port = {free_port()}
host = "127.0.0.1"
policy = "round_robin"
command = {json.dumps([str(ROUTER)])}
"""
    await client.apply(layout(modes, router), str(tmp_path / "l.toml"))
    for name in ("a", "b"):
        await until(client, name, lambda i: i["state"] == "ready" and i["stalled"] is False)
    urls = {
        i["name"]: f"http://127.0.0.1:{i['port']}" for i in (await client.status())["instances"]
    }
    rc = RouterClient(f"http://127.0.0.1:{port}")

    async def workers_become(want: set[str], timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        got: set[str] = set()
        while time.monotonic() < deadline:
            try:
                got = {u.rstrip("/") for u in await rc.list_workers()}
            except Exception:
                got = set()
            if got == want:
                return
            await asyncio.sleep(0.1)
        raise AssertionError(f"router workers {got}, wanted {want}")

    try:
        await workers_become({urls["a"], urls["b"]})
        modes["a"].write_text("stall")
        await until(client, "a", lambda i: i["stalled"])
        await workers_become({urls["b"]}, timeout=5)  # at once, not at the 10 s recheck
        assert (await instance(client, "a"))["state"] == "ready"  # flagged, not ended
        modes["a"].write_text("serve")
        await until(client, "a", lambda i: i["stalled"] is False)
        await workers_become({urls["a"], urls["b"]}, timeout=5)
    finally:
        await rc.aclose()
