"""The daemon's own files: `vsup save` never writes inside VSUP_HOME (directly or through a
symlink), and a replaced lock file never lets a second daemon start beside the first."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import outside_cwd
from tests.faults.helpers import daemons_of, instance, status, vsup, wait_for
from tests.unit.control.helpers import emulator_layout, free_port

pytestmark = pytest.mark.timeout(180)


def test_save_refuses_every_path_inside_vsup_home(fault_home, tmp_path):
    home = fault_home
    layout = tmp_path / "a.toml"
    layout.write_text(emulator_layout({"a": free_port()}))
    assert vsup(home, "up", str(layout), "--detach").returncode == 0
    # the daemon rewrites state.json as a comes up; wait for that to settle first
    wait_for(lambda: instance(home, "a")["state"] == "ready", 60, "a ready")
    link = tmp_path / "innocent.toml"
    link.symlink_to(home / "state.json")
    for target in (
        home / "journal.jsonl",
        home / "daemon.lock",
        home / "state.json",
        home / "logs" / "a" / "new.toml",
        home / "new.toml",
        link,
    ):
        before = target.resolve().read_bytes() if target.resolve().exists() else None
        res = vsup(home, "save", str(target))
        assert res.returncode == 2, (target, res.stdout, res.stderr)
        assert res.stderr.count("\n") == 1 and "is inside VSUP_HOME" in res.stderr, res.stderr
        after = target.resolve().read_bytes() if target.resolve().exists() else None
        if target.resolve().name == "state.json" and before is not None and after is not None:
            # the daemon may rewrite its state at any moment: it must still be the daemon's
            assert json.loads(after)["daemon_pid"] == json.loads(before)["daemon_pid"], target
        elif target.name != "journal.jsonl":  # the journal grows by itself
            assert after == before, target
    # the journal still takes events, and answers with them
    assert vsup(home, "stop", "a").returncode == 0
    events = wait_for(
        lambda: [
            e
            for e in _events(home)
            if e.get("kind") == "action" and e.get("action") == "stop" and e.get("names") == ["a"]
        ],
        30,
        "the stop in the journal",
    )
    assert events
    assert (tmp_path / "b.toml").exists() is False
    assert vsup(home, "save", str(tmp_path / "b.toml")).returncode == 0


def _events(home):
    from vsup.control.client import JsonClient

    with JsonClient(home) as client:
        return client.events(0)["events"]


def test_a_replaced_lock_file_does_not_let_a_second_daemon_start(fault_home, tmp_path):
    home = fault_home
    layout = tmp_path / "a.toml"
    layout.write_text(emulator_layout({"a": free_port()}))
    assert vsup(home, "up", str(layout), "--detach", "--wait", "--timeout", "60").returncode == 0
    (first,) = daemons_of(home)
    pid_a = {i["name"]: i for i in status(home)["instances"]}["a"]["pid"]

    # What `vsup save $VSUP_HOME/daemon.lock` did before it was refused: a new file in its place.
    fresh = home / "lock.new"
    fresh.write_text("")
    os.replace(fresh, home / "daemon.lock")
    second = subprocess.Popen(
        [sys.executable, "-m", "vsup", "daemon"],
        env=dict(os.environ, VSUP_HOME=str(home)),
        cwd=outside_cwd(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        out, _ = second.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        second.kill()
        out, _ = second.communicate()
        pytest.fail(f"a second daemon started beside pid {first.pid}:\n{out[-2000:]}")
    assert second.returncode == 0, out
    assert "another daemon" in out, out
    assert [p.pid for p in daemons_of(home)] == [first.pid]
    # the first daemon still serves, and the instance was not spawned twice
    doc = status(home)
    assert doc["supervisor"]["pid"] == first.pid
    assert {i["name"]: i for i in doc["instances"]}["a"]["pid"] == pid_a
