"""The dashboard's detach message (issue 35, item 15) in a real terminal (tmux), as `make demo`
and a service's own home have it: VSUP_HOME is not the default one, so a plain `vsup` would find
no daemon. `q` says the command that does find it, and that command, run from a shell without
VSUP_HOME, reaches this daemon. The daemon runs one vLLM emulator (seconds, no vLLM)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import outside_cwd, run_vsup
from tests.integration.control.test_cli import daemons_of
from tests.tui.test_real_daemon import Tmux
from tests.unit.control.helpers import emulator_layout, free_port

pytestmark = [pytest.mark.tmux, pytest.mark.timeout(180)]


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_the_detach_message_names_a_command_that_finds_this_daemon(vsup_home: Path, tmp_path):
    layout = tmp_path / "one.toml"
    layout.write_text(emulator_layout({"a": free_port()}))
    up = run_vsup(vsup_home, "up", str(layout), "--detach", "--wait", "--timeout", "60")
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        # pytest exports COLUMNS/LINES, which the terminal size detection would prefer to tmux's
        command = f"env -u COLUMNS -u LINES {shlex.quote(sys.executable)} -m vsup tui; sleep 120"
        term = Tmux("detach", command, {"VSUP_HOME": str(vsup_home)})
        try:
            term.wait_for(r"ready 1/1", timeout=60)
            term.keys("q")
            screen = term.wait_for(r"to attach again", timeout=30)
        finally:
            term.kill()
        said = "".join(screen.splitlines())  # the message wraps at the pane's edge
        m = re.search(r"run `(VSUP_HOME=\S+ [^`]+)` to attach again", said)
        assert m, screen
        assert m.group(1).startswith(f"VSUP_HOME={vsup_home} "), m.group(1)
        # what it names reaches this daemon from a shell without VSUP_HOME (a read-only look)
        env = {k: v for k, v in os.environ.items() if k != "VSUP_HOME"}
        seen = subprocess.run(
            ["sh", "-c", f"{m.group(1)} status --json"],
            env=env,
            capture_output=True,
            text=True,
            cwd=outside_cwd(),
            timeout=60,
        )
        assert seen.returncode == 0, seen.stderr
        (daemon,) = daemons_of(vsup_home)
        assert json.loads(seen.stdout)["supervisor"]["pid"] == daemon.pid
    finally:
        run_vsup(vsup_home, "down", timeout=90)
