"""VSUP_HOME as the operator made it: a directory vsup did not create keeps its mode while a
daemon serves it, and one this user may not use is a one-line error saying what to do."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.conftest import outside_cwd
from tests.faults.helpers import cleanup, daemons_of, vsup

pytestmark = pytest.mark.timeout(120)

NOBODY = 65534  # the owner of the home in the permission case


def test_a_home_of_mode_755_keeps_its_mode_while_the_daemon_serves_it():
    home = Path(tempfile.mkdtemp(prefix="vsup-755-", dir="/tmp"))
    os.chmod(home, 0o755)
    try:
        start = vsup(home, "daemon", "--detach")  # status never starts one (issue 25)
        assert start.returncode == 0, start.stderr
        res = vsup(home, "status", "--json")
        assert res.returncode == 0, res.stderr
        assert json.loads(res.stdout)["supervisor"]["home"] == str(home)
        assert daemons_of(home), "no daemon serves the home"
        assert stat.S_IMODE(os.stat(home).st_mode) == 0o755
        # what must be private inside is private by itself
        assert stat.S_IMODE(os.stat(home / "vsup.sock").st_mode) == 0o600
        assert stat.S_IMODE(os.stat(home / "journal.jsonl").st_mode) == 0o600
        assert stat.S_IMODE(os.stat(home / "daemon.log").st_mode) == 0o600
    finally:
        cleanup(home)
        shutil.rmtree(home, ignore_errors=True)


def _without_override(home: Path, *args: str) -> subprocess.CompletedProcess:
    """`vsup ARGS` facing a `home` someone else owns, as a user who may not write to it. As
    root (CI) that is root without the capabilities that override file permissions (setpriv):
    a second user could not run this interpreter, which lives under root's home."""
    prefix = ["setpriv", "--inh-caps=-all", "--bounding-set=-all", "--"]
    env = dict(os.environ, VSUP_HOME=str(home))
    env.pop("XDG_STATE_HOME", None)
    return subprocess.run(
        [*(prefix if os.geteuid() == 0 else []), sys.executable, "-m", "vsup", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=outside_cwd(),
        stdin=subprocess.DEVNULL,
    )


def test_a_home_another_user_owns_is_a_one_line_error_naming_it():
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("as root, giving up the permission override needs setpriv (util-linux)")
        home = Path(tempfile.mkdtemp(prefix="vsup-others-", dir="/tmp"))
        os.chown(home, NOBODY, NOBODY)
        os.chmod(home, 0o755)  # readable by all, writable by its owner only
    else:
        home = Path("/")  # root's, and not writable by this user
    try:
        for args in (("status",), ("logs", "a"), ("down", "--yes")):
            res = _without_override(home, *args)
            assert res.returncode == 2, (args, res.stdout, res.stderr)
            assert "internal error" not in res.stderr and "Traceback" not in res.stderr
            assert res.stderr.count("\n") == 1, res.stderr
            assert f"VSUP_HOME {home}" in res.stderr and "permission denied" in res.stderr
            assert "set VSUP_HOME to a directory of yours" in res.stderr
        assert not list(Path(home).glob("vsup-*"))
    finally:
        if home != Path("/"):
            shutil.rmtree(home, ignore_errors=True)
