"""Processes that outlive SIGKILL (stuck in the kernel: D state, or R in exit_mmap as seen on
this machine for minutes) are the one boundary here we cannot produce on demand, so
`stop.end_tree` is wrapped to report a process of the test's as a survivor. Everything else is
real: the emulator's processes, the signals, the restart, the /proc reads that follow the
"stuck" process until the test kills it."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from dataclasses import replace

import pytest

from vsup.engine import stop

from tests.integration.engine.conftest import pid_alive
from tests.integration.engine.test_processes import until


@pytest.fixture
def stuck(monkeypatch):
    """`stuck.arm()`: the next end_tree reports a `sleep` process as outliving SIGKILL."""
    real = stop.end_tree
    sleepers: list[subprocess.Popen] = []

    class Stuck:
        armed = False

        def arm(self) -> subprocess.Popen:
            sleepers.append(subprocess.Popen(["sleep", "120"]))
            self.armed = True
            return sleepers[-1]

    s = Stuck()

    async def end_tree(proc, grace_s, kill_wait_s=stop.KILL_WAIT_S, poll_s=stop.POLL_S, **kw):
        ended = await real(proc, grace_s, kill_wait_s, poll_s, **kw)
        if s.armed:
            s.armed = False
            return replace(ended, survivors=(sleepers[-1].pid,))
        return ended

    monkeypatch.setattr(stop, "end_tree", end_tree)
    yield s
    for p in sleepers:
        p.kill()
        p.wait()


async def test_a_crashed_instance_whose_processes_outlive_sigkill_comes_back_once_they_are_gone(
    engine, emulator_spec, events, stuck
):
    eng = engine(stuck_poll_s=0.05)
    await eng.apply([emulator_spec("a", "--engine-child")], wait=True)
    first = eng.instances["a"].pid
    sleeper = stuck.arm()
    os.kill(first, signal.SIGKILL)  # the API server dies; the sweep of its tree "leaves" one
    await eng.wait("a", ("failed",), timeout=20)
    inst = eng.instances["a"]
    why = inst.failed_why
    assert f"processes of a outlived SIGKILL: {sleeper.pid} sleep (S: sleeping)" in why
    assert "vsup starts it again" in why and inst.status_fields()["failed_why"] == why
    (incomplete,) = events.of("stop_incomplete", "a")
    assert incomplete["pids"] == [sleeper.pid] and incomplete["resume"] is True
    await asyncio.sleep(0.3)
    assert inst.state == "failed" and len(events.of("spawn", "a")) == 1, "started beside it"

    sleeper.kill()  # the kernel lets it go
    await eng.wait("a", ("ready",), timeout=30)
    assert inst.pid != first and inst.restarts == 1 and inst.failed_why is None
    (gone,) = events.of("stuck_gone", "a")
    assert gone["pids"] == [sleeper.pid]
    assert events.stamped("stuck_gone", "a")[0][0] < events.stamped("spawn", "a")[1][0]


async def test_after_a_persons_stop_the_instance_stays_down_when_they_are_gone(
    engine, emulator_spec, events, stuck
):
    eng = engine(stuck_poll_s=0.05)
    await eng.apply([emulator_spec("a")], wait=True)
    sleeper = stuck.arm()
    await eng.stop("a")
    inst = eng.instances["a"]
    assert inst.state == "failed" and "`vsup start a` once they are gone" in inst.failed_why
    assert events.of("stop_incomplete", "a")[0]["resume"] is False
    sleeper.kill()
    sleeper.wait()
    await asyncio.sleep(0.5)
    assert inst.state == "failed" and len(events.of("spawn", "a")) == 1
    assert events.of("stuck_gone", "a") == []


async def test_a_person_who_stops_it_meanwhile_decides(engine, emulator_spec, events, stuck):
    eng = engine(stuck_poll_s=0.05)
    await eng.apply([emulator_spec("a")], wait=True)
    sleeper = stuck.arm()
    await eng.restart("a")  # a person's restart: it should run again...
    await eng.wait("a", ("failed",), timeout=20)
    assert "vsup starts it again" in eng.instances["a"].failed_why
    await eng.stop("a")  # ...until a person says otherwise
    assert eng.instances["a"].state == "stopped"
    sleeper.kill()
    sleeper.wait()
    await until(lambda: not pid_alive(sleeper.pid))
    await asyncio.sleep(0.5)
    assert eng.instances["a"].state == "stopped" and len(events.of("spawn", "a")) == 1
