"""What vsup says, as operators read it (issue 35, items 6, 11, 15, 16, 17): the real CLI against
one real detached daemon whose instances are small programs (vLLM emulators,
tests/programs/vllm_emulator.py, and a script that crashes), so this runs in seconds.

- `vsup events` and `vsup logs` print no control character that came from a log or a layout:
  an exit's last log line and the layout's name carry a window title (ESC ] 0;... BEL), a screen
  clear (ESC [2J) and a BEL; they are shown as escapes (`\\x07`), never sent. `--raw` and
  `--json` keep what was logged (JSON escapes them itself);
- a start refused before any process (`port_in_use`) reads without "run None"; a stall seen at
  the API server (`/load`) reads as requests in flight there, not "0 running, 0 waiting";
- a start that timed out is advice (`start_timeout`), naming the instance and start_timeout_s;
- `vsup wake s2` in a swap group says that s1 went to sleep for it.
The dashboard's detach message (item 15): tests/tui/test_detach_message.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.conftest import run_vsup, until
from tests.integration.control.test_cli import daemons_of
from tests.unit.control.helpers import EMULATOR, free_port

pytestmark = pytest.mark.timeout(180)

# Printed at the crash: a window title, a screen clear and a bell in the exit's last log line.
CRASH = r"""
import sys, time
out = sys.stdout.buffer
out.write(b"starting\n")
out.write(b"\x1b]0;pwned-title\x07\n")
out.write(b"RuntimeError: boom \x1b[2J cleared \x07bell\n")
out.flush()
time.sleep(0.2)
sys.exit(3)
"""
# the layout's name: a screen clear, a window title and a bell (TOML escapes)
NAME = r"words\u001b[2J\u001b]0;pwned-name\u0007"
CONTROL = re.compile(rb"[\x00-\x08\x0b-\x1f\x7f]")


def vsup(home: Path, *args: str, **kw) -> subprocess.CompletedProcess:
    return run_vsup(home, *args, **kw)


def layout_text(tmp: Path, held_port: int) -> str:
    crash = tmp / "crash.py"
    crash.write_text(CRASH)
    idle, frozen = tmp / "idle.mode", tmp / "frozen.mode"
    idle.write_text("idle")
    frozen.write_text("frozen-idle")
    emulator = json.dumps([sys.executable, str(EMULATOR)])
    return f"""[layout]
name = "{NAME}"

[defaults]
model = "test/fake"
pull = false
command = {emulator}
host = "127.0.0.1"
health_interval_s = 0.2
stop_grace_s = 5
drain_timeout_s = 1
restart = {{ policy = "on-failure", backoff_s = 0.2, backoff_max_s = 1, stable_s = 60, max_failures = 2 }}

[[instance]]
name = "esc"
gpus = []
port = {free_port()}
command = {json.dumps([sys.executable, str(crash)])}
restart = {{ policy = "never" }}

[[instance]]
name = "held"
gpus = []
port = {held_port}

[[instance]]
name = "slow"
gpus = []
port = {free_port()}
start_timeout_s = 1
args = {{ startup-s = 120 }}

[[instance]]
name = "frozen"
gpus = []
port = {free_port()}
stall_after_s = 2
args = {{ mode-file = "{frozen}", enable-server-load-tracking = true }}

[[instance]]
name = "s1"
gpus = []
port = {free_port()}
swap_group = "g"
sleep = {{ level = 1 }}
# the emulator's sleep routes need the flag (vsup passes it to GPU instances only)
args = {{ mode-file = "{idle}", enable-sleep-mode = true }}

