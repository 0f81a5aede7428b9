"""What the router adds: latency (direct vs through vllm-router) and the router's CPU.

    python -m benchmarks.router_overhead [--requests N] [--rate R] [--seconds S]

One real CPU vLLM replica (the generated tiny model) and the real vllm-router (the `router`
extra) in front of it, both on 127.0.0.1, started and stopped by this script.

Latency: N completions with max_tokens 1, one at a time, alternating direct and through the
router (so drift from a loaded machine hits both alike), each over a kept-alive connection;
p50/p99 (nearest rank) of each and the p50 difference. CPU: a steady load through the router
at R requests/s (max_tokens 1, 4 loops) for S seconds; the router process's user + system time
(psutil; the router's Rust core runs inside that process) as % of one core and ms per request.

Last line: `direct_p50_ms=.. direct_p99_ms=.. router_p50_ms=.. router_p99_ms=..
added_p50_ms=.. added_p99_ms=.. rate=.. router_cpu_pct=.. router_cpu_ms_per_req=.. failed=..`.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import httpx

from benchmarks.common import cpu_seconds, free_ports, last_line, percentile
from tests.programs.router_fleet import (
    VLLM_ENV,
    completion_body,
    router_command,
    spawn,
    steady_load,
    stop_group,
    vllm_argv,
    wait_http,
)


async def latencies(direct: str, routed: str, model: str, n: int) -> tuple[list, list]:
    body = completion_body(model, 1)
    out: dict[str, list[float]] = {direct: [], routed: []}
    async with httpx.AsyncClient(timeout=60) as client:
        for base in (direct, routed):  # warm both paths and connections
            for _ in range(5):
                (await client.post(f"{base}/v1/completions", json=body)).raise_for_status()
        for _ in range(n):
            for base in (direct, routed):
                start = time.perf_counter()
                resp = await client.post(f"{base}/v1/completions", json=body)
                elapsed = time.perf_counter() - start
                resp.raise_for_status()
                out[base].append(elapsed * 1000)
    return out[direct], out[routed]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200, help="latency samples per path")
    parser.add_argument("--rate", type=float, default=20.0, help="requests/s for the CPU figure")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of the CPU window")
    args = parser.parse_args(argv)

    from vsup.demo.tinymodel import generate

    work = Path(tempfile.mkdtemp(prefix="vsup-router-bench-"))
    model = generate(work / "tiny-llama")
    vllm_port, router_port, metrics_port = free_ports(3)
    replica = spawn(vllm_argv(model, vllm_port), work / "vllm.log", VLLM_ENV)
    router = None
    try:
        direct = f"http://127.0.0.1:{vllm_port}"
        wait_http(f"{direct}/health", 300, replica)
        routed = f"http://127.0.0.1:{router_port}"
        router = spawn(
            [
                *router_command(),
                "--host",
                "127.0.0.1",
                "--port",
                str(router_port),
                "--prometheus-port",
                str(metrics_port),
                "--policy",
                "round_robin",
                "--worker-startup-check-interval",
                "1",
                "--worker-urls",
                direct,
            ],
            work / "router.log",
        )
        wait_http(f"{routed}/readiness", 60, router)
        d, r = asyncio.run(latencies(direct, routed, str(model), args.requests))
        cpu0 = cpu_seconds(router.pid)
        t0 = time.monotonic()
        load = asyncio.run(
            steady_load(
                routed, str(model), args.seconds, concurrency=4, max_tokens=1, rate_per_s=args.rate
            )
        )
        elapsed = time.monotonic() - t0
        cpu = cpu_seconds(router.pid) - cpu0
    finally:
        if router is not None:
            stop_group(router, grace_s=10)
        stop_group(replica)
    sent = load.ok + load.failed
    print(f"direct: {len(d)} requests, router: {len(r)}; load: {sent} requests in {elapsed:.1f} s")
    print(
        last_line(
            direct_p50_ms=percentile(d, 50),
            direct_p99_ms=percentile(d, 99),
            router_p50_ms=percentile(r, 50),
            router_p99_ms=percentile(r, 99),
            added_p50_ms=percentile(r, 50) - percentile(d, 50),
            added_p99_ms=percentile(r, 99) - percentile(d, 99),
            rate=sent / elapsed,
            router_cpu_pct=100.0 * cpu / elapsed,
            router_cpu_ms_per_req=1000.0 * cpu / max(1, sent),
            failed=load.failed,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
