"""The vsup dashboard: a Textual app that is a client of the daemon and nothing else.

The loop (memray's live TUI, Harlequin's workers): a timer only schedules; `@work` workers
await the control client; each answer arrives as a message (snapshots replace each other
while queued); handlers diff the answer into the widgets. Nothing blocks the event loop,
nothing renders when a snapshot did not change or while another screen is on top, and one
handler turns worker failures into the daemon banner or a notification.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import Any

from textual import on, work
from textual.app import App, ScreenStackError, SystemCommand
from textual.binding import Binding
from textual.markup import escape
from textual.screen import Screen
from textual.timer import Timer
from textual.worker import Worker, WorkerState

from vsup import sleepview
from vsup.clock import Clock, SystemClock
from vsup.snapshot import InstanceStatus, StatusSnapshot
from vsup.states import State
from vsup.termtext import printable
from vsup.tui import fmt, layout_edit, rows
from vsup.tui.client import DashboardClient, answer_errors, is_missing
from vsup.tui.history import History
from vsup.tui.keymap import KEY_BY_ACTION, KEYS
from vsup.tui.messages import (
    ConfigArrived,
    DaemonUnreachable,
    HistoryArrived,
    LogChunk,
    SnapshotArrived,
)
from vsup.tui.screens.confirm import ConfirmScreen
from vsup.tui.screens.dashboard import Dashboard
from vsup.tui.screens.form import InstanceFormScreen
from vsup.tui.screens.help import HelpScreen
from vsup.tui.screens.logs import LogScreen
from vsup.tui.screens.save import SaveScreen
from vsup.tui.validation import (
    Verdict,
    check_instance,
    check_layout,
    error_messages,
    plan_text,
)

LOG_TAIL = 16 * 1024  # bytes of a log shown when an instance is selected

_CONFIRM = {
    "restart": (
        "Restart {name}?",
        "Its process group gets SIGTERM (SIGKILL after the grace period) and it starts "
        "again. Requests in flight fail; drain (d) lets them finish first.",
    ),
    "stop": (
        "Stop {name}?",
        "It stays stopped until started again (u); the restart policy leaves it alone.",
    ),
    "sleep": (
        "Put {name} to sleep?",
        "It leaves the router, its running requests end, then vLLM frees its GPU memory "
        "(level {level}: {level_words}). It serves nothing until woken; requests sent to it "
        "directly wait until then.",
    ),
    "swap": (
        "Swap {name} for {other}?",
        "{name} leaves the router and goes to sleep (level {level}: {level_words}); once its "
        "memory is seen released, {other} wakes and rejoins the router. {name} serves nothing "
        "until woken again.",
    ),
    "drain": (
        "Drain {name}?",
        "vsup waits until no request is running on port {port} (up to the drain timeout), "
        "then stops it. Stop routing traffic to it first.",
    ),
}


def _confirm_fields(inst: InstanceStatus) -> dict[str, Any]:
    """What a confirmation's text may name: the instance, its port, its sleep level."""
    level = inst.sleep.level if inst.sleep is not None else 1
    return {
        "name": inst.name,
        "port": inst.port,
        "level": level,
        "level_words": sleepview.LEVEL_WORDS.get(level, "?"),
    }


def _unreachable(error: BaseException | None) -> bool:
    """A failure to reach the daemon (socket gone, refused, dropped), not a refusal."""
    if isinstance(error, (ConnectionError, FileNotFoundError)):
        return True
    return any(c.__name__ in ("DaemonUnavailable", "TransportError") for c in type(error).__mro__)


