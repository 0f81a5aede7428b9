"""A benchmark killed mid-run (SIGTERM) stops its daemon and every instance it started."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.faults.helpers import wait_for
from tests.programs.proctoken import kill_token, token_pids

ROOT = Path(__file__).parents[2]
TAG = "VSUP_FAULT_TAG"  # inherited by the benchmark's daemon and instances: /proc finds them
pytestmark = pytest.mark.timeout(180)


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_a_benchmark_killed_with_sigterm_leaves_nothing_running(tmp_path):
    tag = uuid.uuid4().hex
    env = dict(os.environ, PYTHONPATH=str(ROOT), **{TAG: tag})
    bench = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.overhead", "--instances", "3", "--seconds", "60"]
        + ["--runs", "3", "--no-naive"],
        cwd=str(ROOT),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:

        def emulators() -> list[int]:
            found = [p for p in token_pids(tag, TAG) if b"vllm_emulator" in cmdline(p)]
            return found if len(found) >= 3 else []

        started = wait_for(emulators, 90, "the benchmark's 3 emulators")
        daemons = [p for p in token_pids(tag, TAG) if b"daemon" in cmdline(p)]
        assert daemons, "the benchmark's daemon is not running"
        bench.send_signal(signal.SIGTERM)
        out, _ = bench.communicate(timeout=120)
        assert bench.returncode == 128 + signal.SIGTERM, out
        left = token_pids(tag, TAG)
        assert left == [], f"left running after SIGTERM: {left} (emulators were {started})"
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
        kill_token(tag, TAG)
