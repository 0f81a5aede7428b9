"""The daemon's record of a `vsup bench` in progress: kept while its sender reports and lives,
forgotten when it says it is done, goes quiet, or dies; served as status JSON's `bench`."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any, cast

import pytest

from vsup.bench.publish import ProgressPublisher
from vsup.control.benchprogress import STALE_S, BenchProgressBoard
from vsup.control.client import Client
from vsup.snapshot import StatusSnapshot

from tests.support.clock import FakeClock


def current(board: BenchProgressBoard) -> dict[str, Any]:
    """The board's report, where the test expects there to be one."""
    doc = board.current()
    assert doc is not None
    return doc


def now_sent(pub: ProgressPublisher) -> dict[str, Any]:
    """The publisher's report, where the test expects there to be one."""
    doc = pub.report()
    assert doc is not None
    return doc


def report(pid: int | None = None, **kw) -> dict:
    body = {
        "pid": pid or os.getpid(),
        "phase": "running",
        "layout": "two-per-gpu",
        "index": 2,
        "count": 3,
        "requests_done": 412,
        "requests_total": 1000,
        "elapsed_s": 72.0,
        "started_at": "2026-12-01T04:00:00Z",
    }
    return {**body, **kw}


def test_a_report_is_shown_with_its_phase_time_moving_between_reports():
    clock = FakeClock()
    board = BenchProgressBoard(clock)
    assert board.current() is None
    board.update(report())
    clock.advance(3)
    shown = current(board)
    assert shown["phase"] == "running" and shown["layout"] == "two-per-gpu"
    assert (shown["index"], shown["count"]) == (2, 3)
    assert (shown["requests_done"], shown["requests_total"]) == (412, 1000)
    assert shown["elapsed_s"] == 75.0 and shown["age_s"] == 3.0
    assert shown["pid"] == os.getpid()


def test_a_tune_says_who_it_is_and_its_eta_counts_down_between_reports():
    clock = FakeClock()
    board = BenchProgressBoard(clock)
    board.update(report())
    assert current(board)["tool"] == "bench" and current(board)["eta_s"] is None
    board.update(report(tool="tune", eta_s=600.0))
    clock.advance(4)
    shown = current(board)
    assert shown["tool"] == "tune" and shown["eta_s"] == 596.0
    clock.advance(STALE_S - 4.5)
    assert current(board)["eta_s"] == 590.5  # never below 0, never above what was said
    assert board.status().eta_s == 590.5 and board.status().tool == "tune"


def test_the_publisher_counts_its_eta_down_and_leaves_it_out_while_unknown():
    now = [100.0]
    pub = ProgressPublisher(lambda: cast(Client, None), clock=lambda: now[0], tool="tune")
    pub.phase("running", layout="c1", index=1, count=4)
    assert "eta_s" not in now_sent(pub) and now_sent(pub)["tool"] == "tune"
    pub.eta(300.0)
    now[0] += 30
    assert now_sent(pub)["eta_s"] == 270.0
    now[0] += 400
    assert now_sent(pub)["eta_s"] == 0.0
    pub.eta(None)
    assert "eta_s" not in now_sent(pub)


def test_an_older_daemon_that_refuses_the_new_keys_still_gets_the_reports():
    """A vsup upgraded under a running daemon: its bench reports `tool` and `eta_s`, which the
    old daemon's API refuses as unknown keys; the reports go on without them."""
    from vsup.control.errors import BadRequest

    class OldDaemon:
        taken: list[dict] = []

        def bench_progress(self, report: dict) -> dict:
            if set(report) - {"pid", "phase", "layout", "index", "count", "requests_done",
                              "requests_total", "elapsed_s", "started_at"}:  # fmt: skip
                raise BadRequest("unknown key 'tool'")
            self.taken.append(report)
            return {"bench": report}

    pub = ProgressPublisher(cast(Callable[[], Client], OldDaemon), tool="tune")
    pub.phase("running", layout="c1", index=1, count=2)
    pub.eta(60.0)
    pub._send(now_sent(pub))  # refused: the publisher learns
    pub._send(now_sent(pub))
    assert [r["layout"] for r in OldDaemon.taken] == ["c1"] and pub.sent == 1
    assert "tool" not in OldDaemon.taken[0] and "eta_s" not in OldDaemon.taken[0]


def test_a_bench_that_stops_reporting_is_forgotten_after_the_stale_time():
    clock = FakeClock()
    board = BenchProgressBoard(clock)
    board.update(report())
    clock.advance(STALE_S - 0.5)
    assert board.current() is not None
    board.update(report(requests_done=500))  # a heartbeat: kept again
    clock.advance(STALE_S - 0.5)
    assert current(board)["requests_done"] == 500
    clock.advance(1.0)
    assert board.current() is None


