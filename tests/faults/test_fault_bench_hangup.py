"""`vsup bench` whatever ends it: a SIGHUP (the SSH session dropped, its terminal gone) restores
the original layout; under nohup the bench survives the hang-up; a SIGKILL leaves a lease the
daemon shows as advice and `vsup bench --restore` puts the original back; a bench stopped
before it changed anything leaves no daemon it started behind. The bench layouts' instance
starts for minutes (an emulator with --startup-s), so the bench waits in `waiting_ready` where
the test strikes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import outside_cwd
from tests.faults.helpers import daemons_of, instance, status, vsup, wait_for
from tests.unit.control.helpers import emulator_layout, free_port

pytestmark = pytest.mark.timeout(240)


def layouts(tmp_path: Path) -> dict[str, Path]:
    out = {}
    for name, inst, slow in (("orig", "prod", False), ("b1", "b", True), ("b2", "c", True)):
        text = emulator_layout(
            {inst: free_port()}, args="args = { startup-s = 300 }" if slow else ""
        )
        out[name] = tmp_path / f"{name}.toml"
        out[name].write_text(text.replace('name = "fakes"', f'name = "{name}"'))
    return out


def start_bench(home: Path, *args: str, ignore_hup: bool = False) -> subprocess.Popen:
    def nohup() -> None:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    return subprocess.Popen(
        [sys.executable, "-m", "vsup", "bench", *args, "--yes", "--num-prompts", "4"],
        env=dict(os.environ, VSUP_HOME=str(home)),
        cwd=outside_cwd(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=nohup if ignore_hup else None,
    )


def bench_of(home: Path) -> dict | None:
    return status(home).get("bench")


def wait_phase(home: Path, bench: subprocess.Popen, phase: str) -> dict:
    def seen() -> dict | None:
        assert bench.poll() is None, f"the bench ended ({bench.returncode}) before {phase}"
        b = bench_of(home)
        return b if b and b["phase"] == phase and b["pid"] == bench.pid else None

    return wait_for(seen, 120, f"the bench in phase {phase}")


def original_back(home: Path) -> dict:
    doc = status(home)
    assert doc["supervisor"]["layout"] == "orig", doc["supervisor"]
    assert [i["name"] for i in doc["instances"]] == ["prod"]
    return doc


@pytest.fixture
def serving(fault_home, tmp_path):
    files = layouts(tmp_path)
    up = vsup(fault_home, "up", str(files["orig"]), "--detach", "--wait", "--timeout", "60")
    assert up.returncode == 0, up.stdout + up.stderr
    return fault_home, files


def test_a_hangup_restores_the_original_even_with_its_terminal_gone(serving, tmp_path):
    home, files = serving
    out = tmp_path / "out"
    bench = start_bench(home, str(files["b1"]), str(files["b2"]), "--out-dir", str(out))
    try:
        wait_phase(home, bench, "waiting_ready")
        assert status(home)["supervisor"]["layout"] == "b1"
        # the terminal is gone: every write the bench makes from now on fails
        bench.stdout.close()
        bench.stderr.close()
        bench.send_signal(signal.SIGHUP)
        assert bench.wait(120) == 130
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
    wait_for(lambda: instance(home, "prod")["state"] == "ready", 60, "prod ready again")
    original_back(home)
    assert bench_of(home) is None
    assert not (home / "layout-lease.json").exists()
    said = (out / "bench.log").read_text()
    assert "SIGHUP: the terminal went away" in said and "the original layout orig is back" in said
    doc = json.loads((out / "result.json").read_text())
    assert doc["interrupted"] and doc["restore"]["outcome"] == "restored"


def test_under_nohup_the_bench_outlives_a_hangup(serving, tmp_path):
    home, files = serving
    bench = start_bench(home, str(files["b1"]), ignore_hup=True)
    try:
        wait_phase(home, bench, "waiting_ready")
        bench.send_signal(signal.SIGHUP)
        hup = time.monotonic()
        # it goes on reporting (every second) after the hang-up
        wait_for(
            lambda: (b := bench_of(home)) and b["age_s"] < time.monotonic() - hup - 1.5,
            30,
            "a report sent after the hang-up",
        )
        assert bench.poll() is None
        bench.send_signal(signal.SIGTERM)
        assert bench.wait(120) == 130
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
    wait_for(lambda: instance(home, "prod")["state"] == "ready", 60, "prod ready again")
    original_back(home)


def test_a_killed_bench_is_shown_and_restored_with_one_command(serving):
    home, files = serving
    bench = start_bench(home, str(files["b1"]))
    try:
        wait_phase(home, bench, "waiting_ready")
        bench.kill()
        bench.wait(30)
    finally:
        if bench.poll() is None:
            bench.kill()
    doc = wait_for(
        lambda: (
            (d := status(home))["bench"] is None
            and any(a["kind"] == "bench_abandoned" for a in d["advice"])
            and d
        ),
        30,
        "the dead bench's advice",
    )
    assert doc["supervisor"]["layout"] == "b1"
    (advice,) = [a for a in doc["advice"] if a["kind"] == "bench_abandoned"]
    assert advice["severity"] == "critical"
    assert (
        f"pid {bench.pid}" in advice["message"] and "replaced layout orig at " in advice["message"]
    )
    assert "vsup bench --restore" in advice["message"]
    human = vsup(home, "status")
    assert "vsup bench --restore" in human.stdout + human.stderr

    # another bench would take the bench layout for the original: refused, saying what to do
    again = vsup(home, "bench", str(files["b2"]), "--yes")
    assert again.returncode == 1 and "vsup bench --restore" in again.stderr, again.stderr
    assert status(home)["supervisor"]["layout"] == "b1"

    res = vsup(home, "bench", "--restore", timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "the original layout orig is back" in res.stderr
    doc = original_back(home)
    assert doc["instances"][0]["state"] == "ready"
    assert not any(a["kind"] == "bench_abandoned" for a in doc["advice"])
    assert not (home / "layout-lease.json").exists()
    res = vsup(home, "bench", "--restore")
    assert res.returncode == 0 and "nothing to restore" in res.stderr


def test_a_bench_stopped_while_it_starts_the_daemon_leaves_no_daemon(fault_home, tmp_path):
    home = fault_home
    files = layouts(tmp_path)
    bench = start_bench(home, str(files["b1"]))
    try:
        wait_for(lambda: daemons_of(home), 60, "the daemon the bench starts", interval=0.02)
        bench.send_signal(signal.SIGTERM)
        code = bench.wait(120)
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
    assert code == 130, bench.stderr.read()
    wait_for(lambda: not daemons_of(home), 60, "the bench's daemon gone")
