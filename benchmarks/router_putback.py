"""How fast vsup puts back a member someone else removed from the router, under a remove loop.

    python -m benchmarks.router_putback [--runs N] [--seconds S] [--vllm]

vllm-router's worker API has no authentication (docs/router.md, "Who can reach it"): anyone who
reaches its port can `POST /remove_worker` vsup's replicas. This runs vsup's engine in this
process with the real vllm-router (the `router` extra) in front of two replicas (vLLM emulators;
`--vllm`: real CPU vLLM serving the generated tiny model, each pinned to a core where there are
two), all on 127.0.0.1, and N times: the remove loop of tests/programs/remove_loop.py (list,
remove every worker, again, as fast as one connection goes) for S seconds while completions go
through the router one at a time. Per run and over all runs:
- put-back as the remove loop sees it: from its removal's answer to the member listed again
  (p50/max; this includes at most one round of the loop itself);
- put-back as vsup sees it, in two parts: the watch's read of the worker list that finds a
  member missing (ms from the read's start to its answer), and the router's answer to the
  `add_worker` that puts it back (vllm-router waits for the replica's /health first);
- requests failed of sent, and the load average (1 min) at the end of each run.

Last line: `runs=.. back_p50_ms=.. back_max_ms=.. list_p50_ms=.. list_max_ms=.. add_p50_ms=..
add_max_ms=.. failed=.. requests=.. load_max=..` (p50 over every put-back of every run).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from vsup.clock import SystemClock  # noqa: E402
from vsup.engine import Engine, EngineSettings  # noqa: E402
from vsup.engine.routing import RouterSupervisor  # noqa: E402
from vsup.layout.spec import InstanceSpec, RestartPolicy  # noqa: E402
from vsup.router import RouterClient, RouterSpec  # noqa: E402

from benchmarks.common import (  # noqa: E402
    EMULATOR,
    PYTHON,
    TOKEN_VAR,
    free_ports,
    last_line,
    new_token,
    percentile,
)
from tests.programs.intruder import Stream, stream  # noqa: E402
from tests.programs.router_fleet import MAX_MODEL_LEN, VLLM_ENV  # noqa: E402

ROUTER = Path(PYTHON).parent / "vllm-router"
REMOVE_LOOP = ROOT / "tests" / "programs" / "remove_loop.py"


class Timings:
    """The watch's reads and the put-backs' adds, timed in this process (wrapped around the
    engine's own calls: what vsup waits for, not a model of it)."""

    def __init__(self) -> None:
        self.lists: list[tuple[float, float, tuple[str, ...]]] = []  # start, answer, urls
        self.adds: list[tuple[float, float]] = []
        self.on = False

    def install(self) -> None:
        read, add = RouterSupervisor._list_workers, RouterClient.add_worker
        timings = self

        async def timed_read(sup: RouterSupervisor) -> list[str]:
            t0 = time.monotonic()
            urls = await read(sup)
            if timings.on:
                timings.lists.append((t0, time.monotonic(), tuple(urls)))
            return urls

        async def timed_add(client: RouterClient, url: str, timeout_s: float = 10.0) -> bool:
            t0 = time.monotonic()
            done = await add(client, url, timeout_s)
            if timings.on:
                timings.adds.append((t0, time.monotonic()))
            return done

        RouterSupervisor._list_workers = timed_read  # type: ignore[method-assign,assignment]
        RouterClient.add_worker = timed_add  # type: ignore[method-assign,assignment]


def members(vllm: bool, env: dict[str, str]) -> list[InstanceSpec]:
    ports = free_ports(2)
    if not vllm:
        return [
            InstanceSpec(
                name=name,
                model="bench/emulated",
                command=(PYTHON, str(EMULATOR)),
                host="127.0.0.1",
                port=port,
                gpus=(),
                gpu_memory_utilization=None,
                env=env,
                health_interval_s=1.0,
            )
            for name, port in zip(("r0", "r1"), ports, strict=True)
        ]
    from vsup.demo.tinymodel import generate

    model = generate(Path(tempfile.mkdtemp(prefix="vsup-putback-")) / "tiny-llama")
    cores = sorted(os.sched_getaffinity(0))
    out = []
    for i, (name, port) in enumerate(zip(("r0", "r1"), ports, strict=True)):
        pin = ("taskset", "-c", str(cores[i % len(cores)])) if len(cores) >= 2 else ()
        out.append(
            InstanceSpec(
                name=name,
                model=str(model),
                command=(*pin, PYTHON, "-m", "vllm.entrypoints.openai.api_server"),
                host="127.0.0.1",
                port=port,
                gpus=(),
                gpu_memory_utilization=None,
                args={"dtype": "float32", "enforce-eager": True, "max-model-len": MAX_MODEL_LEN},
                env={**VLLM_ENV, **env},
                start_timeout_s=900.0,
            )
        )
    return out


async def one_run(spec: RouterSpec, model: str, seconds: float) -> tuple[dict[str, Any], Stream]:
    """The remove loop for `seconds` (a child process, as another user's would be) under a
    stream of completions; the loop's own figures and the stream."""
    load = Stream()
    sending = asyncio.create_task(stream(spec.base_url, model, load))
    proc = await asyncio.create_subprocess_exec(
        PYTHON,
        "-",
        spec.base_url,
        str(seconds),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await proc.communicate(REMOVE_LOOP.read_bytes())
    load.stop.set()
    await sending
    return json.loads(out), load


def putback_parts(timings: Timings, workers: list[str]) -> tuple[list[float], list[float]]:
    """The watch's reads that found a member missing and the adds that followed (ms)."""
    missing = [(b - a) * 1000 for a, b, urls in timings.lists if set(workers) - set(urls)]
    adds = [(b - a) * 1000 for a, b in timings.adds]
    return missing, adds


async def run(runs: int, seconds: float, vllm: bool) -> dict[str, float]:
    env = {TOKEN_VAR: new_token()}
    timings = Timings()
    timings.install()
    replicas = members(vllm, env)
    router_port, metrics_port = free_ports(2)
    spec = RouterSpec(
        port=router_port,
        metrics_port=metrics_port,
        policy="round_robin",
        command=(str(ROUTER),),
        env=env,
        restart=RestartPolicy(),
        workers={m.name: m.base_url for m in replicas},
    )
    workers = list(spec.workers.values())
    medians: list[float] = []  # each run's p50 (s)
    slowest: list[float] = []  # each run's slowest put-backs (s)
    failed = sent = 0
    load_max = 0.0
    with tempfile.TemporaryDirectory(prefix="vsup-putback-") as tmp:
        eng = Engine(SystemClock(), Path(tmp) / "logs", settings=EngineSettings())
        client = RouterClient(spec.base_url)
        try:
            await eng.router.apply(spec)
            await eng.apply(replicas, wait=True)
            while sorted(await _listed(client)) != sorted(workers):
                await asyncio.sleep(0.05)
            for i in range(runs):
                timings.on = True
                loop, load = await one_run(spec, replicas[0].model, seconds)
                timings.on = False
                load1 = os.getloadavg()[0]
                load_max = max(load_max, load1)
                back = [loop["back_p50_s"] * 1000, loop["back_max_s"] * 1000]
                medians.append(loop["back_p50_s"])
                slowest += [t[2] - t[1] for t in loop["slowest"]]
                failed, sent = failed + load.failed, sent + load.sent
                print(
                    f"run {i + 1}: {loop['removals']} removals, back after p50 {back[0]:.0f} "
                    f"ms, max {back[1]:.0f} ms; {load.failed} of {load.sent} requests "
                    f"failed; load average {load1:.1f}"
                )
                await asyncio.sleep(1.0)  # the watch back to its calm interval
        finally:
            await client.aclose()
            await eng.shutdown(stop_instances=True)
    missing, adds = putback_parts(timings, workers)
    return {
        "runs": runs,
        "back_p50_ms": percentile(medians, 50) * 1000,
        "back_max_ms": max(slowest) * 1000,
        "list_p50_ms": percentile(missing, 50),
        "list_max_ms": max(missing),
        "add_p50_ms": percentile(adds, 50),
        "add_max_ms": max(adds),
        "failed": failed,
        "requests": sent,
        "load_max": load_max,
    }


async def _listed(client: RouterClient) -> list[str]:
    try:
        return await client.list_workers()
    except Exception:
        return []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="remove loops, one after the other")
    parser.add_argument("--seconds", type=float, default=15.0, help="length of each loop")
    parser.add_argument("--vllm", action="store_true", help="real CPU vLLM replicas")
    args = parser.parse_args(argv)
    if not ROUTER.exists():
        print("vllm-router is not installed (the router extra)", file=sys.stderr)
        return 2
    figures = asyncio.run(run(args.runs, args.seconds, args.vllm))
    print(
        f"{figures['runs']:.0f} runs of {args.seconds:.0f} s: members back after p50 "
        f"{figures['back_p50_ms']:.0f} ms (median of the runs' medians), max "
        f"{figures['back_max_ms']:.0f} ms; the watch's read that found one missing p50 "
        f"{figures['list_p50_ms']:.0f} ms (max {figures['list_max_ms']:.0f}), the put-back's "
        f"add_worker p50 {figures['add_p50_ms']:.0f} ms (max {figures['add_max_ms']:.0f}); "
        f"{figures['failed']:.0f} of {figures['requests']:.0f} requests failed; load average "
        f"up to {figures['load_max']:.1f}"
    )
    print(last_line(**figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
