"""Add or edit an instance: a form checked in a worker by the same rules as `vsup validate`.

The form stays open until its layout validates; errors are shown under the fields as the
validator words them (file, instance, key, what to change). It dismisses with the `Verdict`
(the new layout, its warnings and the daemon's plan), or None when cancelled.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static

from vsup.tui.layout_edit import FIELDS
from vsup.tui.screens.base import ReportsWorkerErrors
from vsup.tui.validation import Verdict

Check = Callable[[dict[str, str]], Awaitable[Verdict]]


class InstanceFormScreen(ReportsWorkerErrors, ModalScreen["Verdict | None"]):
    """The instance form; `check(values)` builds and validates the resulting layout."""

    DEFAULT_CSS = """
    InstanceFormScreen { align: center middle; }
    InstanceFormScreen > Vertical {
        width: 90; max-width: 100%; height: auto; max-height: 100%;
        border: thick $primary; background: $surface; padding: 0 1;
    }
    InstanceFormScreen VerticalScroll { height: auto; max-height: 1fr; }
    InstanceFormScreen .row { height: 1; margin-top: 1; }
    InstanceFormScreen .row Label { width: 18; padding: 0 1 0 0; text-align: right; }
    InstanceFormScreen .row Input { width: 1fr; }
    InstanceFormScreen #status { height: auto; max-height: 12; margin: 1 0 0 0; }
    InstanceFormScreen #status.-error { color: $error; }
    InstanceFormScreen #buttons { height: 1; margin: 1 0; align-horizontal: right; }
    InstanceFormScreen Button { margin-left: 2; }
    """

    BINDINGS = [
        Binding("escape", "cancel", "Cancel"),
        Binding("ctrl+s", "submit", "Validate and apply"),
    ]

    def __init__(self, title: str, values: Mapping[str, str], check: Check) -> None:
        super().__init__()
        self.form_title = title
        self.initial = dict(values)
        self.check = check
        self.verdict: Verdict | None = None

    def compose(self) -> ComposeResult:
        with Vertical() as box:
            box.border_title = self.form_title
            with VerticalScroll():
                for key, label, placeholder in FIELDS:
                    with Horizontal(classes="row"):
                        yield Label(label, id=f"label-{key}")
                        yield Input(
                            self.initial.get(key, ""),
                            placeholder=placeholder,
                            id=f"field-{key}",
                            compact=True,
                        )
            yield Static("Enter or ctrl+s validates and applies; Escape cancels.", id="status")
            with Horizontal(id="buttons"):
                yield Button("Cancel", id="cancel", compact=True)
                yield Button("Validate and apply", id="submit", variant="primary", compact=True)

    def on_mount(self) -> None:
        self.query_one(f"#field-{FIELDS[0][0]}", Input).focus()

    def values(self) -> dict[str, str]:
        return {key: self.query_one(f"#field-{key}", Input).value for key, _, _ in FIELDS}

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if event.button.id == "submit":
            self.action_submit()
        else:
            self.action_cancel()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.action_submit()

    def action_cancel(self) -> None:
        self.dismiss(None)

    def action_submit(self) -> None:
        self._show("validating…", error=False)
        self._validate(self.values())

    @work(exclusive=True, group="form-validate", exit_on_error=False)
    async def _validate(self, values: dict[str, str]) -> None:
        verdict = await self.check(values)
        self.verdict = verdict
        if verdict.ok:
            self.dismiss(verdict)
            return
        text = Text("Not applied — fix this first:\n", "bold")
        text.append("\n".join(f"✖ {e}" for e in verdict.errors))
        if verdict.warnings:
            text.append("\n" + "\n".join(f"▲ {w}" for w in verdict.warnings), "yellow")
        self._show(text, error=True)

    def _show(self, message: str | Text, error: bool) -> None:
        status = self.query_one("#status", Static)
        status.update(message)
        status.set_class(error, "-error")

    @property
    def status_text(self) -> str:
        """What the status line says now (tests read it)."""
        content = self.query_one("#status", Static).content
        return content.plain if isinstance(content, Text) else str(content)
