"""The fleet screen: one row per node, then every node's alerts and advice in one list.

Presentation only (as `Dashboard`): it renders the views the app hands it (`render_views`)
and reports up with messages (`FleetScreen.Ready`, `.Resumed`, `.Open(name)` on Enter,
`.Refresh` on r). Rows are keyed by node name and only changed cells are updated.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from vsup.fleet.units import MemberState, UnitView
from vsup.fleet.view import SEVERITY_RANK, Alert, NodeView

COLUMNS = (
    ("node", "NODE"),
    ("state", "STATE"),
    ("gpus", "GPUS"),
    ("ready", "READY"),
    ("alerts", "ALERTS"),
    ("router", "ROUTER"),
    ("tok", "TOK/S"),
    ("layout", "LAYOUT"),
    ("vsup", "VSUP"),
    ("vllm", "VLLM"),
    ("since", "SINCE"),
)
NODE_DOWN = ("unreachable", "no_daemon")
# a server across nodes that is not ready: how loud its row is
UNIT_SEVERITY = {MemberState.DOWN: "critical", MemberState.FAILED: "critical"}
SEVERITY_STYLE = {"critical": "bold red", "error": "red", "warning": "yellow", "info": "dim"}


def node_state(v: NodeView) -> Text:
    if not v.reachable:
        return Text("DOWN", "bold red")
    if not v.daemon:
        return Text("NO DAEMON", "bold yellow")
    if v.rollout and v.rollout.startswith("running"):
        return Text(f"ROLLING {v.rollout.split()[-1]}", "bold cyan")
    if v.ready != v.total:
        return Text("DEGRADED", "bold yellow")
    return Text("up", "green")


def node_cells(v: NodeView) -> dict[str, Text]:
    """The row of one node, cell by cell."""
    gpus = "-" if v.gpus is None else ("cpu" if v.gpus == 0 else str(v.gpus))
    if v.gpus and v.gpu_name:
        gpus += f" {v.gpu_name}"
    alerts = Text("-", "dim")
    if v.worst is not None:
        alerts = Text(f"{v.alerts} {v.worst.kind}", SEVERITY_STYLE.get(v.worst.severity, ""))
    ready = "-" if v.total is None else f"{v.ready}/{v.total}"
    since = (v.since or "-").replace("T", " ").removesuffix("Z")
    return {
        "node": Text(v.name, "bold"),
        "state": node_state(v),
        "gpus": Text(gpus),
        "ready": Text(ready, "green" if v.total is not None and v.ready == v.total else "yellow"),
        "alerts": alerts,
        "router": Text(v.router or "-"),
        "tok": Text("-" if v.tokens_per_s is None else f"{v.tokens_per_s:.1f}", justify="right"),
        "layout": Text(v.layout or "-"),
        "vsup": Text(v.vsup_version or "-"),
        "vllm": Text(v.vllm_version or "-"),
        "since": Text(since, "dim"),
    }


def fleet_alerts(views: Sequence[NodeView]) -> list[Alert]:
    """Every node's alerts and advice, the most severe first; a node down is one too (first
    among equals)."""
    out: list[Alert] = []
    for v in views:
        if not v.reachable:
            out.append(Alert(v.name, "critical", "unreachable", f"since {v.since}: {v.error}"))
        elif not v.daemon:
            out.append(Alert(v.name, "error", "no_daemon", v.error or "no daemon"))
        out.extend(v.advice)
    # a node that does not answer first among equals: nothing else of it can be seen
    out.sort(key=lambda a: (-SEVERITY_RANK.get(a.severity, 0), a.kind not in NODE_DOWN))
    return out


def unit_alerts(units: Sequence[UnitView]) -> list[Alert]:
    """Each server across nodes as one row of the list, before the nodes' alerts: its nodes,
    its state (`ready`, or the worst member named with its node), its members and, when it is
    not ready, the advice (docs/fleet.md, "Seen as one row")."""
    out = []
    for u in units:
        members = "; ".join(
            f"{m.node} ({'head, ' if m.head else ''}{m.where.split(' ', 1)[1]}) {m.state}"
            for m in u.members
        )
        ready = u.state == MemberState.READY
        severity = "info" if ready else UNIT_SEVERITY.get(u.state, "warning")
        message = f"{u.text} · {members}" + ("" if u.advice is None else f" · {u.advice}")
        nodes = "+".join(m.node for m in u.members)
        out.append(Alert(nodes, severity, "server across nodes", message, u.instance))
    return out


class FleetScreen(Screen[None]):
    DEFAULT_CSS = """
    FleetScreen #title { height: 1; background: $primary 30%; padding: 0 1; }
    FleetScreen #nodes-box { height: 2fr; border: round $primary 50%; }
    FleetScreen #alerts-box { height: 1fr; border: round $warning 50%; }
    FleetScreen DataTable { height: 1fr; }
    """

    BINDINGS = [
        Binding("enter", "open", "Open node", priority=True),
        Binding("r", "refresh", "Refresh"),
        Binding("q", "quit", "Quit"),
    ]

    class Ready(Message):
        """The widgets exist: the app may start polling the nodes."""

    class Resumed(Message):
        """Back on the fleet (a node's dashboard closed)."""

    class Refresh(Message):
        """Poll every node now."""

    class Open(Message):
        """Open node `name`'s own dashboard."""

        def __init__(self, name: str) -> None:
            super().__init__()
            self.name = name

    def __init__(self, title: str, readonly: bool = False) -> None:
        super().__init__(id="fleet")
        self.fleet_title = title
        self.readonly = readonly
        self.views: dict[str, NodeView] = {}
        self._cells: dict[str, dict[str, Text]] = {}
        self.renders = 0

    def compose(self) -> ComposeResult:
        yield Static(self._title_text(), id="title")
        with Vertical(id="nodes-box"):
            yield DataTable(id="nodes", cursor_type="row", zebra_stripes=False)
        with Vertical(id="alerts-box"):
            yield DataTable(id="alerts", cursor_type="row", show_header=False)
        yield Footer()

    def _title_text(self) -> Text:
        views = list(self.views.values())
        up = sum(1 for v in views if v.reachable and v.daemon)
        ready = sum(v.ready or 0 for v in views)
        total = sum(v.total or 0 for v in views)
        text = Text()
        text.append(" vsup fleet ", "bold reverse")
        text.append(f" {self.fleet_title}", "bold")
        if views:
            text.append(f" │ {up}/{len(views)} nodes answer │ {ready}/{total} ready")
        else:
            text.append(" │ asking the nodes…", "dim")
        text.append(" │ Enter: open a node, q there: back", "dim")
        if self.readonly:
            text.append("  ")
            text.append(" READ-ONLY ", "bold reverse")
        return text

    def on_mount(self) -> None:
        table = self.query_one("#nodes", DataTable)
        for key, label in COLUMNS:
            table.add_column(label, key=key)
        self.query_one("#alerts", DataTable).add_columns("node", "severity", "what", "message")
        table.focus()
        self.post_message(self.Ready())

    def on_screen_resume(self) -> None:
        self.post_message(self.Resumed())

    @property
    def selected(self) -> str | None:
        table = self.query_one("#nodes", DataTable)
        if not table.row_count:
            return None
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key
        return str(key.value) if key is not None else None

    def render_views(self, views: Sequence[NodeView], units: Sequence[UnitView] = ()) -> None:
        """Diff the nodes into the table (changed cells only) and redraw the alerts (each
        server across nodes first, as one row)."""
        table = self.query_one("#nodes", DataTable)
        names = [v.name for v in views]
        for gone in [n for n in self._cells if n not in names]:
            table.remove_row(gone)
            del self._cells[gone]
        for v in views:
            cells = node_cells(v)
            old = self._cells.get(v.name)
            if old is None:
                table.add_row(*(cells[k] for k, _ in COLUMNS), key=v.name)
            else:
                for key, _ in COLUMNS:
                    if (cells[key].plain, cells[key].style) != (old[key].plain, old[key].style):
                        table.update_cell(v.name, key, cells[key])
            self._cells[v.name] = cells
        self.views = {v.name: v for v in views}
        self.query_one("#title", Static).update(self._title_text())
        alerts = self.query_one("#alerts", DataTable)
        alerts.clear()
        for a in (*unit_alerts(units), *fleet_alerts(views)):
            who = f"{a.kind}" + (f" {a.instance}" if a.instance else "")
            alerts.add_row(
                Text(a.node, "bold"),
                Text(a.severity, SEVERITY_STYLE.get(a.severity, "")),
                Text(who),
                Text(a.message[:300]),
            )
        self.renders += 1

    def action_open(self) -> None:
        if self.focused is self.query_one("#nodes", DataTable) and self.selected:
            self.post_message(self.Open(self.selected))

    def action_refresh(self) -> None:
        self.post_message(self.Refresh())

    async def action_quit(self) -> None:
        self.app.exit()
