"""`?`: every key (as remapped) and what the symbols and columns mean."""

from __future__ import annotations

from collections.abc import Mapping

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.markup import escape
from textual.screen import ModalScreen
from textual.widgets import Static

from vsup.tui import fmt, gpubar
from vsup.tui.keymap import KEYS


def help_table(keys: Mapping[str, str], readonly: bool) -> Table:
    """Keys by binding id (`keys` maps id -> what to press), then the legend."""
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    for key in KEYS:
        note = "  (disabled: --readonly)" if readonly and key.mutates else ""
        table.add_row(keys.get(key.id, key.key), Text(key.help + note, "dim" if note else ""))
    table.add_row(
        "ctrl+p",
        "Command palette: every action that applies to the selection; `Swap A → B` puts the "
        "selected instance to sleep and wakes B",
    )
    table.add_row("", "")
    table.add_row(Text("states", "bold underline"), "")
    for state, (symbol, style) in fmt.STATE_LOOK.items():
        table.add_row(Text(symbol, style), state)
    table.add_row(
        Text(f"{fmt.SLEEP_SYMBOL} asleep L1", fmt.SLEEP_STYLE),
        "sleep mode: a live server that frees its GPU memory and serves nothing (L1: weights in "
        "host RAM, L2: dropped); `sleeping…` falling asleep, `waking…`; HBM: what it keeps",
    )
    table.add_row("", "")
    table.add_row(Text("HBM bar", "bold underline"), "")
    table.add_row(
        f"{gpubar.INSTANCE_CHARS[0]} {gpubar.INSTANCE_CHARS[1]}",
        "memory of each instance on the GPU (alternating)",
    )
    table.add_row(gpubar.FOREIGN[0], "held by processes no instance owns")
    table.add_row(gpubar.OTHER[0], "used but not attributed (driver, or no per-process figures)")
    table.add_row(gpubar.PLAN_MARK, "where an instance's planned share ends")
    table.add_row("▲ 61.0/56.4G", "HBM past plan + vLLM's own overhead, or growing (advice)")
    table.add_row("~", "HBM read per device, not per process")
    table.add_row("", "")
    table.add_row(Text("columns", "bold underline"), "")
    table.add_row("KV / KV TOK", "KV-cache use and its capacity in tokens")
    table.add_row("PREEMPT, PRE/M", "preemptions since start and per minute (KV cache too small)")
    table.add_row("RUN/WAIT", "requests running / waiting")
    table.add_row("BACKEND", "attention backend from the startup log; ~flag / ~default: inferred")
    return table


class HelpScreen(ModalScreen[None]):
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll {
        width: 96; max-width: 100%; height: auto; max-height: 100%;
        border: thick $primary; background: $surface; padding: 0 1;
    }
    """

    BINDINGS = [Binding("escape,q,question_mark", "close", "Close")]

    def __init__(self, keys: Mapping[str, str], readonly: bool) -> None:
        super().__init__()
        self.keys = keys
        self.readonly = readonly

    def compose(self) -> ComposeResult:
        with VerticalScroll() as box:
            box.border_title = escape(
                "vsup dashboard · keys (remap: ~/.config/vsup/tui.toml [keymap] or VSUP_KEYMAP)"
            )
            yield Static(help_table(self.keys, self.readonly))

    def action_close(self) -> None:
        self.dismiss(None)
