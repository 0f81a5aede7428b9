"""The main screen: header, GPUs, the instances table, the selected instance's panes.

Presentation only: the app's workers fetch from the daemon and hand snapshots here;
`render_snapshot` diffs them into the widgets. The keys live on this screen so that modal
screens and the full-screen log shadow them.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from textual import events
from textual.app import ComposeResult
from textual.binding import ActiveBinding, Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Input

from vsup.snapshot import InstanceStatus, StatusSnapshot
from vsup.tui import keymap, rows
from vsup.tui.keymap import KEY_BY_ACTION, WIDE_FOOTER
from vsup.tui.widgets.detail import DetailTabs, SidePanel
from vsup.tui.widgets.gpus import GpuPanel
from vsup.tui.widgets.header import Banner, NodeHeader
from vsup.tui.widgets.instances import InstanceTable

if TYPE_CHECKING:
    from vsup.tui.app import DashboardApp

NARROW_BELOW = 120  # columns


def applicable(action: str, inst: InstanceStatus) -> bool:
    """Whether a lifecycle action makes sense for an instance in its current state."""
    state = inst.state
    if action == "restart":
        return state not in ("stopped", "stopping")
    if action == "stop":
        return state not in ("stopped", "stopping")
    if action == "start":
        return state in ("stopped", "failed")
    if action == "drain":
        return state in ("ready", "unhealthy")
    if action == "previous_logs":
        return (inst.run or 0) > 1 or inst.last_exit is not None
    return True


class FilterInput(Input):
    """The `/` filter: Enter keeps it, Escape clears it."""

    BINDINGS = [Binding("escape", "clear", "Clear filter", show=False)]

    def action_clear(self) -> None:
        self.value = ""
        self.screen.close_filter()


class Dashboard(Screen[None]):
    DEFAULT_CSS = """
    Dashboard #table-box { height: 1fr; border: round $primary 50%; padding: 0; }
    Dashboard #bottom { height: 1fr; }
    Dashboard #side { width: 52; }
    Dashboard #detail { width: 1fr; }
    Dashboard #filter { dock: bottom; display: none; border: none; height: 1; padding: 0 1; }
    Dashboard #filter.-shown { display: block; }
    Dashboard.-narrow #side { width: 32; }
    """

    BINDINGS = keymap.bindings()

    def __init__(self) -> None:
        super().__init__(id="dashboard")
        self.narrow = False
        self._bindings_key: tuple | None = None
        self._box_title = ""

    @property
    def vsup(self) -> DashboardApp:
        return self.app  # type: ignore[return-value]

    def compose(self) -> ComposeResult:
        yield NodeHeader(id="header")
        yield Banner(id="banner")
        yield GpuPanel(id="gpus")
        with Vertical(id="table-box"):
            yield InstanceTable(id="instances")
        with Horizontal(id="bottom"):
            yield SidePanel(self.vsup.history, id="side")
            with DetailTabs(id="detail"):
                yield from DetailTabs.panes()
        yield FilterInput(placeholder="filter: name, model, state, backend, port", id="filter")
        yield Footer()

    def on_mount(self) -> None:
        self._set_narrow(self.app.size.width < NARROW_BELOW)
        self.query_one(InstanceTable).set_columns(self._columns(None))
        self.query_one(NodeHeader).show(None, self.vsup.readonly, self.narrow)
        self.query_one(InstanceTable).focus()
        self.vsup.start_polling()

    def on_resize(self, event: events.Resize) -> None:
        self._set_narrow(event.size.width < NARROW_BELOW)
        if self.vsup.snapshot is not None:
            self.render_snapshot(self.vsup.snapshot)

    def _set_narrow(self, narrow: bool) -> None:
        if narrow == self.narrow:
            return
        self.narrow = narrow
        self.set_class(narrow, "-narrow")
        self.query_one(Footer).compact = narrow
        self.refresh_bindings()

    def _columns(self, snap: StatusSnapshot | None) -> tuple[rows.Column, ...]:
        # inside the table's border (2) and its vertical scrollbar (2)
        return rows.columns_for(self.app.size.width - 4, bool(snap and snap.gpus))

    def on_screen_resume(self) -> None:
        self.vsup.dashboard_resumed()

    # -- rendering --------------------------------------------------------------------------

    def render_snapshot(self, snap: StatusSnapshot) -> None:
        """Bring every widget up to `snap`, touching only what changed."""
        app = self.vsup
        table = self.query_one(InstanceTable)
        with app.batch_update():
            self.query_one(NodeHeader).show(snap, app.readonly, self.narrow)
            self.query_one(GpuPanel).show(snap, self.narrow)
            table.set_columns(self._columns(snap))
            shown = [i for i in snap.instances if rows.matches(i, app.filter_text)]
            order = rows.sorted_names(shown, app.sort_key, app.sort_reverse)
            table.show(shown, order, keep=app.selected, over_plan=rows.over_plan_names(snap.advice))
            self._update_title(len(shown), len(snap.instances))
            self._fit_table(len(snap.instances))
            # the same instance again refreshes its panes (config, log after a new run)
            app.select(app.selected if app.selected in order else table.selected_name)

    def show_selected(self) -> None:
        """The panes of the selected instance (from the current snapshot)."""
        app = self.vsup
        inst = app.selected_instance()
        advice = app.snapshot.advice if app.snapshot else ()
        self.query_one(SidePanel).show(inst, advice)
        self.query_one(DetailTabs).show_instance(inst)
        key = (inst.name, inst.state, applicable("previous_logs", inst)) if inst else None
        if key != self._bindings_key:
            self._bindings_key = key
            self.refresh_bindings()

    def refit(self) -> None:
        """Re-size the table after a line appeared or went (banner, filter)."""
        if self.vsup.snapshot is not None:
            self._fit_table(len(self.vsup.snapshot.instances))

    def _fit_table(self, rows_total: int) -> None:
        """Size the table to its rows (header and border: 3 more), leaving the panes below at
        least 8 lines (12 in a wide terminal); the panes take the rest."""
        fixed = 2 + (self.query_one(GpuPanel).styles.height.value or 1)
        fixed += sum(
            1
            for w in (self.query_one(Banner), self.query_one(FilterInput))
            if w.has_class("-shown")
        )
        room = self.size.height - fixed - (8 if self.narrow else 12)
        height = int(max(5, min(rows_total + 3, room)))
        box = self.query_one("#table-box")
        if box.styles.height is None or box.styles.height.value != height:
            box.styles.height = height

    def _update_title(self, shown: int, total: int) -> None:
        app = self.vsup
        label, _, _ = rows.SORTS[app.sort_key]
        arrow = "▼" if (rows.SORTS[app.sort_key][2] != app.sort_reverse) else "▲"
        title = f"instances {shown}/{total}" if shown != total else f"instances {total}"
        title += f" · sort: {label} {arrow}"
        if app.filter_text:
            title += f" · filter: {app.filter_text!r}"
        if title != self._box_title:
            self._box_title = title
            self.query_one("#table-box").border_title = title

    # -- selection, filter ----------------------------------------------------------------------

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.row_key is not None and event.row_key.value is not None:
            self.vsup.select(event.row_key.value)

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "filter":
            self.vsup.filter_text = event.value.strip()
            if self.vsup.snapshot is not None:
                self.render_snapshot(self.vsup.snapshot)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "filter":
            if not event.value.strip():
                self.close_filter()
            else:
                self.query_one(InstanceTable).focus()

    def close_filter(self) -> None:
        box = self.query_one(FilterInput)
        box.remove_class("-shown")
        self.refit()
        self.vsup.filter_text = ""
        if self.vsup.snapshot is not None:
            self.render_snapshot(self.vsup.snapshot)
        self.query_one(InstanceTable).focus()

    # -- keys -------------------------------------------------------------------------------

    @property
    def active_bindings(self) -> dict[str, ActiveBinding]:
        """As Textual's, plus the keys a wide terminal has room for in the footer."""
        active = super().active_bindings
        if self.narrow:
            return active
        return {
            key: ab._replace(binding=dataclasses.replace(ab.binding, show=True))
            if ab.binding.id in WIDE_FOOTER
            else ab
            for key, ab in active.items()
        }

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        key = KEY_BY_ACTION.get(action)
        if key is None:
            return True
        if key.mutates and self.vsup.readonly:
            return None
        if key.selection:
            inst = self.vsup.selected_instance()
            if inst is None or not applicable(action, inst):
                return None
        return True

    def on_key(self, event: events.Key) -> None:
        # A disabled binding lets its key through: say why it did nothing.
        active = self.active_bindings.get(event.key)
        if active is None or active.enabled:
            return
        key = KEY_BY_ACTION.get(active.binding.action)
        if key is None:
            return
        if key.mutates and self.vsup.readonly:
            self.notify(
                f"{key.description}: disabled, the dashboard runs with --readonly",
                severity="warning",
            )
        elif key.selection:
            inst = self.vsup.selected_instance()
            what = f"{inst.name} is {inst.state}" if inst else "no instance is selected"
            self.notify(f"{key.description}: not applicable, {what}", severity="warning")
        event.stop()

    def action_restart(self) -> None:
        self.vsup.lifecycle("restart")

    def action_stop(self) -> None:
        self.vsup.lifecycle("stop")

    def action_start(self) -> None:
        self.vsup.lifecycle("start")

    def action_drain(self) -> None:
        self.vsup.lifecycle("drain")

    def action_logs(self) -> None:
        self.vsup.open_logs(previous=False)

    def action_previous_logs(self) -> None:
        self.vsup.open_logs(previous=True)

    def action_filter(self) -> None:
        box = self.query_one(FilterInput)
        box.add_class("-shown")
        self.refit()
        box.value = self.vsup.filter_text
        box.focus()

    def action_sort(self) -> None:
        app = self.vsup
        order = rows.SORT_ORDER
        app.sort_key = order[(order.index(app.sort_key) + 1) % len(order)]
        app.sort_reverse = False
        if app.snapshot is not None:
            self.render_snapshot(app.snapshot)

    def action_sort_reverse(self) -> None:
        self.vsup.sort_reverse = not self.vsup.sort_reverse
        if self.vsup.snapshot is not None:
            self.render_snapshot(self.vsup.snapshot)

    def action_add(self) -> None:
        self.vsup.edit_instance(None)

    def action_edit(self) -> None:
        self.vsup.edit_instance(self.vsup.selected)

    def action_remove(self) -> None:
        self.vsup.remove_instance(self.vsup.selected)

    def action_save(self) -> None:
        self.vsup.save_layout()

    def action_help(self) -> None:
        self.vsup.show_help()

    def action_detach(self) -> None:
        self.vsup.detach()
