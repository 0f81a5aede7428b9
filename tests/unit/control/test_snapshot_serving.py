"""How the daemon serves its snapshot: one build per poll (or per change), not per request;
and a rolling apply kept in the state file, reported `interrupted` by the next daemon with
what runs which spec, and finished by applying the layout again. vLLM emulators stand in for
vLLM (tests/programs/vllm_emulator.py)."""

from __future__ import annotations

import asyncio

import pytest

from vsup import paths
from vsup.control.state import StateFile

from tests.unit.control.helpers import emulator_layout, free_port

pytestmark = pytest.mark.timeout(120)


async def until(check, timeout: float = 30.0, what: str = "the condition"):
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        value = await check()
        if value:
            return value
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what} (last: {value!r})")
        await asyncio.sleep(0.05)


async def test_status_requests_are_served_the_latest_snapshot_without_a_rebuild(
    daemons, monkeypatch
):
    # one poll at start, then none: what a status request gets is the daemon's to choose
    daemon, client = await daemons.start(poll_interval=3600)
    text = emulator_layout({"a": free_port(), "b": free_port()})
    assert (await client.apply(text, "/tmp/fakes.toml"))["applied"]
    for name in ("a", "b"):
        assert await daemon.engine.wait(name, ("ready",), timeout=30) == "ready"
    builds: list[int] = []
    real = daemon.build_snapshot
    monkeypatch.setattr(daemon, "build_snapshot", lambda: (builds.append(1), real())[1])  # type: ignore[func-returns-value]  # a spy
    await client.status()  # the changes since the last build (the starts) are built once
    builds.clear()
    docs = [await client.status() for _ in range(20)]
    assert builds == [], "a status request rebuilt the snapshot although nothing changed"
    assert all(d == docs[0] for d in docs)
    assert [i["state"] for i in docs[0]["instances"]] == ["ready", "ready"]
    # a change is served at once (one build), then the same snapshot again
    await client.action("stop", ["b"])
    after = [await client.status() for _ in range(10)]
    assert len(builds) == 1
    assert [i["state"] for i in after[-1]["instances"]] == ["ready", "stopped"]


def layout(ports: dict[str, int], say: str) -> str:
    # the emulator always reports a request running: each drain lasts drain_timeout_s
    return emulator_layout(
        ports,
        extra_header="max_unavailable = 1\ndrain_timeout_s = 3",
        args=f'args = {{ say = "{say}" }}',
    )


async def test_a_rollout_cut_short_by_the_daemon_is_reported_interrupted_and_finished_by_up(
    daemons, vsup_home
):
    ports = {n: free_port() for n in ("a", "b", "c")}
    daemon, client = await daemons.start()
    assert (await client.apply(layout(ports, "v1"), "/tmp/v.toml"))["applied"]
    for name in ports:
        assert await daemon.engine.wait(name, ("ready",), timeout=30) == "ready"
    v2 = layout(ports, "v2")
    answer = await client.apply(v2, "/tmp/v.toml")
    assert answer["plan"]["rolling"] == ["a", "b", "c"]

    async def draining_a():
        doc = await client.status()
        r = doc["rollout"]
        return r and r["state"] == "running" and r["current"] == ["a"] and doc

    doc = await until(draining_a, what="wave 1 draining a")
    insts = {i["name"]: i for i in doc["instances"]}
    assert insts["b"]["outdated"] is True and insts["b"]["outdated_fields"] == ["args"]
    assert doc["rollout"]["old_config"] == ["a", "b", "c"]  # a drains: still its old process
    await daemons.stop(daemon)  # like SIGTERM: the instances keep running, unfinished
    saved = StateFile(paths.state_path(vsup_home)).load_quietly()
    assert saved is not None and saved.rollout is not None
    assert saved.rollout["names"] == ["a", "b", "c"] and saved.rollout["wave"] == 1

    daemon, client = await daemons.start()
    doc = await client.status()
    r = doc["rollout"]
    assert r["state"] == "interrupted" and r["interrupted_at"]
    insts = {i["name"]: i for i in doc["instances"]}
    old = [n for n in ("a", "b", "c") if insts[n]["outdated"]]
    assert "b" in old and "c" in old and r["old_config"] == old
    assert any(a["kind"] == "rollout_interrupted" and "b, c" in a["message"] for a in doc["advice"])
    events = (await client.events()).to_json()["events"]
    assert any(e["kind"] == "rollout" and e.get("state") == "interrupted" for e in events)

    # `vsup up` of the layout: the plan restarts what still runs the old spec
    answer = await client.apply(v2, "/tmp/v.toml")
    assert answer["plan"]["rolling"] == old

    async def finished():
        d = await client.status()
        return d["rollout"]["state"] == "done" and d

    doc = await until(finished, timeout=90, what="the resumed rollout to end")
    assert not any(i["outdated"] for i in doc["instances"])
    assert doc["rollout"]["old_config"] == []
    assert not any(a["kind"] == "rollout_interrupted" for a in doc["advice"])
    for name in ports:
        spec = (await client.config(name))["spec"]
        assert spec["args"]["say"] == "v2"
