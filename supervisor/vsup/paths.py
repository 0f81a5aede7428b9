"""Where vsup keeps its state: VSUP_HOME, else an XDG state directory.

vsup never changes the mode of a directory it did not create. The home it uses is:
- the directory named, when it is missing (vsup creates it, 0700) or when it is already this
  user's and nobody else can write to it (used as it is);
- `vsup-<uid>` inside it when the directory named is shared: owned by someone else, or
  writable by the group or by everyone (`VSUP_HOME=/tmp` uses `/tmp/vsup-<uid>`, 0700). That
  private directory must be a real directory of this user that no one else can write to;
  anything else there is refused (HomeError), never taken over.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


class HomeError(OSError):
    """VSUP_HOME cannot be used safely; the message says what to change."""


def vsup_home(create: bool = True) -> Path:
    """The directory for the socket, state file, journal and logs (see the module's rules).
    `create=False` names it without creating anything (`vsup paths`)."""
    env = os.environ.get("VSUP_HOME")
    home = Path(env).expanduser() if env else _default_home()
    return private_home(home.absolute(), create=create)


def _default_home() -> Path:
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "vsup"


def vsup_program() -> str:
    """How to run this vsup from a shell: `vsup` when that is the one on PATH, else its path
    (`make demo` runs the checkout's .venv, which is rarely activated)."""
    import shutil
    import sys

    mine = Path(sys.executable).parent / "vsup"
    found = shutil.which("vsup")
    if found and Path(found).resolve() == mine.resolve():
        return "vsup"
    return str(mine) if mine.exists() else f"{sys.executable} -m vsup"


def attach_command(home: Path | None = None) -> str:
    """The shell command that reaches the daemon of `home` (default: this VSUP_HOME): the
    program alone when a plain run finds that home (the default one), else with
    `VSUP_HOME=...` before it - a plain `vsup` would look in the default home and find no
    daemon there (the demo's, a test's, a service's own home)."""
    import shlex

    home = vsup_home(create=False) if home is None else home
    try:
        default = private_home(_default_home().absolute(), create=False)
    except OSError:
        default = None
    program = vsup_program()
    if default is not None and home == default:
        return program
    return f"VSUP_HOME={shlex.quote(str(home))} {program}"


def private_home(home: Path, create: bool = True) -> Path:
    """`home`, or the private `vsup-<uid>` inside it when `home` is shared (module docstring).
    A directory this user may not enter or write gives a HomeError saying what to do."""
    try:
        return _private_home(home, create)
    except HomeError:
        raise
    except PermissionError as exc:
        raise HomeError(_denied(home, exc)) from None


def _denied(home: Path, exc: PermissionError) -> str:
    where = Path(exc.filename) if exc.filename else home
    user = _user_name()
    return (
        f"VSUP_HOME {home}: user {user} may not use {where} (permission denied); set "
        "VSUP_HOME to a directory of yours, e.g. export VSUP_HOME=$HOME/.local/state/vsup"
    )


def _user_name() -> str:
    import pwd

    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return f"uid {os.getuid()}"


def _private_home(home: Path, create: bool) -> Path:
    uid = os.getuid()
    try:
        st = os.stat(home)
    except FileNotFoundError:
        if create:
            _make_private(home)
        return home
    if not stat.S_ISDIR(st.st_mode):
        raise HomeError(f"VSUP_HOME {home} is not a directory; point VSUP_HOME at a directory")
    if st.st_uid == uid and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return home
    inner = home / f"vsup-{uid}"
    try:
        ist = os.lstat(inner)
    except FileNotFoundError:
        if create:
            _make_private(inner)
        return inner
    if not stat.S_ISDIR(ist.st_mode) or ist.st_uid != uid:
        raise HomeError(
            f"{home} is shared, so vsup uses {inner}, but that is not a directory of user {uid} "
            f"(a symlink, a file or someone else's); remove it or set VSUP_HOME elsewhere"
        )
    if ist.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise HomeError(
            f"{inner} is writable by other users; `chmod 700 {inner}` or set VSUP_HOME elsewhere"
        )
    return inner


def _make_private(path: Path) -> None:
    """Create `path` (and missing parents, with the default mode) as a 0700 directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        return  # another vsup made it just now; its checks apply next time
    # mkdir's mode goes through the umask; this directory is vsup's own, so 0700 exactly.
    os.chmod(path, 0o700)


def socket_path(home: Path | None = None) -> Path:
    return (home or vsup_home()) / "vsup.sock"


def state_path(home: Path | None = None) -> Path:
    return (home or vsup_home()) / "state.json"


def journal_path(home: Path | None = None) -> Path:
    return (home or vsup_home()) / "journal.jsonl"


def layouts_path(home: Path | None = None) -> Path:
    """The last applied layouts' texts, for `vsup rollback` (control/layouthistory.py)."""
    return (home or vsup_home()) / "layouts.json"


def alerts_state_path(home: Path | None = None) -> Path:
    """What the alerts sent, kept across daemon restarts (control/alerts.py)."""
    return (home or vsup_home()) / "alerts.json"


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
