"""The fleet screen with injected node views (the fleet client is the injection boundary; the
SSH side is tests/integration/fleet/): rows per node, a node down and why, every node's alerts
in one list with the most severe first, cells updated only where they changed."""

from __future__ import annotations

import asyncio

from textual.widgets import DataTable

from vsup.fleet.model import loads_fleet
from vsup.fleet.view import Alert, NodeView
from vsup.tui.fleet_app import FleetApp
from vsup.tui.screens.fleet import FleetScreen

FLEET = loads_fleet(
    '[fleet]\nname = "prod"\n'
    + "".join(f'[[node]]\nname = "{n}"\nssh = "{n}"\n' for n in ("gpu01", "gpu02", "gpu03"))
)


def views(tokens: float = 100.0) -> list[NodeView]:
    crash = Alert("gpu02", "critical", "crash_loop", "gpu5 crashed 3 times", "gpu5")
    hint = Alert("gpu02", "warning", "foreign_process", "pid 9 on GPU 1")
    return [
        NodeView(
            "gpu01",
            "gpu01",
            True,
            True,
            8,
            8,
            8,
            "NVIDIA H200",
            "nvidia",
            layout="l1",
            tokens_per_s=tokens,
            vsup_version="0.2.0",
            vllm_version="0.32.0",
        ),
        NodeView(
            "gpu02",
            "gpu02",
            True,
            True,
            7,
            8,
            8,
            "NVIDIA H200",
            "nvidia",
            layout="l1",
            alerts=2,
            worst=crash,
            advice=(hint, crash),
        ),
        NodeView(
            "gpu03",
            "gpu03",
            False,
            error="ssh gpu03: connect to host gpu03 port 22: Connection refused",
            since="2026-05-11T03:02:11Z",
        ),
    ]


class FakeFleet:
    def __init__(self) -> None:
        self.answers = [views(100.0), views(250.0)]
        self.polls = 0
        self.units: list = []  # no server across nodes (tests/tui/test_fleet_units.py)

    async def status_all(self, nodes=None):
        self.polls += 1
        return self.answers[min(self.polls, len(self.answers)) - 1]

    async def aclose(self) -> None:
        pass


def test_the_fleet_screen_shows_every_node_and_every_alert():
    async def scenario() -> None:
        fake = FakeFleet()
        app = FleetApp(FLEET, refresh_s=3600, fleet_client=fake)  # type: ignore[arg-type]
        async with app.run_test(size=(180, 40)) as pilot:
            for _ in range(100):
                if app.fleet_polls:
                    break
                await pilot.pause(0.05)
            screen = app.screen
            assert isinstance(screen, FleetScreen)
            table = screen.query_one("#nodes", DataTable)
            assert table.row_count == 3
            row = [c.plain for c in table.get_row("gpu03")]
            assert row[1] == "DOWN"
            assert [c.plain for c in table.get_row("gpu02")][1:5] == [
                "DEGRADED",
                "8 NVIDIA H200",
                "7/8",
                "2 crash_loop",
            ]
            alerts = screen.query_one("#alerts", DataTable)
            first = [c.plain for c in alerts.get_row_at(0)]
            assert first[:3] == ["gpu03", "critical", "unreachable"]
            kinds = [alerts.get_row_at(i)[2].plain for i in range(alerts.row_count)]
            assert kinds == ["unreachable", "crash_loop gpu5", "foreign_process"]
            title = screen.query_one("#title").render().plain
            assert "prod" in title and "2/3 nodes answer" in title and "15/16 ready" in title
            await pilot.press("r")  # a refresh now: only gpu01's tokens/s changed
            for _ in range(100):
                if app.fleet_polls >= 2:
                    break
                await pilot.pause(0.05)
            assert table.get_row("gpu01")[6].plain == "250.0"
            await pilot.press("q")
        assert fake.polls >= 2

    asyncio.run(scenario())