class DashboardApp(App[None]):
    """`DashboardApp(client)`; `readonly` disables every key that changes something."""

    TITLE = "vsup"
    ENABLE_COMMAND_PALETTE = True

    def __init__(
        self,
        client: DashboardClient,
        *,
        readonly: bool = False,
        keymap: Mapping[str, str] | None = None,
        clock: Clock | None = None,
        refresh_s: float = 1.0,
        local_checks: bool = True,
        node_gpus: int | None = None,
        attach_command: str = "vsup",
    ) -> None:
        super().__init__()
        # what the detach message tells to run again (`VSUP_HOME=... vsup` for a home that a
        # plain `vsup` would not find: paths.attach_command)
        self.attach_command = attach_command
        self.client = client
        self.readonly = readonly
        self.user_keymap = dict(keymap or {})
        self.clock = clock or SystemClock()
        self.refresh_s = refresh_s
        # False leaves validation to the daemon's dry run alone (tests of its refusals)
        self.local_checks = local_checks
        self.node_gpus = node_gpus
        self.renders = 0  # snapshots rendered (tests and benchmarks read it)
        self._dashboard: Dashboard | None = None
        self._timer: Timer | None = None
        self._reset_node()

    def _reset_node(self) -> None:
        """What the app knows of one node's daemon, from nothing."""
        self.snapshot: StatusSnapshot | None = None
        # The instance whose log, config and history are fetched: the dashboard's selection,
        # as its last `Dashboard.Selected` message said.
        self.selected: str | None = None
        self.history = History()
        self.daemon_error: str | None = None
        self.last_snapshot_at: float | None = None
        self._pending = False  # a snapshot arrived while another screen was on top
        self._status_worker: Worker | None = None
        self._log_worker: Worker | None = None
        self._log_pos: tuple[str, Any, int] | None = None  # (name, run, offset) shown
        self._config_key: tuple | None = None
        self._no_log: tuple[str, int | None] | None = None  # (instance, run) without a log
        self._save_outdated: list[str] = []  # what the last save's answer said runs older specs
        self._save_kept = False  # the last save kept the file's comments and formatting
        self._save_lost: str | None = None  # what of them it could not keep, in words

    # -- screens ----------------------------------------------------------------------------

    def get_default_screen(self) -> Screen:
        self._dashboard = Dashboard(self.history, readonly=self.readonly)
        return self._dashboard

    def attach(self, client: DashboardClient) -> Dashboard:
        """Point the app at another daemon (`client`) with a fresh view of it, and return the
        Dashboard screen for it, to push. The fleet dashboard opens a node this way
        (tui/fleet_app.py); the caller closes the client it replaced."""
        self.client = client
        self._reset_node()
        self._dashboard = Dashboard(self.history, readonly=self.readonly)
        return self._dashboard

    @property
    def dashboard(self) -> Dashboard:
        assert self._dashboard is not None
        return self._dashboard

    def on_mount(self) -> None:
        if self.user_keymap:
            self.set_keymap(self.user_keymap)

    async def on_unmount(self) -> None:
        close = getattr(self.client, "aclose", None)
        if close is not None:
            await close()

    @on(Dashboard.Ready)
    def start_polling(self) -> None:
        """The dashboard's widgets exist: the refresh timer starts (once: a dashboard pushed
        again by `attach` reuses it)."""
        if self._timer is None:
            self._timer = self.set_interval(self.refresh_s, self.tick)
        self.tick()

    @on(Dashboard.Resumed)
    def dashboard_resumed(self) -> None:
        """Back on the dashboard: show what arrived meanwhile, then fetch at once."""
        if self._pending and self.snapshot is not None:
            self._pending = False
            self.dashboard.render_snapshot(self.snapshot)
            self.renders += 1
            self._refresh_config_if_needed()
        self.tick()

    @property
    def on_dashboard(self) -> bool:
        try:
            return self.screen is self._dashboard
        except ScreenStackError:
            # shutting down: the refresh timer can fire once more after the last screen went
            return False

    # -- the loop -----------------------------------------------------------------------------

    def tick(self) -> None:
        """Timer callback: only schedules workers (none while another screen is on top)."""
        if not self.on_dashboard:
            return
        if self._status_worker is None or self._status_worker.is_finished:
            self._status_worker = self._fetch_status()
        if self.daemon_error is not None:
            return  # only the status call retries until the daemon answers again
        inst = self.selected_instance()
        if inst is not None and self._no_log == (inst.name, inst.lifecycle.run):
            return  # no log to follow until the instance runs (again)
        if self.selected and (self._log_worker is None or self._log_worker.is_finished):
            self._log_worker = self._fetch_log(self.selected)

    @work(name="status", group="status", exit_on_error=False)
    async def _fetch_status(self) -> None:
        self.post_message(SnapshotArrived(await self.client.status()))

    def on_snapshot_arrived(self, message: SnapshotArrived) -> None:
        if self.daemon_error is not None:
            self.daemon_error = None
            self.dashboard.show_daemon_error(None)
        self.last_snapshot_at = self.clock.monotonic()
        snap = message.snapshot
        if snap == self.snapshot:
            return  # nothing changed: no rendering work
        self.snapshot = snap
        self.history.append(snap)
        if not self.on_dashboard:
            self._pending = True
            return
        self.dashboard.render_snapshot(snap)
        self.renders += 1
        self._refresh_config_if_needed()

    def on_daemon_unreachable(self, message: DaemonUnreachable) -> None:
        self.daemon_error = message.error
        self.dashboard.show_daemon_error(message.error)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.state == WorkerState.ERROR:
            self.worker_failed(event.worker)

    def worker_failed(self, worker: Worker) -> None:
        """The one handler for failed workers (screens forward theirs here)."""
        error = worker.error
        text = str(error) or type(error).__name__
        if worker.group == "status":
            self.post_message(DaemonUnreachable(text))
        elif not _unreachable(error) and self.daemon_error is None:
            # An unreachable daemon is the banner's to report (the status worker sees it too).
            self.notify(text, title=f"{worker.name} failed", severity="error", timeout=8)

    # -- selection and its panes ----------------------------------------------------------------

    def selected_instance(self) -> InstanceStatus | None:
        if self.snapshot is None or self.selected is None:
            return None
        return self.snapshot.instance(self.selected)

    @on(Dashboard.Selected)
    def _selected(self, message: Dashboard.Selected) -> None:
        """The dashboard selected another instance: its log, config and history follow."""
        name = message.name
        if name == self.selected:
            return
        self.selected = name
        self._log_pos = None
        self._config_key = None
        if name is None:
            return
        self._log_worker = self._fetch_log(name)
        self._refresh_config_if_needed()
        if name not in self.history.seeded:
            self._fetch_history(name)

    def _refresh_config_if_needed(self) -> None:
        inst = self.selected_instance()
        if inst is None:
            return
        if self._no_log is not None and self._no_log != (inst.name, inst.lifecycle.run):
            self._no_log = None  # it ran since: its log exists now
            self._log_worker = self._fetch_log(inst.name)
        # vLLM reports its cache config once ready; a new run may have new args.
        key = (inst.name, inst.lifecycle.run, inst.lifecycle.state == State.READY)
        if key != self._config_key:
            self._config_key = key
            self._fetch_config(inst.name)

    @work(name="log tail", group="log", exclusive=True, exit_on_error=False)
    async def _fetch_log(self, name: str) -> None:
        pos = self._log_pos
        try:
            if pos is None or pos[0] != name:
                doc = await self.client.logs(name, tail=LOG_TAIL)
                reset = True
            else:
                doc = await self.client.logs(name, offset=pos[2])
                reset = False
                if doc.run != pos[1]:
                    doc = await self.client.logs(name, offset=0)  # a new run: a new file
                    reset = True
        except Exception as exc:
            if not is_missing(exc):
                raise
            inst = self.selected_instance()
            self._no_log = (name, inst.lifecycle.run if inst else None)
            self._log_pos = None
            self.post_message(LogChunk(name, False, f"({exc})\n", reset=True))
            return
        self._no_log = None
        self.post_message(LogChunk(name, False, doc.text, reset))
        self._log_pos = (name, doc.run, doc.offset)

    def on_log_chunk(self, message: LogChunk) -> None:
        if message.name != self.selected:
            return
        self.dashboard.show_log(message.text, message.reset)

    @work(name="config", group="config", exclusive=True, exit_on_error=False)
    async def _fetch_config(self, name: str) -> None:
        self.post_message(ConfigArrived(name, await self.client.config(name)))

    def on_config_arrived(self, message: ConfigArrived) -> None:
        if message.name == self.selected:
            self.dashboard.show_config(message.config)

    @work(name="history", group="history", exit_on_error=False)
    async def _fetch_history(self, name: str) -> None:
        self.post_message(HistoryArrived(name, await self.client.history(name)))

    def on_history_arrived(self, message: HistoryArrived) -> None:
        if self.snapshot is None or self.snapshot.instance(message.name) is None:
            return
        self.history.seed(message.name, message.history)
        if message.name == self.selected and self.on_dashboard:
            self.dashboard.show_history()

    # -- what the dashboard asks for ----------------------------------------------------------

    @on(Dashboard.Requested)
    def _requested(self, message: Dashboard.Requested) -> None:
        action, name = message.action, message.name
        if action in ("restart", "stop", "start", "drain", "sleep", "wake"):
            self.lifecycle(action, name)
        elif action in ("logs", "previous_logs"):
            self.open_logs(name, previous=action == "previous_logs")
        elif action == "add":
            self.edit_instance(None)
        elif action == "edit":
            self.edit_instance(name)
        elif action == "remove":
            self.remove_instance(name)
        elif action == "save":
            self.save_layout()
        elif action in ("promote_canary", "abort_canary"):
            self.end_canary_watch("promote" if action == "promote_canary" else "abort")
        elif action == "help":
            self.show_help()
        elif action == "detach":
            self.detach()

    # -- lifecycle actions ----------------------------------------------------------------------

    def lifecycle(self, verb: str, name: str | None) -> None:
        """start/stop/restart/drain instance `name`; destructive verbs ask first."""
        inst = self.snapshot.instance(name) if self.snapshot and name else None
        if inst is None:
            return
        if KEY_BY_ACTION[verb].confirm:
            question, details = _CONFIRM[verb]
            fields = _confirm_fields(inst)
            name = inst.name

            def confirmed(ok: bool | None) -> None:  # None: the screen was dismissed
                if ok:
                    self._send_action(verb, name)

            self.push_screen(
                ConfirmScreen(
                    question.format(**fields), details.format(**fields), yes=verb.title()
                ),
                callback=confirmed,
            )
        else:
            self._send_action(verb, inst.name)

    def end_canary_watch(self, verb: str) -> None:
        """`vsup rollout promote|abort` from the dashboard (asks first)."""
        r = self.snapshot.rollout if self.snapshot is not None else None
        if r is None:
            return
        canary = printable(", ".join(r.canary)) or "the canary"
        if verb == "promote":
            question = f"Promote canary {canary}?"
            details = "The watch ends now and the rollout goes on with the other waves."
        else:
            question = f"Abort canary {canary}?"
            details = (
                "The watch ends now: the canary goes back to its old spec (drained, no request "
                "cut) and the rollout ends rolled back."
            )

        def confirmed(ok: bool | None) -> None:
            if ok:
                self._send_rollout(verb)

        self.push_screen(ConfirmScreen(question, details, yes=verb.title()), callback=confirmed)

    @work(name="rollout", group="action", exit_on_error=False)
    async def _send_rollout(self, verb: str) -> None:
        try:
            await self.client.rollout(verb)
        except Exception as exc:
            self.notify(printable(str(exc)), title=f"{verb} refused", severity="error")
        else:
            done = (
                "canary promoted: the rollout goes on"
                if verb == "promote"
                else "canary aborted: it goes back to its old spec"
            )
            self.notify(done, timeout=5)
        self.tick()

    def swap(self, name: str, other: str) -> None:
        """Put `name` to sleep and wake `other` once its memory is released (asks first:
        `name` then serves nothing)."""
        inst = self.snapshot.instance(name) if self.snapshot else None
        if inst is None:
            return
        question, details = _CONFIRM["swap"]
        fields = {**_confirm_fields(inst), "other": other}

        def confirmed(ok: bool | None) -> None:
            if ok:
                self._send_action("swap", name, other)

        self.push_screen(
            ConfirmScreen(question.format(**fields), details.format(**fields), yes="Swap"),
            callback=confirmed,
        )

    @work(name="action", group="action", exit_on_error=False)
    async def _send_action(self, verb: str, name: str, other: str | None = None) -> None:
        """One action through the daemon (off the event loop); `other`: swap's instance to
        wake."""
        names = [name] if other is None else [name, other]
        what = " → ".join(names)
        self.notify(f"{verb}: {what}…", timeout=3)
        answer = await self.client.action(verb, names)
        errors = answer_errors(answer)
        if errors:
            self.notify("\n".join(errors), title=f"{verb} {what} refused", severity="error")
        else:
            self.notify(f"{verb}: {what} done", timeout=3)
        self.tick()

    def open_logs(self, name: str | None, previous: bool) -> None:
        if name is not None:
            self.push_screen(LogScreen(self.client, name, previous, poll_s=self.refresh_s))

    def show_help(self) -> None:
        keys = {k.id: self.key_display(k.id) for k in KEYS}
        self.push_screen(HelpScreen(keys, self.readonly))

    def key_display(self, binding_id: str) -> str:
        """What to press for a binding, as remapped by the keymap (`?`, `R`, `ctrl+d`)."""
        key = next(k for k in KEYS if k.id == binding_id)
        keys = self.user_keymap.get(binding_id, key.key)
        return ",".join(
            self.get_key_display(Binding(k.strip(), key.action)) for k in keys.split(",")
        )

    def detach(self) -> None:
        """Leave; the daemon and every instance keep running."""
        self.exit(
            message=f"detached: instances keep running; run `{self.attach_command}` to attach again"
        )

    # -- layout editing -------------------------------------------------------------------------

    async def _check_form(
        self, toml_text: str, path: str | None, replace: str | None, values: dict[str, str]
    ) -> Verdict:
        try:
            table = layout_edit.parse_form(values)
        except layout_edit.FieldError as exc:
            return Verdict(toml_text, errors=[str(exc)])
        existing = layout_edit.instance_table(toml_text, replace, path) if replace else None
        return await check_instance(
            self.client,
            toml_text,
            path,
            layout_edit.merged_table(existing, table),
            replace,
            self._node_gpus(),
            self.local_checks,
        )

    def _node_gpus(self) -> int | None:
        if self.node_gpus is not None:
            return self.node_gpus
        return self.snapshot.node.gpu_count if self.snapshot else None

    def _suggested(self) -> dict[str, str]:
        names = {i.name for i in self.snapshot.instances} if self.snapshot else set()
        ports = [i.port for i in self.snapshot.instances if i.port] if self.snapshot else []
        n = len(names)
        while f"instance{n}" in names:
            n += 1
        return {"name": f"instance{n}", "port": str(max(ports) + 1 if ports else 8000)}

    @work(name="layout edit", group="layout-edit", exclusive=True, exit_on_error=False)
    async def edit_instance(self, name: str | None) -> None:
        """Add (`name` None) or edit an instance through the form, then apply the layout."""
        doc = await self.client.layout()
        toml_text, path = doc.toml or "", doc.path
        if not toml_text:
            self.notify("no layout is running: `vsup up LAYOUT` first", severity="warning")
            return
        if name is None:
            values, title = self._suggested(), "Add an instance"
        else:
            try:
                values = layout_edit.form_values(layout_edit.instance_table(toml_text, name, path))
            except KeyError:
                self.notify(f"{name} is not in the running layout {path or ''}", severity="error")
                return
            title = f"Edit {name} ({path or 'unsaved layout'})"
        check = functools.partial(self._check_form, toml_text, path, name)
        verdict = await self.push_screen_wait(InstanceFormScreen(title, values, check))
        if verdict is None:
            return
        await self._apply(verdict, path)

    @work(name="layout edit", group="layout-edit", exclusive=True, exit_on_error=False)
    async def remove_instance(self, name: str | None) -> None:
        """Remove `name` from the running layout (it is stopped), after validation and a yes."""
        if name is None:
            return
        doc = await self.client.layout()
        toml_text, path = doc.toml or "", doc.path
        try:
            new_toml = layout_edit.without_instance(toml_text, name, path)
        except KeyError:
            self.notify(f"{name} is not in the running layout {path}", severity="error")
            return
        verdict = await check_layout(
            self.client, new_toml, path, self._node_gpus(), self.local_checks
        )
        if not verdict.ok:
            self.notify("\n".join(verdict.errors), title=f"{name} not removed", severity="error")
            return
        ok = await self.push_screen_wait(
            ConfirmScreen(
                f"Remove {name} from the layout?",
                f"It is stopped and leaves the running layout ({plan_text(verdict.plan)}). "
                "Save (w) writes the layout file.",
                yes="Remove",
            )
        )
        if ok:
            await self._apply(verdict, path, confirmed=True)

    async def _apply(self, verdict: Verdict, path: str | None, confirmed: bool = False) -> None:
        plan = verdict.plan
        if not confirmed and (plan.restart or plan.stop):
            ok = await self.push_screen_wait(
                ConfirmScreen(
                    "Apply the edited layout?",
                    f"{plan_text(plan)}. Restarted instances drop the requests they are serving.",
                    yes="Apply",
                )
            )
            if not ok:
                return
        elif not confirmed and plan.start:
            # a start takes memory, cores or a GPU share from what runs: asked like the others
            names = ", ".join(plan.start)
            ok = await self.push_screen_wait(
                ConfirmScreen(
                    f"Start {names}?",
                    f"{plan_text(plan)}. The layout is applied now and {names} starts; save (w) "
                    "keeps it in the layout file.",
                    yes="Start",
                )
            )
            if not ok:
                return
        try:
            answer = await self.client.apply(verdict.toml, path)
        except Exception as exc:  # a refusal: say what the daemon said
            self.notify(
                "\n".join(error_messages(exc)), title="layout not applied", severity="error"
            )
            return
        errors = answer_errors(answer)
        if errors:
            self.notify("\n".join(errors), title="layout not applied", severity="error")
            return
        note = plan_text(answer.plan or plan)
        if verdict.warnings:
            note += "\n" + "\n".join(f"▲ {w}" for w in verdict.warnings)
        self.notify(note, title="layout applied; save (w) to keep it", timeout=6)
        self.tick()

    @work(name="save", group="layout-save", exclusive=True, exit_on_error=False)
    async def save_layout(self) -> None:
        """Ask for a file and save the running layout there through the daemon."""
        doc = await self.client.layout()
        written = await self.push_screen_wait(SaveScreen(doc.path or "layout.toml", self._save_to))
        if written:
            if self._save_lost:
                self.notify(
                    f"saved the running layout to {escape(written)}, but {escape(self._save_lost)}",
                    severity="warning",
                    timeout=12,
                )
            else:
                kept = " (its comments and formatting kept)" if self._save_kept else ""
                self.notify(f"saved the running layout to {escape(written)}{kept}", timeout=5)
            if self._save_outdated:
                names = escape(", ".join(self._save_outdated))
                self.notify(
                    f"{names} still run an older spec than the saved layout (a rolling apply "
                    "did not finish); apply it again to restart them with it",
                    severity="warning",
                    timeout=10,
                )

    async def _save_to(self, path: str) -> str:
        answer = await self.client.save(path)
        self._save_outdated = list(answer.outdated)
        self._save_kept = answer.kept_format
        self._save_lost = answer.format_lost or None
        return answer.path or path

    # -- command palette ------------------------------------------------------------------------

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        if screen is self._dashboard:
            inst = self.selected_instance()
            for key in KEYS:
                if screen.check_action(key.action, ()) is not True:
                    continue  # offer only what applies now
                title = key.description
                if key.selection and inst is not None:
                    title = f"{key.description} {inst.name}"
                yield SystemCommand(
                    title,
                    escape(f"{key.help} · key {self.key_display(key.id)}"),
                    functools.partial(self.run_action, key.action, screen),
                )
            yield from self._swap_commands(screen, inst)
            for sort, (label, _, _) in rows.SORTS.items():
                yield SystemCommand(
                    f"Sort by {label}",
                    "Order the instances table",
                    functools.partial(self._sort_by, sort),
                    discover=False,
                )
        yield from super().get_system_commands(screen)

    def _swap_commands(
        self, screen: Screen, inst: InstanceStatus | None
    ) -> Iterable[SystemCommand]:
        """`Swap A → B`: one entry per sleeping instance B the selected A (awake, with sleep
        mode) can hand its GPU to; B's swap group first."""
        if inst is None or self.snapshot is None or screen.check_action("sleep", ()) is not True:
            return
        group = inst.sleep.group if inst.sleep is not None else None
        sleepers = [i for i in self.snapshot.instances if i.name != inst.name and fmt.is_asleep(i)]
        sleepers.sort(key=lambda i: (i.sleep is None or i.sleep.group != group, i.name))
        for other in sleepers:
            same = other.sleep is not None and group is not None and other.sleep.group == group
            where = f" (swap group {group})" if same else ""
            yield SystemCommand(
                f"Swap {inst.name} → {other.name}",
                escape(f"{inst.name} sleeps, then {other.name} wakes{where} (asks first)"),
                functools.partial(self.swap, inst.name, other.name),
            )

    def _sort_by(self, sort: str) -> None:
        self.dashboard.sort_by(sort)
