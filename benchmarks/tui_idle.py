"""The dashboard's CPU while idle with 8 instances (target: <= 3% of one core).

    python -m benchmarks.tui_idle [--seconds 30] [--instances 8] [--size 160x45]

The real `DashboardApp` with its real 1 s refresh timer, headless, fed by the in-memory
control client (`MemoryClient`: no daemon, no socket). "Idle" is what an operator leaves on a
screen: nobody presses keys, the instances are up and quiet, and the daemon's snapshot still
changes every second (uptimes advance) so every refresh fetches, parses (the client answers
with the status JSON document, as the HTTP client does), diffs and repaints a little. The
log tail is polled too. The socket round trip to a real daemon is not included. Screen
updates are turned into terminal output as a real terminal app does (a headless app skips
that step). CPU is this process's user+system time over the measured window, after a warm-up.
The last line gives `cpu_pct` (percent of one core) as key=value.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for entry in (str(ROOT), str(ROOT / "benchmarks")):
    if entry not in sys.path:
        sys.path.insert(0, entry)

from vsup.tui.app import DashboardApp  # noqa: E402

from benchmarks.tui_render import count_display  # noqa: E402
from tests.support import samples  # noqa: E402
from tests.support.memory import MemoryClient  # noqa: E402


def quiet_node(instances: int, started: float):
    """Snapshots of `instances` ready, unloaded instances whose uptimes follow the clock."""
    base = samples.big_node(instances, tick=0)
    quiet = tuple(
        i.with_wire(
            kv_cache_usage=0.0,
            requests_running=0.0,
            requests_waiting=0.0,
            generation_tokens_per_s=0.0,
            prompt_tokens_per_s=0.0,
        )
        for i in base.instances
    )

    def snapshot():
        elapsed = int(time.monotonic() - started)
        return dataclasses.replace(
            base,
            supervisor=dataclasses.replace(
                base.supervisor, uptime_s=base.supervisor.uptime_s + elapsed
            ),
            instances=tuple(
                i.with_wire(uptime_s=(i.lifecycle.uptime_s or 0) + elapsed) for i in quiet
            ),
        )

    return snapshot


async def measure(instances: int, seconds: float, size: tuple[int, int], warmup: float) -> dict:
    started = time.monotonic()
    client = MemoryClient(
        source=quiet_node(instances, started),
        as_json=True,
        logs_current={f"g{i % 8}-{i // 8:02d}": "INFO ready\n" for i in range(instances)},
    )
    app = DashboardApp(client, refresh_s=1.0)
    async with app.run_test(size=size) as pilot:
        count_display(app)
        await asyncio.sleep(warmup)
        renders0, calls0 = app.renders, len(client.calls)
        t0 = os.times()
        wall0 = time.monotonic()
        await asyncio.sleep(seconds)
        t1 = os.times()
        wall = time.monotonic() - wall0
        del pilot
        return {
            "cpu_s": (t1.user - t0.user) + (t1.system - t0.system),
            "wall_s": wall,
            "renders": app.renders - renders0,
            "calls": len(client.calls) - calls0,
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--size", default="160x45", help="terminal COLSxROWS")
    args = parser.parse_args(argv)
    cols, rows = (int(v) for v in args.size.lower().split("x"))
    out = asyncio.run(measure(args.instances, args.seconds, (cols, rows), args.warmup))
    pct = 100.0 * out["cpu_s"] / out["wall_s"]
    print(
        f"{out['wall_s']:.1f} s idle: {out['cpu_s'] * 1000:.0f} ms CPU, "
        f"{out['renders']} snapshots rendered, {out['calls']} client calls"
    )
    print(
        f"instances={args.instances} size={args.size} seconds={out['wall_s']:.1f} "
        f"cpu_pct={pct:.2f} renders={out['renders']} target_pct=3 "
        f"ok={'yes' if pct <= 3 else 'no'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
