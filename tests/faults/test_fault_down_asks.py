"""`vsup down` on a terminal says what it will stop and asks; `--yes` skips the question; without
a terminal it goes ahead and says what it does."""

from __future__ import annotations

import os
import pty
import subprocess
import sys

import pytest

from tests.conftest import outside_cwd
from tests.faults.helpers import alive, daemons_of, instance, vsup
from tests.unit.control.helpers import emulator_layout, free_port

pytestmark = pytest.mark.timeout(120)


def down_on_a_terminal(home, answer: str, *args: str) -> tuple[int, str]:
    """`vsup down ARGS` with a pseudo-terminal as stdin, answering `answer`; (code, stderr)."""
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "vsup", "down", *args],
            env=dict(os.environ, VSUP_HOME=str(home)),
            stdin=slave,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=outside_cwd(),
        )
        os.write(master, answer.encode())
        out, err = proc.communicate(timeout=90)
        return proc.returncode, out + err
    finally:
        os.close(master)
        os.close(slave)


def test_down_asks_on_a_terminal_and_goes_ahead_without_one(fault_home, tmp_path):
    home = fault_home
    layout = tmp_path / "ab.toml"
    layout.write_text(emulator_layout({"a": free_port(), "b": free_port()}))
    assert vsup(home, "up", str(layout), "--detach", "--wait", "--timeout", "60").returncode == 0
    pids = [instance(home, n)["pid"] for n in ("a", "b")]

    code, text = down_on_a_terminal(home, "n\n")
    assert code == 1 and "2 instances (a, b)" in text and "[y/N]" in text
    assert "nothing was stopped" in text
    assert all(alive(p) for p in pids) and daemons_of(home)

    # Without a terminal: it goes ahead, saying what it stops.
    res = vsup(home, "down")
    assert res.returncode == 0, res.stderr
    assert "stopping 2 instances (a, b), then the vsup daemon" in res.stdout
    assert "the vsup daemon has exited" in res.stdout
    assert not any(alive(p) for p in pids) and daemons_of(home) == []

    # --yes on a terminal: no question.
    assert vsup(home, "up", str(layout), "--detach", "--wait", "--timeout", "60").returncode == 0
    code, text = down_on_a_terminal(home, "", "--yes")
    assert code == 0 and "[y/N]" not in text and "the vsup daemon has exited" in text
    assert daemons_of(home) == []
