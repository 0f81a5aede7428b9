"""How fast vsup sees a crash: from a SIGKILL of an instance's process to the engine's state change.

    python -m benchmarks.crash_detect [--kills 50] [--naive-kills 20]

The Engine (supervisor/vsup/engine, on its asyncio loop, as the daemon hosts it) supervises one vLLM
emulator (tests/programs/vllm_emulator.py) with restart-at-once. Each round waits for `ready`,
stamps the time, SIGKILLs the process and records when the engine's `state` event (ready -> the
next state) and its `exit` event arrive (time.monotonic(), in the same process). The engine sees
exits through a pidfd on its event loop, so no polling interval is involved.

The naive approach, measured in the same run: a loop that checks the child once a second
(`Popen.poll()`, as a 1 Hz psutil/`kill -0` watcher would), over `--naive-kills` kills.

Last line: `kills=.. detect_ms_p50=.. detect_ms_p99=.. exit_event_ms_p99=.. naive_ms_p50=..
naive_ms_p99=.. naive_ratio_p50=..`. Target: detect_ms_p99 <= 100.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from vsup.clock import SystemClock  # noqa: E402
from vsup.engine import Engine, EngineSettings  # noqa: E402
from vsup.journalevents import JournalEvent  # noqa: E402
from vsup.layout.spec import InstanceSpec, RestartPolicy  # noqa: E402

from benchmarks.common import (  # noqa: E402
    EMULATOR,
    PYTHON,
    TOKEN_VAR,
    free_ports,
    kill_token,
    last_line,
    new_token,
    percentile,
)


class Stamped:
    """The engine's events with their arrival time."""

    def __init__(self) -> None:
        self.items: list[tuple[float, dict]] = []
        self.changed = asyncio.Event()

    def __call__(self, event: JournalEvent) -> None:
        self.items.append((time.monotonic(), event.to_json()))
        self.changed.set()

    async def first_after(self, t0: float, pred, timeout: float = 20.0) -> float:
        async def scan() -> float:
            while True:
                for t, e in self.items:
                    if t >= t0 and pred(e):
                        return t
                self.changed.clear()
                await self.changed.wait()

        return await asyncio.wait_for(scan(), timeout)


async def engine_rounds(kills: int, token: str) -> tuple[list[float], list[float]]:
    events = Stamped()
    with tempfile.TemporaryDirectory(prefix="vsup-crash-") as tmp:
        engine = Engine(
            SystemClock(), Path(tmp) / "logs", events, settings=EngineSettings(health_timeout_s=1.0)
        )
        spec = InstanceSpec(
            name="crash",
            model="bench/emulated",
            command=(PYTHON, str(EMULATOR)),
            host="127.0.0.1",
            port=free_ports(1)[0],
            gpus=(),
            gpu_memory_utilization=None,
            env={TOKEN_VAR: token},
            # restart at once, every time: the breaker never trips
            restart=RestartPolicy(backoff_s=0.0, backoff_max_s=0.0, stable_s=0, max_failures=0),
            start_timeout_s=30,
            stop_grace_s=2,
            health_interval_s=0.05,
        )
        state_ms, exit_ms = [], []
        try:
            await engine.apply([spec])
            for _ in range(kills):
                await engine.wait("crash", ("ready",), timeout=30)
                # let the health loop settle into its sleep, as in steady state
                await asyncio.sleep(0.1)
                pid = engine.instances["crash"].pid
                assert pid is not None
                t0 = time.monotonic()
                os.kill(pid, signal.SIGKILL)
                t_state = await events.first_after(
                    t0, lambda e: e["kind"] == "state" and e.get("from") == "ready"
                )
                t_exit = await events.first_after(
                    t0, lambda e, pid=pid: e["kind"] == "exit" and e.get("pid") == pid
                )
                state_ms.append((t_state - t0) * 1e3)
                exit_ms.append((t_exit - t0) * 1e3)
        finally:
            await engine.shutdown(stop_instances=True)
    return state_ms, exit_ms


def naive_rounds(kills: int, token: str, interval: float = 1.0) -> list[float]:
    """A 1 Hz watcher: the child is checked once a second; latency from kill to noticing.
    Where in its cycle the watcher is when a crash comes is arbitrary: the kills are spread
    evenly over the cycle (in shuffled order), so the figures are those of the average case."""
    import random

    phases = [(i + 0.5) / kills * interval for i in range(kills)]
    random.Random(7).shuffle(phases)
    env = dict(os.environ, **{TOKEN_VAR: token})
    out = []
    for phase in phases:
        port = free_ports(1)[0]
        child = subprocess.Popen(
            [PYTHON, str(EMULATOR), "--port", str(port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(0.3)
        t0 = time.monotonic()
        child.kill()
        next_check = t0 + phase
        while True:
            time.sleep(max(0.0, next_check - time.monotonic()))
            if child.poll() is not None:
                out.append((time.monotonic() - t0) * 1e3)
                break
            next_check += interval
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=50)
    ap.add_argument("--naive-kills", type=int, default=20, help="0 skips the naive watcher")
    args = ap.parse_args(argv)
    token = new_token()
    try:
        state_ms, exit_ms = asyncio.run(engine_rounds(args.kills, token))
        naive_ms = naive_rounds(args.naive_kills, token) if args.naive_kills else []
    finally:
        left = kill_token(token)
        if left:
            print(f"warning: killed {len(left)} processes left behind: {left}", file=sys.stderr)
    print("kill -> state change ms: " + " ".join(f"{v:.1f}" for v in state_ms))
    figures = dict(
        kills=len(state_ms),
        detect_ms_p50=percentile(state_ms, 50),
        detect_ms_p99=percentile(state_ms, 99),
        detect_ms_max=max(state_ms),
        exit_event_ms_p50=percentile(exit_ms, 50),
        exit_event_ms_p99=percentile(exit_ms, 99),
    )
    if naive_ms:
        print("naive 1 Hz watcher ms: " + " ".join(f"{v:.0f}" for v in naive_ms))
        figures.update(
            naive_ms_p50=percentile(naive_ms, 50),
            naive_ms_p99=percentile(naive_ms, 99),
            naive_ratio_p50=percentile(naive_ms, 50) / max(percentile(state_ms, 50), 1e-3),
        )
    print(last_line(**figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
