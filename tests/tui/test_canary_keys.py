"""The canary's keys on the dashboard (docs/canary.md, docs/dashboard.md): `P` promote and `A`
abort are in the footer only while a canary is watched, ask first, and send what `vsup rollout
promote|abort` sends; --readonly disables them."""

from __future__ import annotations

import dataclasses

from textual.widgets import Footer

from vsup.snapshot import RolloutStatus
from vsup.tui.screens.confirm import ConfirmScreen
from vsup.tui.screens.dashboard import Dashboard

from tests.support import samples
from tests.tui.conftest import make_app, make_client, settle

WATCHING = RolloutStatus(
    state="running",
    wave=1,
    waves=2,
    done=0,
    total=2,
    current=(),
    pending=("cpu1",),
    names=("cpu0", "cpu1"),
    old_config=("cpu1",),
    canary=("cpu0",),
    canary_s=600.0,
    canary_state="watching",
)


def footer_keys(app) -> set[str]:
    """The keys the footer shows now (as Textual offers them to it)."""
    return {
        ab.binding.key
        for ab in app.screen.active_bindings.values()
        if ab.binding.show and ab.enabled
    }


async def test_canary_keys_show_only_while_watched_ask_first_and_promote_or_abort():
    plain = samples.cpu_node()
    client = make_client(plain)
    app = make_app(client)
    async with app.run_test(size=(160, 45)) as pilot:
        await settle(pilot, lambda: app.renders >= 1)
        assert app.screen.query_one(Footer)
        assert not {"P", "A"} & footer_keys(app)
        await pilot.press("P")  # nothing watched: the key does nothing
        assert isinstance(app.screen, Dashboard) and client.calls_to("rollout") == []

        client.snapshot = dataclasses.replace(plain, rollout=WATCHING)
        renders = app.renders
        app.tick()
        await settle(pilot, lambda: app.renders > renders and {"P", "A"} <= footer_keys(app))
        await pilot.press("P")
        assert isinstance(app.screen, ConfirmScreen) and "cpu0" in app.screen.question
        await pilot.press("n")
        assert client.calls_to("rollout") == []
        await pilot.press("P", "y")
        await settle(pilot, lambda: client.calls_to("rollout"))
        await pilot.press("A", "y")
        await settle(pilot, lambda: len(client.calls_to("rollout")) == 2)
        assert client.calls_to("rollout") == [{"action": "promote"}, {"action": "abort"}]

        done = dataclasses.replace(WATCHING, state="done", canary_state="passed")
        client.snapshot = dataclasses.replace(plain, rollout=done)
        renders = app.renders
        app.tick()
        await settle(pilot, lambda: app.renders > renders and not {"P", "A"} & footer_keys(app))


async def test_readonly_shows_the_canary_keys_disabled():
    client = make_client(dataclasses.replace(samples.cpu_node(), rollout=WATCHING))
    app = make_app(client, readonly=True)
    async with app.run_test(size=(160, 45)) as pilot:
        await settle(pilot, lambda: app.renders >= 1)
        shown = {ab.binding.key: ab for ab in app.screen.active_bindings.values()}
        assert "P" in shown and "A" in shown  # in the footer, dimmed
        assert not shown["P"].enabled and not shown["A"].enabled
        await pilot.press("P")
        assert isinstance(app.screen, Dashboard) and client.calls_to("rollout") == []
