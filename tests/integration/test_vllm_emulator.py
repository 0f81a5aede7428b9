"""The vLLM emulator (tests/programs/vllm_emulator.py) keeps the shapes vsup reads from a real
vLLM: its /metrics payload parses as the recorded one does, with values that move; it can serve
many ports from one process, drop the vllm:* families as `--disable-log-stats` does, and pass a
SIGTERM on to its EngineCore child."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from vsup.telemetry.metrics import parse_metrics

from tests.conftest import free_port

EMULATOR = Path(__file__).parents[1] / "programs" / "vllm_emulator.py"

pytestmark = pytest.mark.timeout(60)


def start(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(EMULATOR), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def get(port: int, path: str, timeout: float = 10.0) -> httpx.Response:
    """GET once the port accepts connections (it refuses them until the emulator is ready)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return httpx.get(f"http://127.0.0.1:{port}{path}", trust_env=False)
        except httpx.ConnectError:
            assert time.monotonic() < deadline, f"port {port} never answered"
            time.sleep(0.02)


@pytest.fixture
def procs():
    started: list[subprocess.Popen] = []
    yield started
    for p in started:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def test_metrics_parse_like_vllms_and_move_between_scrapes(procs):
    port = free_port()
    procs.append(start("--port", str(port), "--model", "org/m", "--dtype", "float32"))
    first = parse_metrics(get(port, "/metrics").text)
    time.sleep(1.1)
    second = parse_metrics(get(port, "/metrics").text)
    assert first.vllm_seen and second.vllm_seen
    assert first.kv_cache_usage is not None
    assert 0.0 <= first.kv_cache_usage <= 1.0
    assert first.kv_capacity_tokens == 1048576  # from the recorded cache_config_info
    assert first.generation_tokens_total is not None
    assert second.generation_tokens_total is not None
    assert second.generation_tokens_total > first.generation_tokens_total
    assert get(port, "/health").status_code == 200
    assert "org/m" in get(port, "/v1/models").text


def test_many_ports_from_one_process(procs):
    base = free_port()
    ports = [base, base + 1, base + 2]
    procs.append(start("--ports", f"{ports[0]}-{ports[-1]}", "--port", str(base)))
    for port in ports:
        assert parse_metrics(get(port, "/metrics").text).vllm_seen


def test_disable_log_stats_drops_every_vllm_family(procs):
    port = free_port()
    procs.append(start("--port", str(port), "--disable-log-stats"))
    text = get(port, "/metrics").text
    assert "vllm:" not in text and "process_start_time_seconds" in text
    assert not parse_metrics(text).vllm_seen


def test_sigterm_of_the_server_alone_ends_its_engine_child_too(procs):
    port = free_port()
    p = start("--port", str(port), "--engine-child")
    procs.append(p)
    get(port, "/health")
    core = None
    deadline = time.monotonic() + 10
    while core is None:
        assert time.monotonic() < deadline
        line = p.stdout.readline()
        if line.startswith("emulator core "):
            core = int(line.split("pid=")[1].split()[0])
    # the core's pidfd turns readable when it exits (it is not this test's child): the wait is
    # on that event, with a generous limit for a loaded machine
    core_fd = os.pidfd_open(core)
    try:
        os.kill(p.pid, signal.SIGTERM)
        assert p.wait(60) == -signal.SIGTERM
        ended, _, _ = select.select([core_fd], [], [], 60)
        assert ended, "EngineCore outlived the server's SIGTERM"
    finally:
        os.close(core_fd)
