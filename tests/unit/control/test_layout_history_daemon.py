"""The daemon keeps what it applies for `vsup rollback` (GET /v1/layouts): each apply, newest
first, with the running text; kept across a new daemon; a bench's candidates left out. An
in-process daemon on a real socket; the layouts have no instance (nothing is spawned)."""

from __future__ import annotations

import os

import pytest

from vsup.lease import Lease, layout_sha, my_start_ticks, write_lease

pytestmark = pytest.mark.timeout(60)


def named(name: str) -> str:
    return f'[layout]\nname = "{name}"\nempty = true\n'


async def test_applies_are_kept_newest_first_across_daemons_without_a_benchs(daemons, vsup_home):
    daemon, client = await daemons.start()
    assert await client.layouts() == {"layouts": [], "running": None}
    first = await client.apply(named("a"), "/l/a.toml")
    assert first["applied"], first
    await client.apply(named("b"), "/l/b.toml", dry_run=True)  # a dry run is no apply
    await client.apply(named("b"), "/l/b.toml")
    # a bench (this process) applies its candidate, then the original again
    write_lease(
        vsup_home,
        Lease(
            owner="bench",
            pid=os.getpid(),
            start_ticks=my_start_ticks(),
            started_at="2026-12-06T01:00:00Z",
            original={"toml": named("b"), "path": "/l/b.toml", "name": "b"},
            layouts=[{"name": "c", "sha256": layout_sha(named("c"))}],
        ),
    )
    await client.apply(named("c"), "/l/c.toml")
    await client.apply(named("b"), "/l/b.toml")
    doc = await client.layouts()
    assert doc["running"] == named("b")
    assert [(k["name"], k["path"]) for k in doc["layouts"]] == [
        ("b", "/l/b.toml"),
        ("a", "/l/a.toml"),
    ]
    seqs = [k["seq"] for k in doc["layouts"]]
    events = {e["seq"]: e for e in (await client.events())["events"]}
    assert all(events[s]["action"] == "apply" and events[s]["t"] for s in seqs)

    await daemons.stop(daemon)
    _, client = await daemons.start()
    assert (await client.layouts())["layouts"] == doc["layouts"]
