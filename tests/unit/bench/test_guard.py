"""The bench's guard: signals become an interrupt (one that waits while children start, none
while the layout is restored), output that can no longer be written is dropped, and the
layout lease is written and removed."""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import pytest

from vsup.bench.guard import Interrupted, LayoutGuard, ResilientStream


def test_a_signal_is_an_interrupt_that_names_it(tmp_path):
    with LayoutGuard(tmp_path) as guard, pytest.raises(Interrupted, match="SIGHUP"):
        os.kill(os.getpid(), signal.SIGHUP)
        time.sleep(1)
    assert guard.signum == signal.SIGHUP
    assert signal.getsignal(signal.SIGHUP) is signal.SIG_DFL  # handlers given back


def test_a_signal_while_children_start_waits_for_the_end_of_the_block(tmp_path):
    reached = False
    with (
        LayoutGuard(tmp_path) as guard,
        pytest.raises(Interrupted, match="SIGTERM"),
        guard.deferred(),
    ):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)  # the handler runs here and raises nothing
        reached = True
    assert reached


def test_signals_during_a_restore_only_say_to_wait(tmp_path):
    said: list[str] = []
    with LayoutGuard(tmp_path, say=said.append) as guard, guard.restore_phase():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
    assert said == ["the original layout is being restored; wait for it"]


def test_output_that_cannot_be_written_is_dropped_and_copied(tmp_path):
    r, w = os.pipe()
    os.close(r)  # the reader left: writes get EPIPE
    stream = ResilientStream(os.fdopen(w, "w", buffering=1))
    copy = open(tmp_path / "copy.log", "w")
    stream.copy = copy
    stream.write("line one\n")
    stream.flush()
    assert stream.broken and not stream.isatty()
    stream.write("line two\n")
    copy.close()
    assert (tmp_path / "copy.log").read_text() == "line one\nline two\n"


def test_the_lease_is_written_private_and_removed(tmp_path):
    from vsup.lease import layout_sha, read_lease

    with LayoutGuard(tmp_path) as guard:
        guard.claim({"toml": "x = 1\n", "name": "orig"}, [("b1", "y = 2\n")])
        path = tmp_path / "layout-lease.json"
        assert path.stat().st_mode & 0o777 == 0o600
        lease = read_lease(tmp_path)
        assert lease.pid == os.getpid() and lease.alive() and lease.holds("y = 2\n")
        assert not lease.holds("x = 1\n") and lease.replaced_name() == "orig"
        assert json.loads(path.read_text())["layouts"] == [
            {"name": "b1", "sha256": layout_sha("y = 2\n")}
        ]
        guard.release()
        assert not path.exists()


def test_a_lease_of_a_process_that_is_gone_is_not_alive(tmp_path):
    import subprocess

    from vsup.lease import Lease, start_ticks

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    ticks = start_ticks(child.pid)
    child.wait()
    lease = Lease("bench", child.pid, ticks, "2026-01-01T00:00:00Z", {})
    assert not lease.alive()
    assert not Lease("bench", os.getpid(), 1, "2026-01-01T00:00:00Z", {}).alive()  # pid reused
