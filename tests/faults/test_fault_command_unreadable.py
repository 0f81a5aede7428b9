"""`vsup up` (and `vsup validate`) of a layout whose command this user may not reach (issue 35
item 18: "internal error: PermissionError"): one clear error naming the instance, the key and
the command. The user is this one without the capabilities that override file permissions,
as test_fault_home_modes.py does it (a second user could not run this interpreter)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.conftest import outside_cwd
from tests.faults.helpers import cleanup, daemons_of

pytestmark = pytest.mark.timeout(120)
NOBODY = 65534

LAYOUT = """\
[layout]
name = "locked"

[defaults]
model = "org/model"
pull = false
host = "127.0.0.1"

[[instance]]
name = "locked-a"
gpus = []
port = {port}
command = ["{program}", "serve"]
"""


def _without_override(home: Path, *args: str) -> subprocess.CompletedProcess:
    prefix = ["setpriv", "--inh-caps=-all", "--bounding-set=-all", "--"]
    return subprocess.run(
        [*(prefix if os.geteuid() == 0 else []), sys.executable, "-m", "vsup", *args],
        env=dict(os.environ, VSUP_HOME=str(home)),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=outside_cwd(),
        stdin=subprocess.DEVNULL,
    )


@pytest.fixture
def locked(tmp_path: Path):
    """A directory this user may not enter, holding the instance's program."""
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        pytest.skip("as root, giving up the permission override needs setpriv (util-linux)")
    base = Path(tempfile.mkdtemp(prefix="vsup-locked-", dir="/tmp"))
    os.chmod(base, 0o755)
    secret = base / "secret"
    secret.mkdir()
    program = secret / "vllm"
    program.write_text("#!/bin/sh\nexit 0\n")
    program.chmod(0o755)
    if os.geteuid() == 0:
        os.chown(secret, NOBODY, NOBODY)
    secret.chmod(0o700)
    yield base, program
    secret.chmod(0o755)
    shutil.rmtree(base, ignore_errors=True)


def test_an_unreachable_command_is_a_clear_error_naming_instance_and_command(locked, port):
    base, program = locked
    layout = base / "layout.toml"
    layout.write_text(LAYOUT.format(port=port, program=program))
    home = Path(tempfile.mkdtemp(prefix="vsup-", dir="/tmp"))
    try:
        for args in (("validate", str(layout)), ("up", str(layout), "--yes", "--detach")):
            res = _without_override(home, *args)
            assert res.returncode == 2, (args, res.stdout, res.stderr)
            out = res.stdout + res.stderr
            assert "internal error" not in out and "Traceback" not in out, out
            assert "instance 'locked-a'" in out and "key 'command'" in out, out
            assert f"command '{program}' cannot be read: Permission denied" in out, out
    finally:
        cleanup(home)
        assert not daemons_of(home)
        shutil.rmtree(home, ignore_errors=True)
