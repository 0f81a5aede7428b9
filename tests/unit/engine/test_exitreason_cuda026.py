"""Exit classification on the exits real vLLM 0.26 had on an H200 (tests/fixtures/vllm-0.26-cuda)."""

from __future__ import annotations

from pathlib import Path

from vsup.engine.exitreason import classify
from vsup.snapshot import EXIT_REASONS

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "vllm-0.26-cuda"


def text(name: str) -> str:
    return (FIX / name).read_bytes().decode("utf-8", errors="replace")


def test_sigkill_of_the_enginecore_is_engine_dead():
    # The API server logs EngineDeadError and exits 0 by itself about 2 s after the kill.
    got = classify(0, None, text("exits/engine_dead_core_killed.log"))
    assert got.reason == "engine_dead"
    assert got.excerpt is not None
    assert "EngineDeadError: EngineCore encountered an issue" in got.excerpt


def test_memory_held_by_another_process_names_the_enginecores_refusal():
    got = classify(1, None, text("exits/gpu_memory_refused_foreign_process.log"))
    # The engine branch gives this refusal its own reason; before it, it reads as engine_dead.
    want = "gpu_memory_insufficient" if "gpu_memory_insufficient" in EXIT_REASONS else "engine_dead"
    assert got.reason == want
    assert got.excerpt is not None
    assert (
        "Free memory on device cuda:0 (54.89/139.8 GiB) on startup is less than desired GPU "
        "memory utilization (0.9, 125.82 GiB)" in got.excerpt
    )


def test_a_healthy_cuda_startup_decides_nothing_and_a_sigkill_is_killed():
    startup = text("startup.log")
    until_ready = startup[: startup.index("Application startup complete.")]
    assert classify(0, None, until_ready).reason == "unknown"
    assert classify(None, 9, startup).reason == "killed"


def test_the_starved_co_tenant_of_a_simultaneous_start_came_up_with_little_kv():
    # Not an exit: the control run of gpu_real.py, kept as the reason for the serialized start.
    starved, other = text("concurrent_start_c0a.log"), text("concurrent_start_c0b.log")
    assert "56.88 GiB for non-torch memory" in starved and "GPU KV cache size: 89,744" in starved
    assert "GPU KV cache size: 1,814,944" in other
    assert classify(0, None, starved[: starved.index("Application startup complete.")]).reason == (
        "unknown"
    )
