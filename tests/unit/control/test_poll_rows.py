"""A poll builds the status snapshot only when something reads it each poll (alerts, the
exporter, sleep mode, the router, a stall to start or follow); otherwise the next status request
builds it from the same telemetry (docs/benchmarks.md, 2026-12-06, later still). vLLM emulators
stand in for vLLM (`--mode-file`: the load they show)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.unit.control.helpers import free_port
from tests.unit.control.test_stall_daemon import events_of, layout, mode_files

pytestmark = pytest.mark.timeout(120)


def spy_builds(daemon, monkeypatch) -> list[int]:
    builds: list[int] = []
    real = daemon.build_snapshot
    monkeypatch.setattr(daemon, "build_snapshot", lambda: (builds.append(1), real())[1])  # type: ignore[func-returns-value]  # a spy
    return builds


async def ready(daemon, names) -> None:
    for name in names:
        assert await daemon.engine.wait(name, ("ready",), timeout=30) == "ready"


async def test_a_poll_nobody_reads_builds_no_snapshot_and_a_request_sees_it_fresh(
    daemons, tmp_path: Path, monkeypatch
) -> None:
    daemon, client = await daemons.start(poll_interval=3600)  # polls driven here
    modes = mode_files(tmp_path, a="serve", b="idle")
    assert (await client.apply(layout(modes), "/tmp/rows.toml"))["applied"]
    await ready(daemon, modes)
    builds = spy_builds(daemon, monkeypatch)
    for _ in range(3):
        assert await daemon.poll_once() is None
        await asyncio.sleep(0.2)
    assert builds == [], "a poll nobody reads built the snapshot"
    # a status request builds it once, from the latest poll's figures; the next one reuses it
    first = await client.status()
    assert len(builds) == 1
    figures = {i["name"]: i for i in first["instances"]}
    assert figures["a"]["kv_cache_usage"] is not None
    assert figures["a"]["kv_cache_usage"] == daemon.monitor.metrics("a").kv_cache_usage
    assert figures["b"]["requests_running"] == 0
    assert await client.status() == first
    assert len(builds) == 1
    # the next poll moves the figures on: the next request builds again and shows them
    await daemon.poll_once()
    again = await client.status()
    assert len(builds) == 2
    a = next(i for i in again["instances"] if i["name"] == "a")
    assert a["kv_cache_usage"] == daemon.monitor.metrics("a").kv_cache_usage


async def test_a_stall_is_still_journaled_by_a_poll_nobody_asked(
    daemons, tmp_path: Path, monkeypatch
) -> None:
    daemon, client = await daemons.start(poll_interval=0.2)
    modes = mode_files(tmp_path, a="serve", b="serve")
    assert (await client.apply(layout(modes), "/tmp/rows.toml"))["applied"]
    await ready(daemon, modes)
    builds = spy_builds(daemon, monkeypatch)
    await asyncio.sleep(1.0)
    assert builds == []  # nothing reads the polls
    modes["b"].write_text("stall")
    stalled = await events_of(client, "stalled", timeout=30)
    assert [e["instance"] for e in stalled] == ["b"]
    assert builds, "the poll that saw the stall built no snapshot"
    modes["b"].write_text("serve")
    cleared = await events_of(client, "stall_cleared", timeout=30)
    assert [e["instance"] for e in cleared] == ["b"]


@pytest.mark.parametrize("reader", ["alerts", "sleep", "exporter"])
async def test_each_reader_gets_a_snapshot_every_poll(
    daemons, tmp_path: Path, monkeypatch, reader: str
) -> None:
    daemon, client = await daemons.start(poll_interval=3600)
    modes = mode_files(tmp_path, a="serve")
    extra, more = "", None
    if reader == "alerts":
        monkeypatch.setenv("VSUP_TEST_HOOK", "http://127.0.0.1:9/hook")
        extra = '\n[alerts]\nwebhook_env = "VSUP_TEST_HOOK"\n'
    elif reader == "sleep":
        more = {"a": "sleep = { level = 1 }"}
    text = layout(modes, extra=extra, more=more)
    if reader == "exporter":
        text = text.replace(
            '[layout]\nname = "stalls"\n',
            f'[layout]\nname = "stalls"\nmetrics_listen = "127.0.0.1:{free_port()}"\n',
        )
    answer = await client.apply(text, "/tmp/rows.toml")
    assert answer["applied"], answer
    await ready(daemon, modes)
    builds = spy_builds(daemon, monkeypatch)
    for _ in range(2):
        assert await daemon.poll_once() is not None
    assert len(builds) == 2
