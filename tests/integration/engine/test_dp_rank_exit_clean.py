"""A data-parallel server that ends by itself with status 0 after one of its ranks died is a
failure, and is restarted: seen on an H100 with vLLM 0.26 (docs/gpu-runs/2026-12-06-h100-span),
a span's headless follower whose head restarted under it gave up after 5 minutes, said only
"RuntimeError: Did not receive response from front-end process within 5 minutes", exited 0,
and was left `stopped` as a clean exit: the unit never served again. The emulator's
`--data-parallel-size 2` tree stands in for it (its server, like vLLM's, ends by itself once a
rank is gone)."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from vsup.engine.exitreason import after_rank_death, classify
from vsup.engine.restart import is_failure

pytest.importorskip("setproctitle")  # the emulator titles its ranks as vLLM does, with it

GAVE_UP = (
    "(EngineCore_DP1 pid=1656) ERROR 12-06 08:14:11 [core.py:1330] RuntimeError: Did not "
    "receive response from front-end process within 5 minutes"
)


def test_the_follower_s_exit_reads_clean_alone_and_engine_dead_after_its_rank_died():
    alone = classify(0, None, GAVE_UP + "\nINFO 12-06 08:14:13 [serve.py:254] Shutting down.\n")
    # what the log says, with status 0, is no failure by itself ...
    assert not is_failure(alone.reason, 0)
    # ... but vsup saw rank 1 die first
    found = after_rank_death(alone, "data-parallel rank 1 (VLLM::EngineCore_DP1, pid 1656) died")
    assert found.reason == "engine_dead" and is_failure(found.reason, 0)
    assert "Did not receive response from front-end process" in (found.excerpt or "")
    # a reason a rule found stays, and an empty log gets what vsup saw
    oom = classify(1, None, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate")
    assert after_rank_death(oom, "rank 1 died").reason == oom.reason
    assert after_rank_death(classify(0, None, ""), "rank 1 died").excerpt == "rank 1 died"


async def test_a_server_that_exits_0_after_a_rank_died_while_starting_is_restarted(
    engine, emulator_spec, events
):
    eng = engine()
    spec = emulator_spec(
        "dp", "--data-parallel-size", "2", "--startup-s", "60", "--dp-shutdown-s", "0",
        "--dead-exit-after", "0.1", "--dead-line", GAVE_UP, start_timeout_s=120,
    )  # fmt: skip
    await eng.apply([spec])
    await eng.wait("dp", ("starting",), timeout=20)
    deadline = time.monotonic() + 20
    while True:
        proc = eng.instances["dp"].process
        seen = proc.ranks.seen() if proc is not None else {}
        if len(seen) == 2 and all(s.alive for s in seen.values()):
            break
        assert time.monotonic() < deadline, f"ranks not seen: {seen}"
        await asyncio.sleep(0.05)
    first = eng.instances["dp"].pid
    os.kill(seen[1].pid, signal.SIGKILL)
    (exit_,) = await events.wait(lambda e: e["kind"] == "exit", timeout=60)
    # it ended by itself, status 0, before its start was over
    assert (exit_["code"], exit_["signal"], exit_["rank"]) == (0, None, 1), exit_
    assert exit_["reason"] == "engine_dead", exit_
    assert "Did not receive response from front-end process" in exit_["log_excerpt"]
    # restarted, not left stopped as a clean exit
    (scheduled,) = await events.wait(lambda e: e["kind"] == "restart_scheduled", timeout=20)
    assert scheduled["reason"] == "engine_dead"
    await events.wait(lambda e: e["kind"] == "spawn", count=2, timeout=20)
    assert eng.instances["dp"].pid != first
    assert eng.instances["dp"].state.value in ("starting", "ready")
