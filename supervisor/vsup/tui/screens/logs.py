"""Full-screen log of one instance: this run, followed, or the previous run (k9s `l`/`p`)."""

from __future__ import annotations

from collections import deque

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Footer, Static

from vsup.tui.client import DashboardClient, is_missing
from vsup.tui.screens.base import ReportsWorkerErrors
from vsup.tui.widgets.detail import is_shown
from vsup.tui.widgets.livelog import LiveLog

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
        self.log_run: int | None = None
        self.log_path: str | None = None
        self.reads = 0
        self.hide_probes = True  # uvicorn access lines of vsup's own /health, /metrics
        self._raw: deque[str] = deque(maxlen=MAX_LINES)  # what was read, to show it again

    def compose(self) -> ComposeResult:
        yield Static(self._title(), id="log-title")
        yield LiveLog(
            max_lines=MAX_LINES,
            auto_scroll=True,
            id="log-full",
            keep=is_shown if self.hide_probes else None,
        )
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
        log = self.query_one(LiveLog)
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
                log.note(f"({exc})")
            return
        self.reads += 1
        if self.log_offset is not None and doc.run != self.log_run:
            # the instance restarted: its new run is a new file, read from its start
            log.note(f"──── new run {doc.run} ────")
            self._raw.clear()
            doc = await self.client.logs(self.instance, previous=self.previous, offset=0)
        self.log_run = doc.run
        self.log_path = doc.path
        self.log_offset = doc.offset
        text = doc.text
        if text:
            self._raw.extend(text.splitlines(keepends=True))
            log.feed(text)
        elif self.reads == 1:
            log.note("(empty)" if not self.previous else "(no previous run)")
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
        log = self.query_one(LiveLog)
        log.keep = is_shown if self.hide_probes else None
        log.rewrite("".join(self._raw))
        self.query_one("#log-title", Static).update(self._title())

    def action_top(self) -> None:
        self.query_one(LiveLog).scroll_home(animate=False)

    def action_bottom(self) -> None:
        self.query_one(LiveLog).scroll_end(animate=False)
