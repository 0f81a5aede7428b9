"""`vsup fleet`: the fleet dashboard, and every node's own dashboard one Enter away.

`FleetApp` is the node dashboard (`DashboardApp`) with the fleet screen under it: a timer
schedules a worker that asks every node in parallel (`fleet.query.FleetClient`, each node under
its own deadline); the answer arrives as a message and the screen diffs it in. Enter makes (or
finds) the node's SSH tunnel in a worker, then `DashboardApp.attach` points the app at an
`AsyncClient` on the forwarded socket and pushes the node's Dashboard: the very screens a
node shows, talking to that node's daemon. `q` there comes back to the fleet.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from textual import on, work
from textual.message import Message
from textual.screen import Screen
from textual.timer import Timer
from textual.worker import Worker

from vsup.clock import Clock
from vsup.control.client import AsyncClient
from vsup.fleet.model import Fleet
from vsup.fleet.query import FleetClient
from vsup.fleet.units import UnitView
from vsup.fleet.view import NodeView
from vsup.tui.app import DashboardApp
from vsup.tui.client import DashboardClient
from vsup.tui.messages import (
    ConfigArrived,
    DaemonUnreachable,
    HistoryArrived,
    LogChunk,
    SnapshotArrived,
)
from vsup.tui.screens.fleet import FleetScreen

# workers that belong to an open node's dashboard (cancelled when going back to the fleet)
NODE_GROUPS = (
    "status", "log", "config", "history", "action", "layout-edit", "layout-save", "reconnect"
)  # fmt: skip


class NoNode:
    """The app's client while no node is open: every call says so."""

    async def aclose(self) -> None:
        """Nothing to close."""

    def __getattr__(self, name: str) -> Any:
        async def refuse(*args: Any, **kw: Any) -> Any:
            raise RuntimeError("no node is open")

        return refuse


class FleetArrived(Message):
    """Every node's view from one poll, and the servers across nodes its answers showed."""

    def __init__(self, views: list[NodeView], units: Sequence[UnitView] = ()) -> None:
        super().__init__()
        self.views = views
        self.units = units

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, FleetArrived)


class NodeOpened(Message):
    """The tunnel to a node's daemon is there: open its dashboard."""

    def __init__(self, name: str, socket: str) -> None:
        super().__init__()
        self.name = name
        self.socket = socket


