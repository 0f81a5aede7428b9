"""An instance at rest is asked less often (issue 35 item 7; telemetry/rest.py): a real detached
daemon (polling once a second) and vLLM emulators told what load to show (`--mode-file`), each
logging every request it gets (`--request-log`).

- an idle emulator is scraped, and its /health read, every `rest_interval_s` (3 s) instead of
  every second, and its health loop asks nothing in between;
- switching its mode file to `serve` (figures moving) brings it back to a scrape a second;
- a `stall` emulator (requests running and waiting, nothing moving) is never at rest and is
  flagged stalled, and so is an idle one at rest whose engine then hangs under requests;
- while nobody reads the figures (no status request for 5 s), a busy instance is scraped at a
  rest's pace (every 3 s), and every second again while a reader asks status each second
  (control/monitor.py, "Nobody watching"); one whose `stall_after_s` is under 9 s stays on
  every poll.
Counts over windows of several seconds, with wide margins (3 s against 1 s is a third of the
requests); no upper bound on how long anything took.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import run_vsup as vsup
from tests.conftest import until
from tests.integration.control.test_cli import daemons_of
from tests.unit.control.helpers import EMULATOR, free_port

pytestmark = pytest.mark.timeout(240)

NAMES = ("idle", "busy", "hung", "woken", "paced")
WINDOW_S = 15.0


def layout_text(tmp: Path) -> str:
    emulator = json.dumps([sys.executable, str(EMULATOR)])
    text = f"""[layout]
name = "rest"

[defaults]
model = "test/fake"
pull = false
command = {emulator}
host = "127.0.0.1"
stop_grace_s = 5
stall_after_s = 3
"""
    modes = {"idle": "idle", "busy": "serve", "hung": "stall", "woken": "idle", "paced": "serve"}
    for name in NAMES:
        (tmp / f"{name}.mode").write_text(modes[name])
        # `paced`: a stall window long enough for the slower pace while nobody reads
        own = "stall_after_s = 60\n" if name == "paced" else ""
        text += f"""
[[instance]]
name = "{name}"
gpus = []
port = {free_port()}
{own}args = {{ mode-file = "{tmp / f"{name}.mode"}", request-log = "{tmp / f"{name}.log"}", enable-server-load-tracking = true }}
"""
    return text


def requests(tmp: Path, name: str) -> tuple[int, int]:
    """(scrapes, /health requests) `name` has been sent so far."""
    log = tmp / f"{name}.log"
    paths = (
        [line.partition(" ")[2] for line in log.read_text().splitlines()] if log.exists() else []
    )
    return sum(1 for p in paths if p.startswith("/metrics")), paths.count("/health")


def over_window(tmp: Path, seconds: float = WINDOW_S) -> dict[str, tuple[int, int]]:
    """Each instance's scrapes and /health requests over the next `seconds`."""
    before = {n: requests(tmp, n) for n in NAMES}
    time.sleep(seconds)  # a cadence is what is measured: there is no event to wait for
    after = {n: requests(tmp, n) for n in NAMES}
    return {n: (after[n][0] - before[n][0], after[n][1] - before[n][1]) for n in NAMES}


def status(home: Path) -> dict[str, dict]:
    res = vsup(home, "status", "--json")
    assert res.returncode in (0, 1), res.stderr
    return {i["name"]: i for i in json.loads(res.stdout)["instances"]}


@pytest.fixture(scope="module")
def node():
    home = Path(tempfile.mkdtemp(prefix="vsup-", dir="/tmp"))
    tmp = Path(tempfile.mkdtemp(prefix="vsup-rest-"))
    layout = tmp / "rest.toml"
    layout.write_text(layout_text(tmp))
    try:
        up = vsup(home, "up", str(layout), "--detach")
        assert up.returncode == 0, up.stdout + up.stderr

        def settled():
            by = status(home)
            return all(by[n]["state"] == "ready" for n in NAMES) and by["hung"]["stalled"]

        until(settled, 90, "the instances to start and the hung one to be flagged stalled")
        yield home, tmp
    finally:
        if daemons_of(home):
            vsup(home, "down", timeout=90)
        for p in daemons_of(home):
            p.kill()
        journal = home / "journal.jsonl"
        for line in journal.read_text().splitlines() if journal.exists() else ():
            ev = json.loads(line)
            if ev.get("kind") == "spawn":
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(ev["pgid"], signal.SIGKILL)
        shutil.rmtree(home, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)


