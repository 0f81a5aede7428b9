"""Ask before anything destructive: `y`/Enter confirms, `n`/Escape cancels."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static


class ConfirmScreen(ModalScreen[bool]):
    """A yes/no question; dismisses with True only on an explicit yes."""

    DEFAULT_CSS = """
    ConfirmScreen { align: center middle; }
    ConfirmScreen > Vertical {
        width: 64; max-width: 95%; height: auto; max-height: 90%;
        border: thick $warning; background: $surface; padding: 1 2;
    }
    ConfirmScreen #question { text-style: bold; }
    ConfirmScreen #details { margin-top: 1; color: $text-muted; height: auto; }
    ConfirmScreen Horizontal { height: 1; margin-top: 1; align-horizontal: right; }
    ConfirmScreen Button { margin-left: 2; }
    """

    BINDINGS = [
        Binding("y", "answer(True)", "Yes", show=False),
        Binding("n,escape", "answer(False)", "No", show=False),
    ]

    def __init__(self, question: str, details: str | Text = "", yes: str = "Yes") -> None:
        super().__init__()
        self.question = question
        self.details = details
        self.yes = yes

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(self.question, id="question")
            if self.details:
                yield Static(self.details, id="details")
            with Horizontal():
                yield Button("No (n)", id="no", compact=True)
                yield Button(f"{self.yes} (y)", id="yes", variant="error", compact=True)

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(event.button.id == "yes")

    def action_answer(self, answer: bool) -> None:
        self.dismiss(answer)
