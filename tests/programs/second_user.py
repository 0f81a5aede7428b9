"""A second local user, for tests of what another user of the node can do to vsup's processes.

Binding to 127.0.0.1 keeps other hosts out, not other users: these tests run a program as a
user of its own (`useradd`, once per machine, as root) through `runuser`, with the system's
Python (the checkout's interpreter may sit where that user cannot read). Tests skip when not
root: creating a user and switching to it needs root.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from pathlib import Path

import pytest

USER = "vsup-intruder"
SYSTEM_PYTHON = ("/usr/bin/python3", "/bin/python3")


def second_user() -> str:
    """The other user's name, created if missing; skips the test when that cannot be done."""
    if os.geteuid() != 0:
        pytest.skip("a second local user needs root (useradd, runuser)")
    for tool in ("useradd", "runuser"):
        if shutil.which(tool) is None:
            pytest.skip(f"a second local user needs {tool} (util-linux, passwd)")
    try:
        pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", USER],
            check=True,
            capture_output=True,
        )
    return USER


def system_python() -> str:
    for path in SYSTEM_PYTHON:
        if Path(path).exists():
            return path
    pytest.skip("the second user runs the system's python3, and there is none")


def run_as(user: str, argv: list[str], stdin_text: str | None = None, timeout: float = 120):
    """Run `argv` as `user` (no shell, no environment of ours but PATH); its CompletedProcess."""
    runuser = shutil.which("runuser") or "/usr/sbin/runuser"
    return subprocess.run(
        [runuser, "-u", user, "--", *argv],
        input=stdin_text,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={"PATH": "/usr/bin:/bin"},
        cwd="/",
    )