def test_done_clears_the_report_of_its_own_sender_only():
    clock = FakeClock()
    board = BenchProgressBoard(clock)
    board.update(report())
    board.update({"pid": 1, "phase": "done"})  # another process: not this bench's end
    assert board.current() is not None
    board.update({"pid": os.getpid(), "phase": "done"})
    assert board.current() is None


def test_a_bench_whose_process_died_is_forgotten_at_once():
    clock = FakeClock()
    board = BenchProgressBoard(clock)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        board.update(report(pid=child.pid))
        assert current(board)["pid"] == child.pid
    finally:
        child.kill()
        child.wait()
    assert board.current() is None  # well within the stale time


def test_a_new_phase_restarts_the_phase_time():
    clock = FakeClock()
    board = BenchProgressBoard(clock)
    board.update(report(phase="warming", elapsed_s=5.0))
    clock.advance(2)
    board.update(report(phase="collecting", elapsed_s=0.0))
    clock.advance(1)
    assert current(board)["elapsed_s"] == 1.0


def test_the_status_json_bench_key_round_trips_through_the_snapshot():
    clock = FakeClock()
    board = BenchProgressBoard(clock)
    board.update(report())
    doc = {
        "schema": 1,
        "supervisor": {"pid": 1, "version": "x", "uptime_s": 1.0},
        "node": {"hostname": "n", "gpu_vendor": "none", "gpu_count": 0},
        "instances": [],
        "bench": board.current(),
    }
    snap = StatusSnapshot.from_json(doc)
    assert snap.bench is not None and snap.bench.layout == "two-per-gpu"
    assert snap.to_json()["bench"] == doc["bench"]
    assert StatusSnapshot.from_json({**doc, "bench": None}).bench is None


async def test_the_daemon_serves_the_bench_reports_of_a_publisher_and_drops_them_at_close(
    daemons, vsup_home
):
    daemon, client = await daemons.start()
    assert (await client.status())["bench"] is None
    pub = ProgressPublisher(lambda: Client(vsup_home), interval=0.1)
    pub.start()
    try:
        pub.phase("running", layout="two", index=2, count=3, requests_total=16)
        pub.requests(5, 16)
        for _ in range(100):
            bench = (await client.status())["bench"]
            if bench and bench["requests_done"] == 5:
                break
            await asyncio.sleep(0.05)
        assert bench["phase"] == "running" and bench["layout"] == "two"
        assert (bench["index"], bench["count"], bench["requests_total"]) == (2, 3, 16)
        assert bench["pid"] == os.getpid()
    finally:
        await asyncio.to_thread(pub.close)
    assert (await client.status())["bench"] is None


@pytest.mark.parametrize(
    "body,fragment",
    [
        ({"pid": 5, "phase": "dancing"}, "unknown phase 'dancing'"),
        ({"phase": "running"}, "missing 'pid'"),
        ({"pid": "5", "phase": "running"}, "'pid' must be an integer"),
        ({"pid": 0, "phase": "running"}, "'pid' must be a process id"),
        ({"pid": 5, "phase": "running", "requests_done": 1.5}, "'requests_done' must be"),
        ({"pid": 5, "phase": "running", "colour": "red"}, "unknown key 'colour'"),
        ({"pid": 5, "phase": "running", "tool": "sweep"}, "unknown tool 'sweep'"),
        ({"pid": 5, "phase": "running", "eta_s": "soon"}, "'eta_s' must be"),
    ],
)
async def test_bad_bench_reports_get_400_saying_what_to_send(daemons, body, fragment):
    daemon, client = await daemons.start()
    resp = await client._http.post("/v1/bench/progress", json=body)
    assert resp.status_code == 400
    assert fragment in resp.json()["error"]


def test_every_key_of_the_report_is_a_field_of_the_typed_bench_status():
    """The snapshot carries the bench typed (snapshot.BenchStatus): a key the board adds to its
    report but not there would be dropped from status JSON."""
    from dataclasses import asdict, fields

    from vsup.snapshot import BenchStatus

    board = BenchProgressBoard(FakeClock())
    board.update(report())
    doc = current(board)
    assert set(doc) <= {f.name for f in fields(BenchStatus)}, set(doc) - {
        f.name for f in fields(BenchStatus)
    }
    status = board.status()
    assert isinstance(status, BenchStatus) and asdict(status) == {**asdict(status), **doc}
