"""Save the running layout as TOML through the daemon's save route (atomic; the daemon
refuses an invalid layout, and the refusal is shown here)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Static

from vsup.tui.screens.base import ReportsWorkerErrors

# path -> the path written; raises with the daemon's message when refused
Save = Callable[[str], Awaitable[str]]


class SaveScreen(ReportsWorkerErrors, ModalScreen["str | None"]):
    """Asks for the file; dismisses with the written path, or None when cancelled."""

    DEFAULT_CSS = """
    SaveScreen { align: center middle; }
    SaveScreen > Vertical {
        width: 80; max-width: 100%; height: auto;
        border: thick $primary; background: $surface; padding: 0 1;
    }
    SaveScreen #status { height: auto; margin-top: 1; }
    SaveScreen #status.-error { color: $error; }
    SaveScreen #path { margin-top: 1; }
    SaveScreen Horizontal { height: 1; margin: 1 0; align-horizontal: right; }
    SaveScreen Button { margin-left: 2; }
    """

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, path: str, save: Save) -> None:
        super().__init__()
        self.initial = path
        self.save = save

    def compose(self) -> ComposeResult:
        with Vertical() as box:
            box.border_title = "Save the running layout"
            yield Input(self.initial, placeholder="layout.toml", id="path", compact=True)
            yield Static(
                "Enter writes the file (temp file + rename; over a layout file, its comments "
                "and formatting are kept); Escape cancels.",
                id="status",
            )
            with Horizontal():
                yield Button("Cancel", id="cancel", compact=True)
                yield Button("Save", id="save", variant="primary", compact=True)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if event.button.id == "save":
            self._save(self.query_one("#path", Input).value)
        else:
            self.dismiss(None)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self._save(event.value)

    def action_cancel(self) -> None:
        self.dismiss(None)

    @work(exclusive=True, group="save", exit_on_error=False)
    async def _save(self, path: str) -> None:
        status = self.query_one("#status", Static)
        if not path.strip():
            status.update("give a file name")
            status.add_class("-error")
            return
        status.update("saving…")
        status.remove_class("-error")
        try:
            written = await self.save(path.strip())
        except Exception as exc:  # the daemon's refusal, shown where the operator looks
            status.update(f"✖ not saved: {exc}")
            status.add_class("-error")
            return
        self.dismiss(written)
