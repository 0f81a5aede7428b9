"""Full-screen log of one instance: this run, followed, or the previous run (k9s `l`/`p`)."""

from __future__ import annotations

from collections import deque

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Footer, Log, Static

from vsup.tui.client import DashboardClient, is_missing
from vsup.tui.screens.base import ReportsWorkerErrors
from vsup.tui.widgets.detail import without_probes

FIRST_READ = 256 * 1024  # bytes of the end of the file shown on open
MAX_LINES = 50_000


class LogScreen(ReportsWorkerErrors, Screen[None]):
    """Reads the log through the daemon; following polls from the last offset."""

    DEFAULT_CSS = """
    LogScreen #log-title { height: 1; background: $panel; padding: 0 1; }
    LogScreen Log { height: 1fr; }
    """

    BINDINGS = [
        Binding("escape,q", "close", "Back"),
        Binding("f", "toggle_follow", "Follow on/off"),
        Binding("h", "toggle_probes", "vsup's probes on/off"),
        Binding("home", "top", "Top", show=False),
        Binding("end", "bottom", "End", show=False),
    ]

    def __init__(
        self, client: DashboardClient, name: str, previous: bool, poll_s: float = 1.0
    ) -> None:
        super().__init__()
        self.client = client
        self.instance = name
        self.previous = previous
        self.follow = not previous
        self.poll_s = poll_s
        self.log_offset: int | None = None
        self.log_run: object = None
        self.log_path: str | None = None
        self.reads = 0
        self.hide_probes = True  # uvicorn access lines of vsup's own /health, /metrics
        self._raw: deque[str] = deque(maxlen=MAX_LINES)

    def compose(self) -> ComposeResult:
        yield Static(self._title(), id="log-title")
        yield Log(max_lines=MAX_LINES, auto_scroll=True, id="log-full")
        yield Footer()

    def _title(self) -> str:
        which = "previous run" if self.previous else "this run"
        follow = (
            " · following"
            if self.follow
            else (" · paused (f follows)" if not self.previous else "")
        )
        where = f" · {self.log_path}" if self.log_path else ""
        probes = " · vsup's probes hidden (h)" if self.hide_probes else ""
        return f"log of {self.instance} · {which}{follow}{probes}{where}"

    def on_mount(self) -> None:
        self._read()
        if not self.previous:
            self.set_interval(self.poll_s, self._tick)

    def _tick(self) -> None:
        if self.follow and self.is_current:
            self._read()

    @work(name="log", exclusive=True, group="log-screen", exit_on_error=False)
    async def _read(self) -> None:
        log = self.query_one(Log)
        try:
            if self.log_offset is None:
                doc = await self.client.logs(self.instance, previous=self.previous, tail=FIRST_READ)
            else:
                doc = await self.client.logs(
                    self.instance, previous=self.previous, offset=self.log_offset
                )
        except Exception as exc:
            if not is_missing(exc):
                raise
            self.reads += 1
            if self.reads == 1:
                log.write_line(f"({exc})")
            return
        self.reads += 1
        if self.log_offset is not None and doc.get("run") != self.log_run:
            # the instance restarted: its new run is a new file, read from its start
            log.write_line(f"──── new run {doc.get('run')} ────")
            doc = await self.client.logs(self.instance, previous=self.previous, offset=0)
        self.log_run = doc.get("run")
        self.log_path = doc.get("path")
        self.log_offset = doc.get("offset")
        text = doc.get("text") or ""
        if text:
            self._raw.extend(text.splitlines(keepends=True))
            shown = without_probes(text) if self.hide_probes else text
            if shown:
                log.write(shown)
        elif self.reads == 1:
            log.write_line("(empty)" if not self.previous else "(no previous run)")
        self.query_one("#log-title", Static).update(self._title())

    def action_close(self) -> None:
        self.dismiss(None)

    def action_toggle_follow(self) -> None:
        if self.previous:
            return
        self.follow = not self.follow
        self.query_one("#log-title", Static).update(self._title())
        if self.follow:
            self._read()

    def action_toggle_probes(self) -> None:
        self.hide_probes = not self.hide_probes
        log = self.query_one(Log)
        log.clear()
        text = "".join(self._raw)
        log.write(without_probes(text) if self.hide_probes else text)
        self.query_one("#log-title", Static).update(self._title())

    def action_top(self) -> None:
        self.query_one(Log).scroll_home(animate=False)

    def action_bottom(self) -> None:
        self.query_one(Log).scroll_end(animate=False)
