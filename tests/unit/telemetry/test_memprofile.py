"""vLLM's start-up memory line, read from a real CUDA vLLM 0.26 log and the 0.32 format."""

from __future__ import annotations

import shutil
from pathlib import Path

from vsup.telemetry.hbm import HbmFigure
from vsup.telemetry.instance import InstanceTelemetry
from vsup.telemetry.logwatch import scan_log
from vsup.telemetry.memprofile import GiB, MemoryLines

from tests.support.clock import FakeClock

FIXTURE = Path(__file__).parents[2] / "fixtures" / "vllm-0.26-cuda" / "startup.log"


def close(a, b, tol=0.006 * GiB):
    return a is not None and abs(a - b) <= tol


def test_real_026_log_gives_vllms_memory_parts():
    profile = scan_log(FIXTURE).memory.profile()
    assert profile is not None and profile.profiled and profile.workers == 1
    assert profile.utilization == 0.45
    # the figures the fixture's line states (README): robust to another real capture at 0.45
    assert profile.requested_bytes is not None
    assert 0.44 * 130 * GiB < profile.requested_bytes < 0.46 * 150 * GiB
    for part in (
        profile.weights_bytes,
        profile.activation_bytes,
        profile.non_torch_bytes,
        profile.cudagraph_bytes,
        profile.kv_cache_bytes,
    ):
        assert part is not None and part > 0
    assert profile.weights_bytes is not None and profile.activation_bytes is not None
    assert profile.non_torch_bytes is not None and profile.kv_cache_bytes is not None
    parts = profile.weights_bytes + profile.activation_bytes + profile.non_torch_bytes
    # vLLM's own budget: KV = requested - weights - activation - non-torch (0.26, graphs apart)
    assert close(profile.kv_cache_bytes, profile.requested_bytes - parts, 0.05 * GiB)


def test_032_line_splits_consumed_memory_with_the_model_loading_line():
    lines = MemoryLines()
    lines.feed(
        "(EngineCore pid=9) INFO 12-01 00:54:19 [gpu_model_runner.py:5150] Model loading took "
        "2.79 GiB memory and 1.895889 seconds"
    )
    lines.feed("(EngineCore pid=9) INFO [gpu_worker.py:760] Available KV cache memory: 58.88 GiB")
    lines.feed(
        "(EngineCore pid=9) INFO [gpu_worker.py:1030] Free memory on device (139.29/139.8 GiB) on "
        "startup. Desired GPU memory utilization is (0.45, 62.91 GiB). Actual usage is 3.01 GiB "
        "for consumed memory (weights + non-torch), 1.01 GiB for peak activation, and 0.45 GiB "
        "for CUDAGraph memory. Replace gpu_memory_utilization config with `--kv-cache-memory=1` "
        "(58.74 GiB) to fit into requested memory, or `--kv-cache-memory=2` (135.12 GiB) to fully"
        " utilize gpu memory. Current kv cache memory in use is 58.88 GiB."
    )
    p = lines.profile()
    assert p is not None and p.profiled
    assert close(p.weights_bytes, 2.79 * GiB) and close(p.non_torch_bytes, 0.22 * GiB)
    assert close(p.activation_bytes, 1.01 * GiB) and close(p.cudagraph_bytes, 0.45 * GiB)
    assert close(p.requested_bytes, 62.91 * GiB) and close(p.kv_cache_bytes, 58.88 * GiB)


def test_tensor_parallel_workers_are_summed():
    lines = MemoryLines()
    for rank in (0, 1):
        lines.feed(
            f"(Worker_TP{rank} pid={100 + rank}) INFO [gpu_worker.py:857] Free memory on device "
            "(139.29/139.8 GiB) on startup. Desired GPU memory utilization is (0.9, 125.82 GiB). "
            "Actual usage is 7.5 GiB for weight, 1.5 GiB for peak activation, 1.25 GiB for "
            "non-torch memory, and 0.5 GiB for CUDAGraph memory. Replace ..."
        )
    p = lines.profile()
    assert p is not None and p.workers == 2 and p.utilization == 0.9
    assert close(p.non_torch_bytes, 2.5 * GiB) and close(p.cudagraph_bytes, 1.0 * GiB)
    assert close(p.requested_bytes, 2 * 125.82 * GiB)


def test_lines_without_memory_figures_and_a_cpu_log_give_nothing():
    lines = MemoryLines()
    assert not lines.feed("INFO Checkpoint size: 2.79 GiB. Available RAM: 123.48 GiB.")
    assert lines.profile() is None
    cpu = Path(__file__).parents[2] / "fixtures" / "vllm-0.32-cpu" / "startup.log"
    assert scan_log(cpu).memory.profile() is None


def test_instance_fields_carry_the_parts_and_the_hbm_held_once_serving(tmp_path):
    log = tmp_path / "run.log"
    text = FIXTURE.read_bytes()
    cut = text.index(b"Starting vLLM server on")
    log.write_bytes(text[:cut])  # not serving yet
    tel = InstanceTelemetry(FakeClock())
    tel.start_run(1, log)
    tel.poll_log()
    fields = tel.fields(HbmFigure(60 * GiB, "process"))
    assert fields["vllm_non_torch_bytes"] and fields["vllm_cudagraph_bytes"]
    assert fields["hbm_start_bytes"] is None
    shutil.copyfile(FIXTURE, log)  # the rest arrives: ready
    tel.poll_log()
    assert tel.fields(HbmFigure(None, "unavailable"))["hbm_start_bytes"] is None
    assert tel.fields(HbmFigure(64 * GiB, "device"))["hbm_start_bytes"] is None
    assert tel.fields(HbmFigure(64 * GiB, "process"))["hbm_start_bytes"] == 64 * GiB
    assert tel.fields(HbmFigure(66 * GiB, "process"))["hbm_start_bytes"] == 64 * GiB
    tel.start_run(2, log)  # a new run has a new baseline
    assert tel.fields(None)["hbm_start_bytes"] is None
