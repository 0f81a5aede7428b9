"""`vsup logs` as operators run it, on a real daemon following a process that writes what real
vLLM 0.26 wrote at start-up (tests/fixtures/vllm-0.26-cuda/startup.log), progress bars' carriage
returns included, in two parts: a bar stops half drawn until the test lets it finish."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import pytest

from vsup.logtext import bar_state

from tests.conftest import FIXTURES, free_port, outside_cwd, run_vsup

pytestmark = pytest.mark.timeout(120)

REPLAY = """
import sys, time, pathlib
data = pathlib.Path(sys.argv[1]).read_bytes()
cut = data.index(b"Capturing CUDA graphs (FULL):  45%")
end = data.index(b"\\n", data.index(b"Application startup complete.")) + 1
out = sys.stdout.buffer
out.write(data[:cut]); out.flush()
flag = pathlib.Path(sys.argv[2])
while not flag.exists():
    time.sleep(0.05)
out.write(data[cut:end]); out.flush()
time.sleep(600)
"""


# `vsup logs` output is checked byte for byte.
vsup = partial(run_vsup, text=False)


def bars(text: str, desc: str) -> list[str]:
    return [ln for ln in text.splitlines() if (s := bar_state(ln)) and s.desc == desc]


def wait_for(check, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.1)


@pytest.fixture
def replaying(vsup_home: Path, tmp_path: Path):
    script = tmp_path / "replay.py"
    script.write_text(REPLAY)
    flag = tmp_path / "go"
    fixture = FIXTURES / "vllm-0.26-cuda" / "startup.log"
    command = json.dumps([sys.executable, str(script), str(fixture), str(flag)])
    layout = tmp_path / "replay.toml"
    layout.write_text(
        f'[layout]\nname = "replay"\n\n[defaults]\nmodel = "test/replay"\n'
        f'command = {command}\nhost = "127.0.0.1"\nstart_timeout_s = 300\n\n'
        f'[[instance]]\nname = "r"\ngpus = []\nport = {free_port()}\n'
    )
    up = vsup(vsup_home, "up", str(layout), "--detach")
    assert up.returncode == 0, up.stderr
    try:
        yield vsup_home, flag
    finally:
        vsup(vsup_home, "down", timeout=90)


def test_vsup_logs_shows_each_bar_once_and_follows_one_to_its_end(replaying):
    home, flag = replaying
    out = wait_for(
        lambda: (
            (o := vsup(home, "logs", "r").stdout.decode())
            and "Capturing CUDA graphs (FULL)" in o
            and o
        )
    )
    assert out, "the instance's log never showed the CUDA graph capture"
    # the finished bars once each, at their end; the one being drawn once, as it stands
    assert len(bars(out, "Capturing CUDA graphs (PIECEWISE)")) == 1
    assert "51/51" in bars(out, "Capturing CUDA graphs (PIECEWISE)")[0]
    assert len(bars(out, "Loading safetensors checkpoint shards")) == 1
    full = bars(out, "Capturing CUDA graphs (FULL)")
    assert len(full) == 1 and "51/51" not in full[0]
    assert "\r" not in out

    follower = subprocess.Popen(
        [sys.executable, "-m", "vsup", "logs", "r", "-f"],
        env=dict(os.environ, VSUP_HOME=str(home)),
        stdout=subprocess.PIPE,
        cwd=outside_cwd(),
    )
    try:
        time.sleep(1.0)  # it caught up with the half-drawn bar; now the rest arrives
        flag.touch()
        seen = b""
        deadline = time.monotonic() + 30
        while b"Application startup complete." not in seen and time.monotonic() < deadline:
            seen += os.read(follower.stdout.fileno(), 65536)
    finally:
        follower.terminate()
        follower.wait(timeout=10)
    followed = seen.decode()
    assert "Application startup complete." in followed
    # into a pipe only finished lines: the bar that moved while followed appears once, done
    full = bars(followed, "Capturing CUDA graphs (FULL)")
    assert len(full) == 1 and "51/51" in full[0]

    raw = vsup(home, "logs", "r", "--raw").stdout
    assert raw.count(b"\r") > 10 and b"Application startup complete." in raw
