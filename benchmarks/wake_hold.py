"""What wake on request's holder path adds: latency and a throughput ceiling through vllm-router
alone vs through the holder (router/holder.py) in front of the same kind of worker.

    python -m benchmarks.wake_hold [--requests N] [--seconds S] [--concurrency C]

Two vLLM emulators (tests/programs/vllm_emulator.py: one-token answers; emulator, not vLLM),
the real vllm-router 0.1.17 in its gateway mode (`--enable-igw`) and a holder in a process of
its own (as in the daemon: one asyncio loop), all on 127.0.0.1. Model `direct` is routed to
emulator 1; model `held`'s worker is the holder, whose wake returns emulator 2 at once: every
request for `held` takes the path a held request takes (router -> holder -> vLLM, the answer
copied back) without the wake itself, which is vLLM's (docs/sleep.md).

Latency: N one-token completions per path, one at a time, alternating the paths (machine drift
hits both alike), kept-alive client connections; p50/p99 (nearest rank). Ceiling: C loops with
no pause for S seconds per path; answered requests per second.

Last line: `router_p50_ms=.. router_p99_ms=.. held_p50_ms=.. held_p99_ms=.. added_p50_ms=..
added_p99_ms=.. router_rps=.. held_rps=.. failed=..`.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import httpx

from benchmarks.common import free_ports, last_line, percentile
from tests.programs.router_fleet import router_command, spawn, stop_group, wait_http

EMULATOR = Path(__file__).resolve().parent.parent / "tests" / "programs" / "vllm_emulator.py"


def body(model: str) -> dict:
    return {"model": model, "prompt": "hold me", "max_tokens": 1}


async def serve_holder(port_file: str, target: str) -> None:
    """The child process: one holder whose wake answers `target` at once."""
    from vsup.router.holder import Holder

    async def wake() -> str:
        return target

    holder = Holder("held", wake, hold_s=60, capacity=100000)
    await holder.start()
    Path(port_file).write_text(str(holder.port))
    await asyncio.Event().wait()


async def latencies(base: str, n: int) -> tuple[list[float], list[float]]:
    out: dict[str, list[float]] = {"direct": [], "held": []}
    async with httpx.AsyncClient(timeout=60) as client:
        for model in out:  # warm both paths
            for _ in range(10):
                (await client.post(f"{base}/v1/completions", json=body(model))).raise_for_status()
        for _ in range(n):
            for model in out:
                t0 = time.perf_counter()
                resp = await client.post(f"{base}/v1/completions", json=body(model))
                out[model].append((time.perf_counter() - t0) * 1000)
                resp.raise_for_status()
    return out["direct"], out["held"]


async def ceiling(base: str, model: str, seconds: float, concurrency: int) -> tuple[float, int]:
    ok = failed = 0
    deadline = time.monotonic() + seconds
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:

        async def loop() -> None:
            nonlocal ok, failed
            while time.monotonic() < deadline:
                try:
                    resp = await client.post(f"{base}/v1/completions", json=body(model))
                    if resp.status_code == 200:
                        ok += 1
                    else:
                        failed += 1
                except httpx.HTTPError:
                    failed += 1

        t0 = time.monotonic()
        await asyncio.gather(*(loop() for _ in range(concurrency)))
        return ok / (time.monotonic() - t0), failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300, help="latency samples per path")
    parser.add_argument("--seconds", type=float, default=10.0, help="each ceiling's window")
    parser.add_argument("--concurrency", type=int, default=8, help="loops for the ceiling")
    parser.add_argument("--serve-holder", nargs=2, metavar=("PORT_FILE", "TARGET"))
    args = parser.parse_args(argv)
    if args.serve_holder:
        asyncio.run(serve_holder(*args.serve_holder))
        return 0

    work = Path(tempfile.mkdtemp(prefix="vsup-wake-hold-"))
    e1, e2, router_port, metrics_port = free_ports(4)
    procs = []
    try:
        for port, model in ((e1, "direct"), (e2, "held-backend")):
            argv_e = [sys.executable, str(EMULATOR), "--model", model, "--port", str(port)]
            procs.append(spawn(argv_e, work / f"emulator-{port}.log"))
            wait_http(f"http://127.0.0.1:{port}/health", 60, procs[-1])
        port_file = work / "holder.port"
        target = f"http://127.0.0.1:{e2}"
        holder_argv = [sys.executable, "-m", "benchmarks.wake_hold", "--serve-holder"]
        root = {"PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
        procs.append(spawn([*holder_argv, str(port_file), target], work / "holder.log", root))
        for _ in range(200):
            if port_file.exists() and port_file.read_text():
                break
            time.sleep(0.05)
        holder = f"http://127.0.0.1:{port_file.read_text()}"
        base = f"http://127.0.0.1:{router_port}"
        router_argv = [
            *router_command(),
            "--host",
            "127.0.0.1",
            "--port",
            str(router_port),
            "--prometheus-port",
            str(metrics_port),
            "--policy",
            "round_robin",
            "--enable-igw",
        ]
        procs.append(spawn(router_argv, work / "router.log"))
        wait_http(f"{base}/liveness", 60, procs[-1])
        for url in (f"http://127.0.0.1:{e1}", holder):
            httpx.post(f"{base}/add_worker", params={"url": url}, timeout=30).raise_for_status()
        direct, held = asyncio.run(latencies(base, args.requests))
        router_rps, f1 = asyncio.run(ceiling(base, "direct", args.seconds, args.concurrency))
        held_rps, f2 = asyncio.run(ceiling(base, "held", args.seconds, args.concurrency))
    finally:
        for proc in reversed(procs):
            stop_group(proc, grace_s=5)
    print(f"{len(direct)} requests per path; ceilings with {args.concurrency} loops")
    print(
        last_line(
            router_p50_ms=percentile(direct, 50),
            router_p99_ms=percentile(direct, 99),
            held_p50_ms=percentile(held, 50),
            held_p99_ms=percentile(held, 99),
            added_p50_ms=percentile(held, 50) - percentile(direct, 50),
            added_p99_ms=percentile(held, 99) - percentile(direct, 99),
            router_rps=router_rps,
            held_rps=held_rps,
            failed=f1 + f2,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
