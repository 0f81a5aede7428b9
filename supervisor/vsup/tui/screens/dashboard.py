"""The main screen: header, GPUs, the instances table, the selected instance's panes.

Presentation only, and the owner of its view state: the filter, the sort and the selection are
reactives here. It reports up with messages (`Dashboard.Selected`, `Dashboard.Requested`,
`Dashboard.Ready`, `Dashboard.Resumed`) and never calls into the app; the app's workers fetch
from the daemon and hand the answers down through the public `render_snapshot`, `show_*`
methods. The keys live on this screen so that modal screens and the full-screen log shadow them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from textual import events
from textual.app import ComposeResult
from textual.binding import ActiveBinding, Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Input, TabPane

from vsup import sleepview
from vsup.answers import InstanceConfig
from vsup.routerview import router_line
from vsup.snapshot import InstanceStatus, StatusSnapshot
from vsup.states import IDLE, SERVING, CanaryState, RolloutState, SleepState, State
from vsup.tui import keymap, rows
from vsup.tui.history import History
from vsup.tui.keymap import CANARY_ACTIONS, KEY_BY_ACTION, WIDE_FOOTER
from vsup.tui.widgets.benchbar import BenchBar
from vsup.tui.widgets.detail import DetailTabs, SidePanel
from vsup.tui.widgets.gpus import GpuPanel
from vsup.tui.widgets.header import Banner, NodeHeader
from vsup.tui.widgets.instances import InstanceTable
from vsup.tui.widgets.pullbar import PullBar
from vsup.tui.widgets.rolloutbar import RolloutBar

NARROW_BELOW = 120  # columns


def applicable(action: str, inst: InstanceStatus) -> bool:
    """Whether a lifecycle action makes sense for an instance in its current state."""
    state = inst.lifecycle.state
    if action == "restart":
        return state not in (State.STOPPED, State.STOPPING)
    if action == "stop":
        return state not in (State.STOPPED, State.STOPPING)
    if action == "start":
        return state in IDLE
    if action == "drain":
        return state in SERVING
    if action == "sleep":
        # awake and serving, with sleep mode (the layout's `sleep` table)
        return inst.sleep is not None and inst.sleep.state == SleepState.AWAKE and state in SERVING
    if action == "wake":
        # asleep, or adopted with a sleep state its server has not told yet
        return (
            inst.sleep is not None
            and inst.sleep.state in (SleepState.ASLEEP, SleepState.UNKNOWN)
            and state in SERVING
        )
    if action == "previous_logs":
        return (inst.lifecycle.run or 0) > 1 or inst.lifecycle.last_exit is not None
    return True


class FilterInput(Input):
    """The `/` filter: Enter or the filter key again keeps it and goes back to the table (the
    key is not typed: it toggles, as in k9s), Escape clears and closes it."""

    BINDINGS = [
        Binding("escape", "clear", "Clear filter"),
        Binding("enter", "submit", "Keep filter"),
    ]

    def __init__(self, *args: Any, toggle_keys: frozenset[str] = frozenset(), **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.toggle_keys = toggle_keys  # the dashboard's filter key(s): not text here

    def check_consume_key(self, key: str, character: str | None) -> bool:
        # Not consumed: the dashboard's own binding for it (the toggle) stays active.
        return key not in self.toggle_keys and super().check_consume_key(key, character)

    async def _on_key(self, event: events.Key) -> None:
        if event.key in self.toggle_keys:
            event.prevent_default()  # not typed (Input's handler): the dashboard's binding has it
            return
        await super()._on_key(event)

    def action_clear(self) -> None:
        self.value = ""
        self.post_message(self.Cleared())

    class Cleared(Message):
        """Escape in the filter: the dashboard closes it."""


class Dashboard(Screen[None]):
    DEFAULT_CSS = """
    Dashboard #table-box { height: 1fr; border: round $primary 50%; padding: 0; }
    Dashboard #bottom { height: 1fr; }
    Dashboard #side { width: 52; }
    Dashboard #detail { width: 1fr; }
    Dashboard #filter { display: none; border: none; height: 1; padding: 0 1; }
    Dashboard #filter.-shown { display: block; }
    Dashboard.-narrow #side { width: 32; }
    """

    BINDINGS = keymap.bindings()

    # The view state: what the table shows and which instance the panes follow.
    filter_text: reactive[str] = reactive("", init=False)
    sort_key: reactive[str] = reactive("name", init=False)
    sort_reverse: reactive[bool] = reactive(False, init=False)
    selected: reactive[str | None] = reactive(None, init=False)

    class Ready(Message):
        """The widgets exist: the app may start fetching."""

    class Resumed(Message):
        """The dashboard is on top again (a modal or the full-screen log closed)."""

    class Selected(Message):
        """Another instance is selected (None: none); its log, config and history follow."""

        def __init__(self, name: str | None) -> None:
            super().__init__()
            self.name = name

    class Requested(Message):
        """A key or the palette asked for `action` (keymap ids: restart, logs, edit, ...) on
        `name`, the instance selected then."""

        def __init__(self, action: str, name: str | None) -> None:
            super().__init__()
            self.action = action
            self.name = name

    def __init__(self, history: History, readonly: bool = False) -> None:
        super().__init__(id="dashboard")
        self.history = history
        self.readonly = readonly
        self.snapshot: StatusSnapshot | None = None
        self.narrow = False
        self._bindings_key: tuple | None = None
        self._box_title = ""

    def compose(self) -> ComposeResult:
        yield NodeHeader(id="header")
        yield Banner(id="banner")
        yield BenchBar(id="bench")
        yield RolloutBar(id="rollout")
        yield PullBar(id="pull")
        yield GpuPanel(id="gpus")
        with Vertical(id="table-box"):
            yield InstanceTable(id="instances")
        with Horizontal(id="bottom"):
            yield SidePanel(self.history, id="side")
            with DetailTabs(id="detail"):
                yield from DetailTabs.panes()
        # In the flow above the footer (a second bottom dock would sit under the footer).
        yield FilterInput(
            placeholder="filter: name, model, state, backend, port",
            id="filter",
            toggle_keys=self._filter_keys(),
            select_on_focus=False,  # back in the filter: go on typing, not replace it
        )
        yield Footer()

    def _filter_keys(self) -> frozenset[str]:
        """The keys of the filter binding, as the operator's keymap has them."""
        keymap = getattr(self.app, "user_keymap", None) or {}
        keys = keymap.get("filter", KEY_BY_ACTION["filter"].key)
        return frozenset(k.strip() for k in keys.split(",") if k.strip())

    def on_mount(self) -> None:
        self._set_narrow(self.app.size.width < NARROW_BELOW)
        self.query_one(InstanceTable).set_columns(self._columns(None))
        self.query_one(NodeHeader).show(None, self.readonly, self.narrow)
        self.query_one(InstanceTable).focus()
        self.post_message(self.Ready())

    def on_resize(self, event: events.Resize) -> None:
        self._set_narrow(event.size.width < NARROW_BELOW)
        self._rerender()

    def _set_narrow(self, narrow: bool) -> None:
        if narrow == self.narrow:
            return
        self.narrow = narrow
        self.set_class(narrow, "-narrow")
        self.query_one(Footer).compact = narrow
        self.refresh_bindings()

    def _columns(self, snap: StatusSnapshot | None) -> tuple[rows.Column, ...]:
        # inside the table's border (2) and its vertical scrollbar (2)
        return rows.columns_for(
            self.app.size.width - 4,
            bool(snap and snap.gpus),
            bool(snap and rows.has_parallel_shape(snap.instances)),
            bool(snap and rows.has_load_figures(snap.instances)),
        )

    def on_screen_resume(self) -> None:
        self.post_message(self.Resumed())

    # -- view state -------------------------------------------------------------------------

    def watch_filter_text(self) -> None:
        self._rerender()

    def watch_sort_key(self) -> None:
        self._rerender()

    def watch_sort_reverse(self) -> None:
        self._rerender()

    def watch_selected(self, name: str | None) -> None:
        self.query_one(DetailTabs).log_write("", reset=True)
        self.query_one(DetailTabs).show_config(None)
        self.show_selected()
        self.post_message(self.Selected(name))

    def sort_by(self, sort: str) -> None:
        """Order the table by `sort` (a key of rows.SORTS), in its natural direction."""
        self.sort_key = sort
        self.sort_reverse = False

    def selected_instance(self) -> InstanceStatus | None:
        if self.snapshot is None or self.selected is None:
            return None
        return self.snapshot.instance(self.selected)

    def _rerender(self) -> None:
        if self.snapshot is not None:
            self.render_snapshot(self.snapshot)

    # -- rendering: what the app hands down ---------------------------------------------------

    def render_snapshot(self, snap: StatusSnapshot) -> None:
        """Bring every widget up to `snap`, touching only what changed."""
        watched = self.canary_watched
        self.snapshot = snap
        if self.canary_watched != watched:
            self.refresh_bindings()  # the canary's keys come and go with its watch
        table = self.query_one(InstanceTable)
        with self.app.batch_update():
            self.query_one(NodeHeader).show(snap, self.readonly, self.narrow)
            self.query_one(BenchBar).show(snap.bench)  # before _fit_table: it takes a line
            self.query_one(RolloutBar).show(snap.rollout)  # the same
            self.query_one(PullBar).show(snap.pulls)  # so does this one
            self.query_one(GpuPanel).show(snap, self.narrow)
            table.set_columns(self._columns(snap))
            shown = [i for i in snap.instances if rows.matches(i, self.filter_text)]
            order = rows.sorted_names(shown, self.sort_key, self.sort_reverse)
            table.show(
                shown, order, keep=self.selected, over_plan=rows.over_plan_names(snap.advice)
            )
            self._update_title(len(shown), len(snap.instances))
            self._update_router(snap)
            self._fit_table(len(snap.instances))
            keep = self.selected if self.selected in order else table.selected_name
            if keep != self.selected:
                self.selected = keep
            else:
                self.show_selected()  # the same instance: its panes follow the snapshot

    def show_selected(self) -> None:
        """The panes of the selected instance (from the current snapshot)."""
        inst = self.selected_instance()
        advice = self.snapshot.advice if self.snapshot else ()
        self.query_one(SidePanel).show(inst, advice)
        self.query_one(DetailTabs).show_instance(inst)
        key = (
            (
                inst.name,
                inst.lifecycle.state,
                applicable("previous_logs", inst),
                inst.sleep.state if inst.sleep is not None else None,
            )
            if inst
            else None
        )
        if key != self._bindings_key:
            self._bindings_key = key
            self.refresh_bindings()

    def show_daemon_error(self, error: str | None) -> None:
        """The banner: why the daemon does not answer (None: it answers again)."""
        banner = self.query_one(Banner)
        shown = banner.has_class("-shown")
        banner.show_error(error)
        if shown != (error is not None):
            self.refit()

    def show_log(self, text: str, reset: bool) -> None:
        """Log text of the selected instance (`reset`: a new log). An answer that arrives
        while the app shuts down finds no widgets and is dropped."""
        for tabs in self.query(DetailTabs):
            tabs.log_write(text, reset)

    def show_config(self, config: InstanceConfig | None) -> None:
        for tabs in self.query(DetailTabs):
            tabs.show_config(config)

    def show_history(self) -> None:
        """The history of the selected instance changed (seeded from the daemon)."""
        advice = self.snapshot.advice if self.snapshot else ()
        for panel in self.query(SidePanel):
            panel.show(self.selected_instance(), advice)

    def refit(self) -> None:
        """Re-size the table after a line appeared or went (banner, filter)."""
        if self.snapshot is not None:
            self._fit_table(len(self.snapshot.instances))

    def _fit_table(self, rows_total: int) -> None:
        """Size the table to its rows (header and border: 3 more), leaving the panes below at
        least 8 lines (12 in a wide terminal); the panes take the rest."""
        gpu_height = self.query_one(GpuPanel).styles.height  # None: no height set in CSS
        fixed = 2 + (gpu_height.value if gpu_height is not None and gpu_height.value else 1)
        fixed += sum(
            1
            for w in (
                self.query_one(Banner),
                self.query_one(BenchBar),
                self.query_one(RolloutBar),
                self.query_one(PullBar),
                self.query_one(FilterInput),
            )
            if w.has_class("-shown")
        )
        room = self.size.height - fixed - (8 if self.narrow else 12)
        height = int(max(5, min(rows_total + 3, room)))
        box = self.query_one("#table-box")
        if box.styles.height is None or box.styles.height.value != height:
            box.styles.height = height

    def _update_router(self, snap: StatusSnapshot) -> None:
        """The router's line (rates, each worker's share) under the instance table."""
        line = router_line(snap.router) or ""
        box = self.query_one("#table-box")
        if box.border_subtitle != line:
            box.border_subtitle = line

    def _update_title(self, shown: int, total: int) -> None:
        label, _, _ = rows.SORTS[self.sort_key]
        arrow = "▼" if (rows.SORTS[self.sort_key][2] != self.sort_reverse) else "▲"
        title = f"instances {shown}/{total}" if shown != total else f"instances {total}"
        title += f" · sort: {label} {arrow}"
        if self.filter_text:
            title += f" · filter: {self.filter_text!r}"
        if title != self._box_title:
            self._box_title = title
            self.query_one("#table-box").border_title = title

    # -- selection, filter ----------------------------------------------------------------------

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.row_key is not None and event.row_key.value is not None:
            self.selected = event.row_key.value

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "filter":
            self.filter_text = event.value.strip()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "filter":
            if not event.value.strip():
                self.close_filter()
            else:
                self.query_one(InstanceTable).focus()

    def on_filter_input_cleared(self) -> None:
        self.close_filter()

    def close_filter(self) -> None:
        box = self.query_one(FilterInput)
        box.remove_class("-shown")
        self.refit()
        self.filter_text = ""
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
        if action in CANARY_ACTIONS and not self.canary_watched:
            return False  # in the footer only while a canary is watched
        if key.mutates and self.readonly:
            return None
        if key.selection:
            inst = self.selected_instance()
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
        if key.mutates and self.readonly:
            self.notify(
                f"{key.description}: disabled, the dashboard runs with --readonly",
                severity="warning",
            )
        elif key.selection:
            inst = self.selected_instance()
            if inst is None:
                what = "no instance is selected"
            elif key.action == "previous_logs":
                what = f"{inst.name} has no previous run (this is its first)"
            elif key.action in ("sleep", "wake") and inst.sleep is None:
                what = f"{inst.name} has no sleep mode (its layout needs sleep = {{ level = 1 }})"
            elif key.action in ("sleep", "wake") and inst.sleep and inst.lifecycle.state in SERVING:
                what = f"{inst.name} is {sleepview.state_word(inst.sleep, ellipsis='')}"
            else:
                what = f"{inst.name} is {inst.lifecycle.state}"
            self.notify(f"{key.description}: not applicable, {what}", severity="warning")
        event.stop()

    def _request(self, action: str) -> None:
        self.post_message(self.Requested(action, self.selected))

    @property
    def canary_watched(self) -> bool:
        r = self.snapshot.rollout if self.snapshot is not None else None
        return (
            r is not None
            and r.state == RolloutState.RUNNING
            and (r.canary_state == CanaryState.WATCHING)
        )

    def action_promote_canary(self) -> None:
        self._request("promote_canary")

    def action_abort_canary(self) -> None:
        self._request("abort_canary")

    def action_restart(self) -> None:
        self._request("restart")

    def action_stop(self) -> None:
        self._request("stop")

    def action_start(self) -> None:
        self._request("start")

    def action_drain(self) -> None:
        self._request("drain")

    def action_sleep(self) -> None:
        self._request("sleep")

    def action_wake(self) -> None:
        self._request("wake")

    def action_logs(self) -> None:
        self._request("logs")

    def action_previous_logs(self) -> None:
        self._request("previous_logs")

    def action_filter(self) -> None:
        box = self.query_one(FilterInput)
        if box.has_focus:
            # the filter key again: keep what was typed and go back to the table (a toggle)
            if box.value.strip():
                self.query_one(InstanceTable).focus()
            else:
                self.close_filter()
            return
        box.add_class("-shown")
        self.refit()
        box.value = self.filter_text
        box.focus()

    def action_next_tab(self) -> None:
        tabs = self.query_one(DetailTabs)
        ids = [pane.id for pane in tabs.query(TabPane) if pane.id]
        current = ids.index(tabs.active) if tabs.active in ids else -1
        tabs.active = ids[(current + 1) % len(ids)]

    def action_tab_log(self) -> None:
        self.query_one(DetailTabs).active = "tab-log"

    def action_tab_config(self) -> None:
        self.query_one(DetailTabs).active = "tab-config"

    def action_tab_exit(self) -> None:
        self.query_one(DetailTabs).active = "tab-exit"

    def action_sort(self) -> None:
        order = rows.SORT_ORDER
        self.sort_by(order[(order.index(self.sort_key) + 1) % len(order)])

    def action_sort_reverse(self) -> None:
        self.sort_reverse = not self.sort_reverse

    def action_add(self) -> None:
        self.post_message(self.Requested("add", None))

    def action_edit(self) -> None:
        self._request("edit")

    def action_remove(self) -> None:
        self._request("remove")

    def action_save(self) -> None:
        self._request("save")

    def action_help(self) -> None:
        self._request("help")

    def action_detach(self) -> None:
        self._request("detach")
