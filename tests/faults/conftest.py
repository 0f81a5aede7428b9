"""Fixtures of the fault-injection suite: a VSUP_HOME cleaned up after each test, and one on a
small tmpfs (to fill it) where this machine lets the test mount one."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.faults.helpers import cleanup

TMPFS_SIZE = "3m"


@pytest.fixture
def fault_home(vsup_home):
    """VSUP_HOME whose daemon and instances are gone after the test, whatever happened."""
    yield vsup_home
    cleanup(vsup_home)


@pytest.fixture
def tmpfs_home(monkeypatch):
    """VSUP_HOME on its own 3 MiB tmpfs (mode 0700: private like any home vsup makes).

    Mounting needs root (CI runs as root); elsewhere the test is skipped, saying so."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("filling a disk needs a tmpfs of its own: mounting one needs root")
    home = Path(tempfile.mkdtemp(prefix="vsup-full-", dir="/tmp"))
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE},mode=0700", "tmpfs", str(home)],
        capture_output=True,
        text=True,
    )
    if res.returncode != 0:
        home.rmdir()
        pytest.skip(
            f"cannot mount a tmpfs here ({res.stderr.strip()}); the disk-full case needs one"
        )
    monkeypatch.setenv("VSUP_HOME", str(home))
    try:
        yield home
    finally:
        cleanup(home)
        subprocess.run(["umount", "-l", str(home)], check=False)
        shutil.rmtree(home, ignore_errors=True)
