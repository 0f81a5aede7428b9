"""Where vsup keeps its state: VSUP_HOME, else an XDG state directory."""

from __future__ import annotations

import os
from pathlib import Path


def vsup_home() -> Path:
    """The directory for the socket, state file, journal and logs (created 0700)."""
    env = os.environ.get("VSUP_HOME")
    if env:
        home = Path(env).expanduser()
    else:
        state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
        home = Path(state) / "vsup"
    home = home.absolute()
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    return home


def socket_path(home: Path | None = None) -> Path:
    return (home or vsup_home()) / "vsup.sock"


def state_path(home: Path | None = None) -> Path:
    return (home or vsup_home()) / "state.json"


def journal_path(home: Path | None = None) -> Path:
    return (home or vsup_home()) / "journal.jsonl"


def logs_dir(home: Path | None = None) -> Path:
    d = (home or vsup_home()) / "logs"
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    return d


def builtin_configs_dir() -> Path:
    """The profiles shipped with vsup: `vsup/configs` in the installed package (the wheel copies
    the checkout's `configs/` there), `configs/` when run from a source checkout."""
    here = Path(__file__).resolve().parent
    packaged = here / "configs"
    if packaged.is_dir():
        return packaged
    return here.parent.parent / "configs"
