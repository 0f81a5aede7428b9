"""A server across nodes as one row of the fleet dashboard (docs/fleet.md, "Seen as one
row"): the fleet client's units of its last poll, first in the list under the nodes, with
the unit's state, its members and, when it is not ready, the advice."""

from __future__ import annotations

import asyncio

from textual.widgets import DataTable

from vsup.fleet.model import loads_fleet
from vsup.fleet.units import MemberState, MemberView, UnitView
from vsup.fleet.view import NodeView
from vsup.tui.fleet_app import FleetApp
from vsup.tui.screens.fleet import FleetScreen

FLEET = loads_fleet(
    '[fleet]\nname = "prod"\n'
    + "".join(f'[[node]]\nname = "{n}"\nssh = "{n}"\n' for n in ("gpu01", "gpu02"))
)
M = MemberState


def unit(follower: MemberState, detail: str | None = None, advice: str | None = None):
    state = M.READY if follower == M.READY else M.DOWN
    return UnitView(
        instance="big",
        head="gpu01",
        address="10.0.0.1",
        port=8000,
        size=2,
        members=(
            MemberView("gpu01", True, 0, 1, M.READY),
            MemberView("gpu02", False, 1, 1, follower),
        ),
        state=state,
        detail=detail,
        advice=advice,
    )


class FakeFleet:
    """Two polls: the unit ready, then its follower's node unreachable."""

    def __init__(self) -> None:
        self.answers = [
            (
                [
                    NodeView("gpu01", "gpu01", True, True, 1, 1),
                    NodeView("gpu02", "gpu02", True, True, 1, 1),
                ],
                [unit(M.READY)],
            ),
            (
                [
                    NodeView("gpu01", "gpu01", True, True, 1, 1),
                    NodeView("gpu02", "gpu02", False, error="ssh: refused"),
                ],
                [
                    unit(
                        M.UNREACHABLE,
                        "gpu02 unreachable",
                        "gpu02 (a follower, rank 1) cannot be reached over SSH",
                    )
                ],
            ),
        ]
        self.polls = 0
        self.units: list[UnitView] = []

    async def status_all(self, nodes=None):
        self.polls += 1
        views, self.units = self.answers[min(self.polls, len(self.answers)) - 1]
        return views

    async def aclose(self) -> None:
        pass


def test_the_unit_is_one_row_with_its_members_and_its_advice_when_it_is_down():
    async def scenario() -> None:
        fake = FakeFleet()
        app = FleetApp(FLEET, refresh_s=3600, fleet_client=fake)  # type: ignore[arg-type]
        async with app.run_test(size=(200, 40)) as pilot:
            for _ in range(100):
                if app.fleet_polls:
                    break
                await pilot.pause(0.05)
            screen = app.screen
            assert isinstance(screen, FleetScreen)
            alerts = screen.query_one("#alerts", DataTable)
            assert alerts.row_count == 1
            row = [c.plain for c in alerts.get_row_at(0)]
            assert row[:3] == ["gpu01+gpu02", "info", "server across nodes big"], row
            assert row[3] == "ready · gpu01 (head, rank 0) ready; gpu02 (rank 1) ready", row

            await pilot.press("r")
            for _ in range(100):
                if app.fleet_polls >= 2:
                    break
                await pilot.pause(0.05)
            first = [c.plain for c in alerts.get_row_at(0)]
            assert first[:3] == ["gpu01+gpu02", "critical", "server across nodes big"], first
            assert first[3].startswith(
                "down: gpu02 unreachable · gpu01 (head, rank 0) ready; gpu02 (rank 1) "
                "unreachable · gpu02 (a follower, rank 1) cannot be reached over SSH"
            ), first
            # the node itself is down too, below the unit
            assert [c.plain for c in alerts.get_row_at(1)][:3] == [
                "gpu02",
                "critical",
                "unreachable",
            ]
            await pilot.press("q")

    asyncio.run(scenario())
