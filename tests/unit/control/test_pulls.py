"""The daemon's pull coordinator (control/pulls.py) with a stand-in worker process: the apply
waits for its pulls, a failed pull applies nothing, a newer apply supersedes a waiting one and
joins a pull under way instead of starting it twice."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

from vsup.clock import SystemClock
from vsup.control.pulls import Pulls
from vsup.layout import loads_layout

# Speaks the worker's protocol (vsup/pull/worker.py). The model's org says what it does:
# `ok/..` plans, reports, waits for the file `go` next to it, then is done; `bad/..` fails.
FAKE_WORKER = """#!{python}
import json, os, signal, sys, time
from pathlib import Path
signal.signal(signal.SIGTERM, lambda *a: (print(json.dumps({{"event": "failed", "reason": "cancelled", "message": "x"}}), flush=True), sys.exit(1)))
job = json.loads(sys.stdin.readline())
here = Path(__file__).parent
with open(here / "starts", "a") as f:
    f.write(job["model"] + "\\n")
def say(**doc):
    print(json.dumps(doc), flush=True)
say(event="plan", commit="c" * 40, cache_dir=job["cache_dir"], files=["config.json"], bytes_total=100, bytes_to_fetch=100)
if job["model"].startswith("bad/"):
    say(event="failed", reason="unauthorized", message="no token was sent")
    sys.exit(1)
say(event="progress", bytes_done=40, bytes_total=100, fetched_bytes=40, rate_bps=10.0, eta_s=6.0, files_done=0, files_total=1, files=[{{"name": "config.json", "state": "fetching"}}])
while not (here / "go").exists():
    time.sleep(0.02)
say(event="done", commit="c" * 40, snapshot=job["cache_dir"] + "/snap-" + job["model"].replace("/", "-"), fetched_bytes=100, elapsed_s=1.0)
"""


def specs(model: str, names: list[str]) -> list:
    text = f'[layout]\nname = "t"\n[defaults]\nmodel = "{model}"\n'
    for i, n in enumerate(names):
        text += f'[[instance]]\nname = "{n}"\ngpus = []\nport = {9100 + i}\n'
    return loads_layout(text).resolve()


@pytest.fixture
def rig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    worker = tmp_path / "python"
    worker.write_text(FAKE_WORKER.format(python=sys.executable))
    worker.chmod(0o755)
    events: list[tuple[str, dict]] = []
    tasks: list[asyncio.Task] = []

    def spawn(coro, name):
        t = asyncio.get_running_loop().create_task(coro, name=name)
        tasks.append(t)
        return t

    pulls = Pulls(
        tmp_path / "home",
        SystemClock(),
        lambda ev: events.append((ev.kind, ev.fields())),
        spawn,
        python=str(worker),
    )
    yield pulls, tmp_path, events
    for t in tasks:
        t.cancel()


async def until(pred, timeout: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not pred():
        assert loop.time() < end, "timed out"
        await asyncio.sleep(0.02)


async def test_the_apply_waits_for_the_pull_then_starts_from_the_snapshot(rig):
    pulls, tmp, events = rig
    applied: list[list] = []

    async def then(s):
        applied.append(s)

    res = pulls.resolve(specs("ok/model", ["a", "b"]))
    assert [t.instances for t in res.pulls] == [("a", "b")]
    pulls.begin(res, then)
    await until(lambda: pulls.statuses() and pulls.statuses()[0].bytes_done == 40)
    (st,) = pulls.statuses()
    assert st.state == "pulling" and st.current == ("config.json",) and st.eta_s == 6.0
    assert pulls.for_instance("a") == st and pulls.for_instance("zz") is None
    assert applied == []
    (tmp / "go").touch()
    await until(lambda: applied)
    (got,) = applied
    assert {s.name: s.model_path for s in got} == {
        "a": f"{tmp}/cache/snap-ok-model",
        "b": f"{tmp}/cache/snap-ok-model",
    }
    assert pulls.statuses()[0].state == "done" and pulls.for_instance("a") is None
    # the journal: the start, each 10% step reached (40% here), the end
    assert [k for k, _ in events] == ["pull_start", "pull_progress", "pull_done"]
    assert events[1][1]["bytes_done"] == 40 and events[0][1]["instances"] == ["a", "b"]


async def test_a_failed_pull_applies_nothing_and_says_why(rig):
    pulls, tmp, events = rig
    applied: list = []

    async def then(s):
        applied.append(s)

    pulls.begin(pulls.resolve(specs("bad/model", ["a"])), then)
    await until(lambda: pulls.statuses() and pulls.statuses()[0].state == "failed")
    await asyncio.sleep(0.2)
    assert applied == []
    st = pulls.for_instance("a")
    assert st is not None and st.reason == "unauthorized" and st.message == "no token was sent"
    assert events[-1][0] == "pull_failed" and events[-1][1]["reason"] == "unauthorized"


async def test_a_newer_apply_joins_the_pull_under_way_and_supersedes_the_older(rig):
    pulls, tmp, events = rig
    applied: list[tuple[str, list]] = []

    def then_for(tag):
        async def then(s):
            applied.append((tag, s))

        return then

    first = pulls.begin(pulls.resolve(specs("ok/model", ["a"])), then_for("first"))
    await until(lambda: (tmp / "starts").exists())
    second = pulls.begin(pulls.resolve(specs("ok/model", ["a", "b"])), then_for("second"))
    assert not pulls.is_current(first) and pulls.is_current(second)
    (tmp / "go").touch()
    await until(lambda: applied)
    await asyncio.sleep(0.2)
    assert [tag for tag, _ in applied] == ["second"]
    assert (tmp / "starts").read_text().splitlines() == ["ok/model"]  # one worker, not two
    assert pulls.statuses()[0].instances == ("a", "b")


async def test_an_apply_without_pulls_cancels_the_one_under_way(rig):
    pulls, tmp, events = rig
    applied: list = []

    async def then(s):
        applied.append(s)

    pulls.begin(pulls.resolve(specs("ok/model", ["a"])), then)
    await until(lambda: pulls.statuses() and pulls.statuses()[0].bytes_done == 40)
    job = next(iter(pulls.jobs.values()))
    pulls.supersede()
    await until(lambda: job.done.is_set())
    assert job.state == "cancelled" and "newer apply" in (job.message or "")
    assert pulls.statuses() == () and applied == []
    await until(lambda: job.proc is not None and job.proc.returncode is not None)  # reaped


async def test_shutdown_stops_the_workers(rig):
    pulls, tmp, events = rig

    async def then(s):
        raise AssertionError("nothing is applied after a shutdown")

    pulls.begin(pulls.resolve(specs("ok/model", ["a"])), then)
    await until(lambda: pulls.statuses() and pulls.statuses()[0].bytes_done == 40)
    job = next(iter(pulls.jobs.values()))
    await pulls.shutdown("vsup down")
    assert job.proc.returncode is not None
    await until(lambda: job.done.is_set())
    assert job.state == "cancelled" and json.dumps(job.message)
    assert os.path.exists(tmp / "starts")