def test_an_idle_instance_is_asked_every_rest_interval_and_a_busy_or_hung_one_every_second(node):
    home, tmp = node
    time.sleep(5)  # a few quiet scrapes before the idle ones rest (QUIET_SCRAPES)
    seen = over_window(tmp)
    idle_scrapes, idle_health = seen["idle"]
    busy_scrapes, _ = seen["busy"]
    # every 3 s: ~5 in 15 s, where a scrape a second gives ~15
    assert 2 <= idle_scrapes <= 8, seen
    assert busy_scrapes >= 2 * idle_scrapes, seen
    # its /health rides on those scrapes; the health loop asks none of its own in between
    assert idle_health <= 8, seen
    # a hung engine has requests in flight: never at rest
    assert seen["hung"][0] >= 2 * idle_scrapes, seen
    by = status(home)
    assert by["idle"]["state"] == "ready" and not by["idle"]["stalled"]
    assert by["idle"]["kv_cache_usage"] is not None  # its figures stay current meanwhile


def test_figures_that_move_bring_it_back_to_a_scrape_a_second(node):
    home, tmp = node
    (tmp / "idle.mode").write_text("serve")
    time.sleep(5)  # the rest's next scrape (at most 3 s on) sees the figures move
    seen = over_window(tmp)
    assert seen["idle"][0] >= 2 * seen["woken"][0], seen
    assert seen["idle"][0] >= 9, seen


def test_an_instance_at_rest_whose_engine_hangs_under_requests_is_flagged_stalled(node):
    home, tmp = node
    time.sleep(5)
    assert requests(tmp, "woken")[0] > 0
    (tmp / "woken.mode").write_text("stall")
    until(
        lambda: status(home)["woken"]["stalled"],
        60,
        "the instance that was at rest to be flagged stalled once its engine hung",
    )
    seen = over_window(tmp, 10.0)
    assert seen["woken"][0] >= 6, seen  # a scrape a second again
    events = vsup(home, "events", "--since", "all", "--instance", "woken", "--json")
    kinds = [json.loads(line)["kind"] for line in events.stdout.splitlines() if line.strip()]
    assert "stalled" in kinds, events.stdout


def test_while_nobody_reads_a_busy_instance_is_scraped_every_three_seconds(node):
    home, tmp = node
    time.sleep(6)  # the last status request is more than 5 s old: nobody reads
    unread = over_window(tmp)
    stop = threading.Event()
    asked = threading.Event()

    def dashboard() -> None:  # a status request a second, as the dashboard asks
        while not stop.is_set():
            status(home)
            asked.set()
            stop.wait(1.0)

    reader = threading.Thread(target=dashboard)
    reader.start()
    try:
        # the first request's answer (a `vsup status` takes seconds on a loaded machine), then
        # the poll after it
        assert asked.wait(60), "the first status request never answered"
        time.sleep(2)
        read = over_window(tmp)
    finally:
        stop.set()
        reader.join()
    # every 3 s: ~5 in 15 s, where a scrape a second gives ~15
    assert 3 <= unread["paced"][0] <= 8, unread
    assert read["paced"][0] >= 10, read  # above the rest's 8; a loaded poll loop gives ~12-15
    # its /health rides on those scrapes: the health loop asks none in between
    assert unread["paced"][1] <= 8, unread
    # stall_after_s = 3: every poll, read or not
    assert unread["busy"][0] >= 10, unread  # as for `read` above
    assert status(home)["paced"]["generation_tokens_per_s"], "its rates are read meanwhile"