class FleetApp(DashboardApp):
    """`FleetApp(fleet)`; `readonly` as on a node (also for every node opened from here)."""

    TITLE = "vsup fleet"

    def __init__(
        self,
        fleet: Fleet,
        *,
        readonly: bool = False,
        keymap: Mapping[str, str] | None = None,
        clock: Clock | None = None,
        refresh_s: float = 2.0,
        node_refresh_s: float = 1.0,
        fleet_client: FleetClient | None = None,
    ) -> None:
        super().__init__(
            NoNode(), readonly=readonly, keymap=keymap, clock=clock, refresh_s=node_refresh_s
        )
        self.fleet = fleet
        self.fc = fleet_client or FleetClient(fleet)
        self.fleet_refresh_s = refresh_s
        self.views: list[NodeView] = []
        self.units: Sequence[UnitView] = ()  # the last poll's servers across nodes
        self.open_node: str | None = None  # the node whose dashboard is on top
        self.fleet_polls = 0  # answers rendered (tests and benchmarks read it)
        self._fleet_screen: FleetScreen | None = None
        self._fleet_timer: Timer | None = None
        self._fleet_worker: Worker | None = None
        self._reconnect_worker: Worker | None = None

    def get_default_screen(self) -> Screen:
        self._fleet_screen = FleetScreen(self.fleet.name or str(self.fleet.path), self.readonly)
        return self._fleet_screen

    @property
    def fleet_screen(self) -> FleetScreen:
        assert self._fleet_screen is not None
        return self._fleet_screen

    async def on_unmount(self) -> None:
        await self.fc.aclose()

    # -- the fleet loop ---------------------------------------------------------------------

    @on(FleetScreen.Ready)
    def _fleet_ready(self) -> None:
        if self._fleet_timer is None:
            self._fleet_timer = self.set_interval(self.fleet_refresh_s, self.fleet_tick)
        self.fleet_tick()

    @on(FleetScreen.Resumed)
    @on(FleetScreen.Refresh)
    def _fleet_again(self) -> None:
        if self.views:
            self.fleet_screen.render_views(self.views, self.units)
        self.fleet_tick()

    def fleet_tick(self) -> None:
        """Timer callback: one poll of every node unless one is under way (and none while a
        node's dashboard is on top: it has the screen, and its own poll)."""
        if self.open_node is not None:
            return
        if self._fleet_worker is None or self._fleet_worker.is_finished:
            self._fleet_worker = self._poll_fleet()

    @work(name="fleet status", group="fleet", exit_on_error=False)
    async def _poll_fleet(self) -> None:
        views = await self.fc.status_all()
        self.post_message(FleetArrived(views, self.fc.units))

    def on_fleet_arrived(self, message: FleetArrived) -> None:
        self.views = message.views
        self.units = message.units
        self.fleet_polls += 1
        if self.open_node is None and self.screen is self._fleet_screen:
            self.fleet_screen.render_views(message.views, message.units)

    # -- opening a node and coming back ---------------------------------------------------------

    @on(FleetScreen.Open)
    def _open(self, message: FleetScreen.Open) -> None:
        self.notify(f"opening {message.name}…", timeout=2)
        self._connect(message.name)

    @work(name="open node", group="open-node", exclusive=True, exit_on_error=False)
    async def _connect(self, name: str) -> None:
        node = self.fleet.node(name)
        if node is None:
            return
        _, tunnel = await self.fc.call(node, lambda c: c.ping())
        self.post_message(NodeOpened(name, str(tunnel.local_socket)))

    def on_node_opened(self, message: NodeOpened) -> None:
        if self.open_node is not None or self.screen is not self._fleet_screen:
            return
        old = self.client
        self.open_node = message.name
        dashboard = self.attach(AsyncClient(socket=Path(message.socket)))
        self.sub_title = f"{message.name} (over SSH; q: back to the fleet)"
        self.push_screen(dashboard)
        self._close(old)

    def detach(self) -> None:
        """`q` on a node's dashboard: back to the fleet (the node keeps running)."""
        if self.open_node is None:
            self.exit()
            return
        for group in NODE_GROUPS:
            self.workers.cancel_group(self, group)
        while self.screen is not self._dashboard and len(self.screen_stack) > 2:
            self.pop_screen()  # a modal of the node's dashboard
        self.open_node = None
        self.sub_title = ""
        old = self.client
        self.client = NoNode()
        self._dashboard = None
        self.pop_screen()
        self._close(old)

    def _close(self, client: DashboardClient) -> None:
        close = getattr(client, "aclose", None)
        if close is not None and not isinstance(client, NoNode):

            async def closing() -> None:
                with contextlib.suppress(Exception):
                    await close()

            self.run_worker(closing(), group="close", exit_on_error=False)

    # -- a node's messages after it was closed are dropped ---------------------------------------

    def _drop_if_closed(self, message: Message) -> None:
        if self.open_node is None:
            message.prevent_default()  # the node's handlers (DashboardApp's) do not run

    def on_snapshot_arrived(self, message: SnapshotArrived) -> None:
        self._drop_if_closed(message)

    def on_daemon_unreachable(self, message: DaemonUnreachable) -> None:
        self._drop_if_closed(message)
        busy = self._reconnect_worker is not None and not self._reconnect_worker.is_finished
        if self.open_node is not None and not busy:
            # The banner shows (DashboardApp's handler runs next); the tunnel is made again
            # on the same local socket path, so the node's client keeps working once it is.
            self._reconnect_worker = self._reconnect(self.open_node)

    @work(name="reconnect", group="reconnect", exit_on_error=False)
    async def _reconnect(self, name: str) -> None:
        node = self.fleet.node(name)
        if node is None:
            return
        self.fc.transport.invalidate(node)
        await self.fc.transport.connect(node)

    def on_log_chunk(self, message: LogChunk) -> None:
        self._drop_if_closed(message)

    def on_config_arrived(self, message: ConfigArrived) -> None:
        self._drop_if_closed(message)

    def on_history_arrived(self, message: HistoryArrived) -> None:
        self._drop_if_closed(message)

    def worker_failed(self, worker: Worker) -> None:
        if worker.group == "reconnect":
            return  # the banner says the node does not answer; the next failure tries again
        if worker.group in ("fleet", "open-node"):
            error = worker.error
            what = "opening the node" if worker.group == "open-node" else "asking the fleet"
            self.notify(
                str(error) or type(error).__name__, title=f"{what} failed", severity="error"
            )
            return
        if self.open_node is None:
            return
        super().worker_failed(worker)