[[instance]]
name = "s2"
gpus = []
port = {free_port()}
swap_group = "g"
sleep = {{ level = 1 }}
# the emulator's sleep routes need the flag (vsup passes it to GPU instances only)
args = {{ mode-file = "{idle}", enable-sleep-mode = true }}
"""


def status(home: Path) -> dict:
    res = vsup(home, "status", "--json")
    assert res.returncode in (0, 1), res.stderr
    return json.loads(res.stdout)


def instance(home: Path, name: str) -> dict:
    return next(i for i in status(home)["instances"] if i["name"] == name)


def journal(home: Path) -> list[dict]:
    return [json.loads(x) for x in (home / "journal.jsonl").read_text().splitlines() if x]


@pytest.fixture(scope="module")
def node():
    home = Path(tempfile.mkdtemp(prefix="vsup-", dir="/tmp"))
    tmp = Path(tempfile.mkdtemp(prefix="vsup-words-"))
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    layout = tmp / "words.toml"
    layout.write_text(layout_text(tmp, holder.getsockname()[1]))
    try:
        up = vsup(home, "up", str(layout), "--detach")
        assert up.returncode == 0, up.stdout + up.stderr

        def settled():
            by = {i["name"]: i for i in status(home)["instances"]}
            return (
                by["esc"]["state"] == "failed"
                and by["held"]["state"] == "failed"
                and by["frozen"]["state"] == "ready"
                and by["frozen"]["stalled"]
                and {by["s1"]["state"], by["s2"]["state"]} == {"ready"}
                and (by["slow"]["last_exit"] or {}).get("reason") == "startup_timeout"
            )

        until(settled, 90, "the instances to crash, fail, stall, start and time out")
        yield home
    finally:
        holder.close()
        if daemons_of(home):
            vsup(home, "down", timeout=90)
        for p in daemons_of(home):
            p.kill()
        for ev in journal(home) if (home / "journal.jsonl").exists() else ():
            if ev.get("kind") == "spawn":
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(ev["pgid"], signal.SIGKILL)
        shutil.rmtree(home, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)


def test_events_show_escapes_from_logs_and_names_and_never_send_them(node):
    res = vsup(node, "events", "--since", "all", text=False)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert not CONTROL.search(out), [ln for ln in out.splitlines() if CONTROL.search(ln)]
    text = out.decode()
    # the exit's last log line, its escapes visible
    (crash,) = [ln for ln in text.splitlines() if " esc " in ln and "exited:" in ln]
    assert "RuntimeError: boom \\x1b[2J cleared \\x07bell" in crash, crash
    # the layout's name in the apply line
    assert "apply layout words\\x1b[2J\\x1b]0;pwned-name\\x07" in text, text
    # --json: the events as journalled, escaped by JSON itself
    raw = vsup(node, "events", "--since", "all", "--json", text=False).stdout
    assert not CONTROL.search(raw)
    exits = [json.loads(ln) for ln in raw.splitlines() if b'"exit"' in ln]
    assert any("\x1b[2J" in (e.get("log_excerpt") or "") for e in exits), exits


def test_logs_show_a_bell_as_an_escape_and_drop_a_window_title(node):
    res = vsup(node, "logs", "esc", text=False)
    assert res.returncode == 0, res.stderr
    assert not CONTROL.search(res.stdout), res.stdout
    shown = res.stdout.decode()
    # a terminal shows nothing for a title: it goes; the BEL is shown, not rung
    assert "pwned-title" not in shown and "RuntimeError: boom  cleared \\x07bell" in shown, shown
    # --raw: the bytes as logged
    raw = vsup(node, "logs", "esc", "--raw", text=False).stdout
    assert b"\x1b]0;pwned-title\x07" in raw and b"\x07bell" in raw
    # every log, prefixed: the same
    every = vsup(node, "logs", text=False)
    assert every.returncode == 0 and not CONTROL.search(every.stdout), every.stdout


def test_a_start_refused_before_any_process_and_a_stall_at_the_server_read_right(node):
    held = vsup(node, "events", "--since", "all", "--instance", "held").stdout
    (line,) = [ln for ln in held.splitlines() if "exited:" in ln]
    assert "exited: port_in_use (no process was started)" in line and "None" not in line, line
    frozen = vsup(node, "events", "--since", "all", "--instance", "frozen").stdout
    (line,) = [ln for ln in frozen.splitlines() if "STALLED" in ln]
    # the emulator's frozen-idle: 3 requests in flight at the API server, the gauges at 0
    assert "STALLED: 3 requests in flight at the API server and none at the engine" in line, line


def test_a_start_that_timed_out_is_advice_naming_the_instance_and_the_key(node):
    doc = status(node)
    (advice,) = [a for a in doc["advice"] if a["kind"] == "start_timeout"]
    assert advice["instance"] == "slow" and advice["severity"] == "warning", advice
    assert "raise start_timeout_s for slow" in advice["message"], advice
    assert "not ready 1 s after it began" in advice["message"], advice
    table = vsup(node, "status").stdout
    assert "slow: its last start timed out" in table, table


def test_wake_in_a_swap_group_says_which_member_went_to_sleep(node):
    awake = next(n for n in ("s1", "s2") if instance(node, n)["sleep"]["state"] == "awake")
    other = "s2" if awake == "s1" else "s1"
    res = vsup(node, "wake", other)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert len(lines) == 2, res.stdout
    assert lines[0].startswith(f"{awake}: asleep (level 1) in "), res.stdout
    assert "its swap group's other member" in lines[0], res.stdout
    assert lines[1].startswith(f"{other}: awake in "), res.stdout
    assert instance(node, awake)["sleep"]["state"] == "asleep"
