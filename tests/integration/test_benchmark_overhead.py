"""`python -m benchmarks.overhead` runs end to end (issue 35 item 7: its emulated model was
auto-pulled from the hub, every instance stayed `stopped (pull failed)`, and nothing noticed).

Run as someone runs the benchmark: a subprocess from the checkout (the benchmark's own daemon
imports the installed vsup), with the environment of a shell: HF_HUB_OFFLINE unset (the test
session sets it, which hid the failure), the hub pointed at a loopback port nobody listens on,
so a pull would fail at once instead of asking the internet.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(180)


def test_the_overhead_benchmark_runs_with_two_instances(tmp_path: Path) -> None:
    from benchmarks.common import parse_last_line

    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    env.update(
        PYTHONPATH=str(ROOT),
        HF_ENDPOINT=f"http://127.0.0.1:{free_port()}",
        HF_HOME=str(tmp_path / "hf"),
    )
    env.pop("VSUP_HOME", None)
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.overhead", "--instances", "2"]
        + ["--seconds", "1", "--runs", "1", "--warmup", "1", "--no-naive"],
        cwd=str(ROOT),
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    figures = parse_last_line(done.stdout)
    assert figures.get("instances") == "2", out
    assert float(figures["daemon_cpu_pct"]) >= 0.0, out
    assert float(figures["daemon_rss_mb"]) > 0.0, out
    assert "2 emulators ready" in done.stdout, out
    assert not (tmp_path / "hf").exists(), "the benchmark asked the hub for its emulated model"
