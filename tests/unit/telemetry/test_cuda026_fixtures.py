"""Backend, log and metrics readers on what real vLLM 0.26 wrote on an H200 (CUDA 13, FA3).

Fixtures: tests/fixtures/vllm-0.26-cuda (captured by benchmarks/gpu_real.py; README there).
"""

from __future__ import annotations

from pathlib import Path

from vsup.telemetry.backend import BackendDetector
from vsup.telemetry.logwatch import LogWatcher
from vsup.telemetry.metrics import parse_metrics

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "vllm-0.26-cuda"


def startup_bytes() -> bytes:
    return (FIX / "startup.log").read_bytes()


def test_the_fixture_keeps_the_progress_bars_raw_carriage_returns():
    raw = startup_bytes()
    assert b"Capturing CUDA graphs (PIECEWISE):" in raw
    assert raw.count(b"\r") >= 10  # tqdm redraws in place; nothing was normalised


def test_flash_attention_is_read_from_the_real_cuda_log():
    detector = BackendDetector()
    for line in startup_bytes().decode("utf-8", errors="replace").splitlines():
        detector.feed(line)
    info = detector.result()
    assert detector.platform == "cuda"
    assert info is not None
    assert (info.name, info.source) == ("FLASH_ATTN", "log")
    assert info.line is not None
    assert "out of potential backends: ['FLASH_ATTN', 'TRITON_ATTN', 'FLEX_ATTENTION']" in info.line


def test_the_flash_attention_version_line_is_not_taken_for_a_backend():
    detector = BackendDetector()
    text = startup_bytes().decode("utf-8", errors="replace")
    fa3 = next(ln for ln in text.splitlines() if "Using FlashAttention version 3" in ln)
    detector.feed(fa3)
    assert detector.name is None


def test_log_watcher_reads_the_real_cuda_log_as_a_terminal_would(tmp_path: Path):
    log = tmp_path / "run-0001.log"
    log.write_bytes(startup_bytes())
    watcher = LogWatcher(log, tail_lines=5000)
    while watcher.poll().bytes_read:
        pass
    assert watcher.ready_logged
    assert watcher.listen_url == "http://127.0.0.1:8400"
    assert watcher.backend_info().name == "FLASH_ATTN"
    bars = [ln for ln in watcher.tail if "Capturing CUDA graphs" in ln]
    # One line per bar, in its final state, and no carriage return left in any line.
    assert len(bars) == 2
    assert all("51/51" in ln for ln in bars)
    assert not any("\r" in ln for ln in watcher.tail)


def test_metrics_of_a_real_cuda_server_preempting_under_load():
    m = parse_metrics((FIX / "metrics_kvload.txt").read_text())
    # --num-gpu-blocks-override 128 with FLASH_ATTN's block size 16.
    assert m.kv_capacity_tokens == 2048
    assert m.cache_config is not None
    assert m.cache_config["num_gpu_blocks"] == "128"
    assert m.cache_config["block_size"] == "16"
    assert m.kv_cache_usage == 0.9448818897637795
    assert m.preemptions_total == 2.0
    assert (m.requests_running, m.requests_waiting) == (5.0, 19.0)
