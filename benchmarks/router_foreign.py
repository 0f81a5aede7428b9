"""How fast vsup removes a worker someone else added to the router, and what its watch costs.

    python -m benchmarks.router_foreign [--rounds N] [--loop-seconds S]

vllm-router's worker API has no authentication (docs/router.md): anyone who reaches its port
can `POST /add_worker` a server of their own. This runs vsup's engine in this process with the
real vllm-router (the `router` extra) in front of one vLLM emulator, all on 127.0.0.1, and:
- N single adds of a foreign server (tests/programs/intruder.py), one at a time: the time from
  the add's 200 to vsup's removal (the engine's own record of it), p50/max;
- the CPU one read of the worker list costs this process (what the watch pays every
  `routing.WATCH_S`, over the engine's kept-alive client; httpx's for comparison), as ms per
  read and % of a core;
- an add_worker loop for S seconds under a stream of completions through the router: how many
  of the stream's requests the foreign server answered (what polling cannot prevent).

Last line: `watch_s=.. removal_p50_ms=.. removal_max_ms=.. list_cpu_ms=.. httpx_list_cpu_ms=..
watch_cpu_pct=.. loop_adds=.. loop_foreign=.. loop_requests=..`.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from vsup.clock import SystemClock  # noqa: E402
from vsup.engine import Engine, EngineSettings  # noqa: E402
from vsup.engine.routing import WATCH_S  # noqa: E402
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
from tests.programs.intruder import ForeignServer, Stream, add_worker, stream  # noqa: E402

ROUTER = Path(PYTHON).parent / "vllm-router"


async def run(rounds: int, loop_s: float) -> dict[str, float]:
    env = {TOKEN_VAR: new_token()}
    inst_port, router_port, metrics_port, foreign_port = free_ports(4)
    member = InstanceSpec(
        name="a",
        model="bench/emulated",
        command=(PYTHON, str(EMULATOR)),
        host="127.0.0.1",
        port=inst_port,
        gpus=(),
        gpu_memory_utilization=None,
        env=env,
        health_interval_s=0.2,
    )
    spec = RouterSpec(
        port=router_port,
        metrics_port=metrics_port,
        policy="round_robin",
        command=(str(ROUTER),),
        env=env,
        restart=RestartPolicy(),
        workers={"a": member.base_url},
    )
    out: dict[str, float] = {"watch_s": WATCH_S}
    with tempfile.TemporaryDirectory(prefix="vsup-foreign-") as tmp:
        eng = Engine(SystemClock(), Path(tmp) / "logs", settings=EngineSettings())
        client = RouterClient(spec.base_url)
        try:
            await eng.router.apply(spec)
            await eng.apply([member], wait=True)
            while sorted(await _listed(client)) != [member.base_url]:
                await asyncio.sleep(0.05)
            async with ForeignServer(foreign_port) as intruder:
                took = []
                for _ in range(rounds):
                    before = eng.router.foreign.get(intruder.url)
                    seen = before.removals if before is not None else 0
                    assert await add_worker(spec.base_url, intruder.url) == 200
                    added = time.monotonic()
                    while True:
                        rec = eng.router.foreign.get(intruder.url)
                        if rec is not None and rec.removals > seen:
                            break
                        await asyncio.sleep(0.001)
                    took.append((rec.last_seen_mono - added) * 1000)
                    await asyncio.sleep(WATCH_S * 0.37)  # spread the adds over the watch cycle
                out["removal_p50_ms"] = percentile(took, 50)
                out["removal_max_ms"] = max(took)

                # the watch's read (the engine's kept-alive client) against httpx's
                n = 300
                for name, read in (
                    ("list_cpu_ms", eng.router._list_workers),
                    ("httpx_list_cpu_ms", client.list_workers),
                ):
                    t0 = time.process_time()
                    for _ in range(n):
                        await read()
                    out[name] = (time.process_time() - t0) / n * 1000
                out["watch_cpu_pct"] = out["list_cpu_ms"] / 1000 / WATCH_S * 100

                load = Stream()
                sending = asyncio.create_task(stream(spec.base_url, member.model, load))
                before_hits, before_sent, adds = intruder.hits, load.sent, 0
                t0 = time.monotonic()
                while time.monotonic() - t0 < loop_s:
                    adds += await add_worker(spec.base_url, intruder.url) == 200
                out["loop_adds"] = adds
                out["loop_foreign"] = intruder.hits - before_hits
                out["loop_requests"] = load.sent - before_sent
                load.stop.set()
                await sending
        finally:
            await client.aclose()
            await eng.shutdown(stop_instances=True)
    return out


async def _listed(client: RouterClient) -> list[str]:
    try:
        return await client.list_workers()
    except Exception:
        return []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20, help="single foreign adds")
    parser.add_argument("--loop-seconds", type=float, default=5.0, help="add_worker loop length")
    args = parser.parse_args(argv)
    if not ROUTER.exists():
        print("vllm-router is not installed (the router extra)", file=sys.stderr)
        return 2
    figures = asyncio.run(run(args.rounds, args.loop_seconds))
    print(
        f"single adds: removed after p50 {figures['removal_p50_ms']:.0f} ms, max "
        f"{figures['removal_max_ms']:.0f} ms (watch every {WATCH_S * 1000:.0f} ms); one worker "
        f"list read costs {figures['list_cpu_ms']:.2f} ms of CPU (httpx: "
        f"{figures['httpx_list_cpu_ms']:.2f} ms), {figures['watch_cpu_pct']:.2f} % of a core; "
        f"add_worker loop: {figures['loop_adds']:.0f} adds got in, "
        f"{figures['loop_foreign']:.0f} of {figures['loop_requests']:.0f} requests reached it"
    )
    print(last_line(**figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
