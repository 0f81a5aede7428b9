"""The CLI as operators run it (real subprocesses, a real detached daemon), with vLLM emulators
(tests/programs/vllm_emulator.py) standing in for vLLM so that this runs in seconds;
test_daemon_vllm.py does the same against real vLLM."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import psutil
import pytest

from vsup.control.lock import daemon_lock_holder

from tests.conftest import outside_cwd
from tests.conftest import run_vsup as vsup
from tests.unit.control.helpers import emulator_layout, free_port

ROOT = Path(__file__).parents[3]
pytestmark = pytest.mark.timeout(120)


def popen(home: Path, *args: str) -> subprocess.Popen:
    env = dict(os.environ, VSUP_HOME=str(home))
    return subprocess.Popen(
        [sys.executable, "-m", "vsup", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=outside_cwd(),
    )


def daemons_of(home: Path) -> list[psutil.Process]:
    """Live daemon processes serving `home` (a spawned daemon runs in VSUP_HOME)."""
    out = []
    for p in psutil.process_iter(["cmdline", "cwd", "status"]):
        if (
            (p.info["cmdline"] or [])[-3:] == ["-m", "vsup", "daemon"]
            and p.info["cwd"] == str(home)
            and p.info["status"] != psutil.STATUS_ZOMBIE
        ):
            out.append(p)
    return out


def wait_single_daemon(home: Path, timeout: float = 10) -> list[psutil.Process]:
    """The daemons of `home` once a racer that lost the lock has exited."""
    deadline = time.monotonic() + timeout
    found = daemons_of(home)
    while len(found) > 1 and time.monotonic() < deadline:
        time.sleep(0.05)
        found = daemons_of(home)
    return found


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture
def cli_home(vsup_home):
    """A VSUP_HOME whose daemon and instances are gone after the test, whatever happened."""
    yield vsup_home
    if daemons_of(vsup_home):
        vsup(vsup_home, "down")
    for p in daemons_of(vsup_home):
        p.kill()
    journal = vsup_home / "journal.jsonl"
    if journal.exists():
        for line in journal.read_text().splitlines():
            ev = json.loads(line)
            if ev.get("kind") == "spawn":
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(ev["pgid"], signal.SIGKILL)


def test_up_status_lifecycle_logs_save_and_down(cli_home, tmp_path):
    home = cli_home
    layout = tmp_path / "fakes.toml"
    layout.write_text(emulator_layout({"a": free_port(), "b": free_port()}))

    # Two `up` at once: one daemon wins the lock, both apply, each instance starts once.
    first, second = (
        popen(home, "up", str(layout), "--detach", "--wait", "--timeout", "60"),
        popen(home, "up", str(layout), "--detach", "--wait", "--timeout", "60"),
    )
    out1, err1 = first.communicate(timeout=90)
    out2, err2 = second.communicate(timeout=90)
    assert first.returncode == 0 and second.returncode == 0, err1 + err2
    assert "start: a, b" in out1 + out2
    assert "a: ready" in out1 and "b: ready" in out1
    assert len(wait_single_daemon(home)) == 1
    assert err1 == "" or "vsup" not in err1  # quiet in a pipe: no progress lines

    st = vsup(home, "status", "--json")
    assert st.returncode == 0, st.stderr
    doc = json.loads(st.stdout)
    assert [(i["name"], i["state"]) for i in doc["instances"]] == [("a", "ready"), ("b", "ready")]
    spawns = [json.loads(x) for x in (home / "journal.jsonl").read_text().splitlines()]
    assert sorted(e["instance"] for e in spawns if e["kind"] == "spawn") == ["a", "b"]
    pids = {i["name"]: i["pid"] for i in doc["instances"]}

    table = vsup(home, "status")
    assert table.returncode == 0 and "2/2 ready" in table.stdout

    # Applying the same layout again changes nothing.
    again = vsup(home, "up", str(layout), "--detach")
    assert again.returncode == 0 and "unchanged: a, b" in again.stdout

    stop = vsup(home, "stop", "b")
    assert stop.returncode == 0 and "b: stopped" in stop.stdout
    assert not alive(pids["b"])
    st = vsup(home, "status")
    assert st.returncode == 1  # not every instance is ready
    bad = vsup(home, "stop", "ghost")
    assert bad.returncode == 2 and "unknown instance: ghost" in bad.stderr
    start = vsup(home, "start", "b", "--wait", "--timeout", "30")
    assert start.returncode == 0 and "b: ready" in start.stdout

    logs = vsup(home, "logs", "a")
    assert logs.returncode == 0 and f"pid={pids['a']}" in logs.stdout

    saved = tmp_path / "saved.toml"
    sv = vsup(home, "save", str(saved))
    assert sv.returncode == 0 and saved.exists()
    assert vsup(home, "validate", str(saved)).returncode == 0
    # Saved over a layout file, the operator's comments stay (and the answer says so).
    noted = tmp_path / "noted.toml"
    noted.write_text("# ask the on-call before changing b\n" + saved.read_text())
    sv = vsup(home, "save", str(noted))
    assert sv.returncode == 0 and "(its comments and formatting kept)" in sv.stdout, sv.stdout
    assert noted.read_text().startswith("# ask the on-call before changing b\n")
    assert tomllib.loads(noted.read_text()) == tomllib.loads(saved.read_text())

    # A changed layout: what restarts and what stops is said before it is done.
    changed = tmp_path / "changed.toml"
    before = {i["name"]: i for i in json.loads(vsup(home, "status", "--json").stdout)["instances"]}
    ports = {name: i["port"] for name, i in before.items()}
    # the emulator always reports requests running: a real drain would take drain_timeout_s
    changed.write_text(
        emulator_layout({"a": ports["a"]}, args='args = { say = "changed" }\ndrain_timeout_s = 1')
    )
    up2 = vsup(home, "up", str(changed), "--detach", "--wait", "--timeout", "30", "--yes")
    assert up2.returncode == 0, up2.stderr
    assert up2.stdout.index("restart (changed, rolling): a") < up2.stdout.index("a: ready")
    assert "stop (removed): b" in up2.stdout
    doc = json.loads(vsup(home, "status", "--json").stdout)
    assert [i["name"] for i in doc["instances"]] == ["a"]
    assert not alive(before["b"]["pid"]) and doc["instances"][0]["pid"] != before["a"]["pid"]
    pids = {"a": doc["instances"][0]["pid"]}

    # An SSH hang-up does not reach the daemon; SIGTERM stops it but not the instances.
    daemon = daemons_of(home)[0]
    os.killpg(os.getpgid(daemon.pid), signal.SIGHUP)
    # SIGHUP's default action would end it on delivery; an answer afterwards proves it ignored it.
    assert json.loads(vsup(home, "status", "--json").stdout)["supervisor"]["pid"] == daemon.pid
    assert daemon.is_running() and daemon.status() != psutil.STATUS_ZOMBIE
    daemon.terminate()
    daemon.wait(10)
    assert alive(pids["a"])
    # A read-only command starts no daemon: it says none runs here and what is left running.
    none = vsup(home, "status", "--json")
    assert none.returncode == 4 and none.stdout == "", none.stderr
    assert f"no vsup daemon runs for VSUP_HOME={home}" in none.stderr
    assert "still run unwatched (a)" in none.stderr and "vsup daemon --detach" in none.stderr
    assert daemons_of(home) == []
    assert vsup(home, "daemon", "--detach").returncode == 0  # takes them back
    st = vsup(home, "status", "--json")
    doc = json.loads(st.stdout)
    assert {i["name"]: i["pid"] for i in doc["instances"]}["a"] == pids["a"]
    assert doc["supervisor"]["pid"] != daemon.pid

    down = vsup(home, "down")
    assert down.returncode == 0, down.stderr
    assert "the vsup daemon has exited" in down.stdout
    assert daemons_of(home) == [] and daemon_lock_holder(home) is None
    assert not (home / "vsup.sock").exists()
    current = {i["name"]: i["pid"] for i in doc["instances"]}
    assert not any(alive(p) for p in current.values() if p)
    # Nothing runs now, and `down` says so without starting a daemon.
    assert vsup(home, "down").stdout.strip() == "vsup: nothing is running"
    assert daemons_of(home) == []


def test_invalid_layout_exits_2_with_every_error_and_starts_nothing(cli_home, tmp_path):
    layout = tmp_path / "bad.toml"
    port = free_port()
    layout.write_text(emulator_layout({"a": port, "b": port}).replace('model = "test/fake"', ""))
    res = vsup(cli_home, "up", str(layout), "--detach")
    assert res.returncode == 2
    assert "port" in res.stderr and "model" in res.stderr and "nothing was changed" in res.stderr
    assert daemons_of(cli_home) == []


def test_up_wait_reports_a_failed_instance(cli_home, tmp_path):
    layout = tmp_path / "crash.toml"
    never_ready = "args = { ready-after = 30, exit-after = 0.3, exit-code = 3 }"
    text = emulator_layout({"a": free_port()}, args=never_ready)
    layout.write_text(text.replace("max_failures = 3", "max_failures = 2"))
    res = vsup(cli_home, "up", str(layout), "--detach", "--wait", "--timeout", "60")
    assert res.returncode == 1
    assert "a: failed" in res.stderr
    doc = json.loads(vsup(cli_home, "status", "--json").stdout)
    advice = [a for a in doc["advice"] if a["kind"] == "crash_loop"]
    assert advice and advice[0]["severity"] == "critical"
    why = "the restart policy gave up: 2 consecutive failures (max_failures = 2)"
    (inst,) = doc["instances"]
    assert inst["state"] == "failed" and inst["failed_why"] == why
    assert why in advice[0]["message"]
    # the why outlives the daemon: the next one reads it from the state file
    daemon = daemons_of(cli_home)[0]
    daemon.terminate()
    daemon.wait(10)
    assert vsup(cli_home, "daemon", "--detach").returncode == 0
    doc = json.loads(vsup(cli_home, "status", "--json").stdout)
    assert doc["supervisor"]["pid"] != daemon.pid
    (inst,) = doc["instances"]
    assert inst["state"] == "failed" and inst["failed_why"] == why
