"""A stalled instance on the dashboard: a red `⏸ stall` in its row's state cell, the side
panel's title and first line say what runs and waits and since when, and the advice shows."""

from __future__ import annotations

import dataclasses

from vsup.control.advice import stalled
from vsup.tui.widgets.detail import DetailTabs, SidePanel
from vsup.tui.widgets.instances import InstanceTable

from tests.support import samples
from tests.tui.conftest import make_app, make_client, settle


def _plain(widget) -> str:
    content = widget.content
    return getattr(content, "plain", str(content))


async def test_a_stalled_row_is_marked_and_the_detail_says_why():
    snap = samples.cpu_node()
    first = sorted(snap.instances, key=lambda i: i.name)[0]
    stuck = first.with_wire(
        state="ready",
        requests_running=3.0,
        requests_waiting=5.0,
        stalled=True,
        stalled_since="2026-12-01T04:10:00Z",
        stalled_for_s=72.0,
    )
    instances = tuple(stuck if i.name == first.name else i for i in snap.instances)
    snap = dataclasses.replace(snap, instances=instances, advice=tuple(stalled(stuck)))
    app = make_app(make_client(snap))
    async with app.run_test(size=(160, 45)) as pilot:
        await settle(pilot, lambda: app.selected == first.name)
        table = app.screen.query_one(InstanceTable)
        cell = table.get_cell(first.name, "state")
        assert cell.plain == "⏸ stall 1m12s" and "red" in str(cell.style)
        others = [i.name for i in instances if i.name != first.name]
        assert all("stall" not in table.get_cell(n, "state").plain for n in others)
        side = app.screen.query_one(SidePanel)
        assert side.border_title == f"{first.name} · ⏸ stall 1m12s"
        line = _plain(side.query_one("#exit-line"))
        assert line.startswith("stalled 1m12s: 3 running, 5 waiting, no token since 04:10:00Z")
        assert "0 tokens processed for 72 s" in _plain(side.query_one("#advice"))
        assert "stalled 1m12s" in _plain(app.screen.query_one(DetailTabs).query_one("#exit"))
