"""The dashboard's keys: every binding has an id, so an operator can remap it.

Remapping (Posting's pattern, over Textual's keymap): a `[keymap]` table in
`$VSUP_TUI_CONFIG` or `$XDG_CONFIG_HOME/vsup/tui.toml` (`restart = "R"`), then
`VSUP_KEYMAP="restart=R;stop=ctrl+k"` on top. Tests pass a keymap explicitly and never read
the operator's files (`load_keymap(discover=False)`).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from textual.binding import Binding, BindingType


@dataclass(frozen=True)
class Key:
    id: str
    key: str
    action: str
    description: str
    help: str
    show: bool = True  # in the footer (all terminals)
    wide: bool = False  # in the footer of a wide terminal only
    mutates: bool = False  # changes instances or files: disabled by --readonly
    confirm: bool = False  # destructive: asks first
    selection: bool = False  # acts on the selected instance


KEYS: tuple[Key, ...] = (
    Key(
        "restart",
        "r",
        "restart",
        "Restart",
        "Restart the selected instance (asks first)",
        mutates=True,
        confirm=True,
        selection=True,
    ),
    Key(
        "stop",
        "x",
        "stop",
        "Stop",
        "Stop the selected instance (asks first)",
        mutates=True,
        confirm=True,
        selection=True,
    ),
    Key(
        "start", "u", "start", "Start", "Start the selected instance", mutates=True, selection=True
    ),
    Key(
        "drain",
        "d",
        "drain",
        "Drain",
        "Wait for running requests to finish, then stop (asks first)",
        mutates=True,
        confirm=True,
        selection=True,
    ),
    Key(
        "sleep",
        "z",
        "sleep",
        "Sleep",
        "Put the selected instance to sleep: vLLM's sleep mode frees its GPU memory and it serves "
        "nothing until woken (asks first; needs a `sleep` table in the layout)",
        show=False,
        mutates=True,
        confirm=True,
        selection=True,
    ),
    Key(
        "wake",
        "Z",
        "wake",
        "Wake",
        "Wake the selected sleeping instance (it rejoins the router once it answers); "
        "swap in the palette (ctrl+p) puts the selected one to sleep and wakes another",
        show=False,
        mutates=True,
        selection=True,
    ),
    Key(
        "logs",
        "l",
        "logs",
        "Logs",
        "Full-screen log of the selected instance, following",
        selection=True,
    ),
    Key(
        "previous_logs",
        "p",
        "previous_logs",
        "Prev log",
        "Full-screen log of the selected instance's previous run",
        show=False,
        selection=True,
    ),
    Key(
        "filter",
        "slash",
        "filter",
        "Filter",
        "Filter instances by name, model, state, backend, port; in the filter: / or Enter "
        "back to the table (kept), Escape clears it",
    ),
    Key(
        "sort",
        "s",
        "sort",
        "Sort",
        "Sort by the next column (state, KV, preemptions...)",
        show=False,
        wide=True,
    ),
    Key("sort_reverse", "S", "sort_reverse", "Reverse", "Reverse the sort order", show=False),
    Key(
        "next_tab",
        "t",
        "next_tab",
        "Tab",
        "Next tab of the detail pane: Log, Config, Exit",
        show=False,
        wide=True,
    ),
    Key("tab_log", "1", "tab_log", "Log tab", "Detail pane: the live log", show=False),
    Key("tab_config", "2", "tab_config", "Config tab", "Detail pane: the config", show=False),
    Key("tab_exit", "3", "tab_exit", "Exit tab", "Detail pane: the last exit", show=False),
    Key(
        "add",
        "a",
        "add",
        "Add",
        "Add an instance to the layout (validated; asks before it is applied)",
        show=False,
        wide=True,
        mutates=True,
    ),
    Key(
        "edit",
        "e",
        "edit",
        "Edit",
        "Edit the selected instance in the layout",
        show=False,
        wide=True,
        mutates=True,
        selection=True,
    ),
    Key(
        "remove",
        "ctrl+d",
        "remove",
        "Remove",
        "Remove the selected instance from the layout (asks first; it is stopped)",
        show=False,
        mutates=True,
        confirm=True,
        selection=True,
    ),
    Key(
        "save",
        "w",
        "save",
        "Save",
        "Write the running layout as TOML (atomic; never invalid)",
        show=False,
        wide=True,
        mutates=True,
    ),
    Key(
        "promote",
        "P",
        "promote_canary",
        "Promote",
        "While a canary is watched: end the watch, the rollout goes on with the other waves "
        "(asks first; `vsup rollout promote`)",
        mutates=True,
        confirm=True,
    ),
    Key(
        "abort",
        "A",
        "abort_canary",
        "Abort canary",
        "While a canary is watched: end the watch, the canary goes back to its old spec "
        "(drained) and the rollout ends rolled back (asks first; `vsup rollout abort`)",
        mutates=True,
        confirm=True,
    ),
    Key("help", "question_mark", "help", "Help", "Keys and what the columns mean"),
    Key("detach", "q", "detach", "Detach", "Close the dashboard; instances keep running"),
)

KEY_BY_ACTION = {k.action: k for k in KEYS}
WIDE_FOOTER = frozenset(k.id for k in KEYS if k.wide)
MUTATING_ACTIONS = frozenset(k.action for k in KEYS if k.mutates)
CANARY_ACTIONS = frozenset(("promote_canary", "abort_canary"))  # only while a canary is watched


def bindings() -> list[BindingType]:
    """The dashboard's Textual bindings (ids = the keymap's names)."""
    return [
        Binding(k.key, k.action, k.description, show=k.show, id=k.id, tooltip=k.help) for k in KEYS
    ]


def parse_env(text: str) -> dict[str, str]:
    """`restart=R;stop=ctrl+k` -> `{"restart": "R", "stop": "ctrl+k"}`."""
    out = {}
    for part in text.split(";"):
        if not part.strip():
            continue
        ident, sep, keys = part.partition("=")
        if not sep or not keys.strip():
            raise ValueError(f"VSUP_KEYMAP: {part!r} is not ID=KEY (e.g. restart=R)")
        out[ident.strip()] = keys.strip()
    return out


def config_path(environ: Mapping[str, str]) -> Path:
    if environ.get("VSUP_TUI_CONFIG"):
        return Path(environ["VSUP_TUI_CONFIG"]).expanduser()
    base = environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "vsup" / "tui.toml"


def load_keymap(discover: bool = True, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The operator's remapped keys (binding id -> keys). Unknown ids are an error that names
    the file or variable and lists the ids."""
    if not discover:
        return {}
    env = os.environ if environ is None else environ
    keymap: dict[str, str] = {}
    path = config_path(env)
    if path.is_file():
        try:
            table = tomllib.loads(path.read_text()).get("keymap", {})
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"{path}: {exc}") from None
        _check(table, str(path))
        keymap.update({k: str(v) for k, v in table.items()})
    if env.get("VSUP_KEYMAP"):
        table = parse_env(env["VSUP_KEYMAP"])
        _check(table, "VSUP_KEYMAP")
        keymap.update(table)
    return keymap


def _check(table: Mapping[str, object], where: str) -> None:
    known = {k.id for k in KEYS}
    unknown = sorted(set(table) - known)
    if unknown:
        raise ValueError(
            f"{where}: unknown key binding id(s) {', '.join(unknown)}; "
            f"known: {', '.join(sorted(known))}"
        )
