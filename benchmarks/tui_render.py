"""How long the dashboard takes to refresh with 64 instances (target: <= 20 ms here).

    python -m benchmarks.tui_render [--instances 64] [--rounds 60] [--size 160x45]

The real `DashboardApp`, headless, fed by the in-memory control client (`MemoryClient`: no
daemon, no socket; the snapshots are injected the way the TUI tests inject them). Each round
posts a snapshot in which every instance's live metrics and uptime moved (the worst case: most
visible cells change), and waits for the screen update it causes. Per round it records:
- `refresh_ms`: CPU time of the event-loop thread from the snapshot's arrival to the screen
  update being produced, including turning that update into terminal output (a headless app
  skips that step, so the benchmark does it: `CompositorUpdate.render_segments`). Waiting
  for Textual's 60 Hz update timer is idle time and is not counted.
- `handler_ms`: the diff alone (`Dashboard.render_snapshot`: table cells, panes, header).
- `latency_ms`: wall time from the post to the update (includes that timer wait).
The last line gives the medians as key=value pairs.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from vsup.tui.app import DashboardApp  # noqa: E402
from vsup.tui.messages import SnapshotArrived  # noqa: E402

from tests.support import samples  # noqa: E402
from tests.support.clock import FakeClock  # noqa: E402
from tests.support.memory import MemoryClient  # noqa: E402


def count_display(app: DashboardApp) -> asyncio.Event:
    """Make a headless app turn each screen update into terminal output, as a real terminal
    app does, and signal each one on the returned event."""
    shown = asyncio.Event()
    original = app._display

    def display(screen, renderable):
        if renderable is not None:
            render = getattr(renderable, "render_segments", None)
            if render is not None:
                render(app.console)
            shown.set()
        original(screen, renderable)

    app._display = display  # type: ignore[method-assign]  # a probe around the real method
    return shown


async def measure(instances: int, rounds: int, size: tuple[int, int]) -> dict[str, list[float]]:
    client = MemoryClient(snapshot=samples.big_node(instances, tick=0))
    app = DashboardApp(client, clock=FakeClock(), refresh_s=3600.0)
    out: dict[str, list[float]] = {"refresh_ms": [], "handler_ms": [], "latency_ms": []}
    async with app.run_test(size=size) as pilot:
        while app.renders < 1:
            await pilot.pause()
        dashboard = app.dashboard
        render = dashboard.render_snapshot

        def timed_render(snap):
            t = time.thread_time()
            render(snap)
            out["handler_ms"].append((time.thread_time() - t) * 1000)

        dashboard.render_snapshot = timed_render  # type: ignore[method-assign]  # timed wrapper
        shown = count_display(app)
        for tick in range(1, rounds + 1):
            snap = samples.big_node(instances, tick=tick)
            await pilot.pause()
            shown.clear()
            cpu0, wall0 = time.thread_time(), time.perf_counter()
            app.post_message(SnapshotArrived(snap))
            await shown.wait()
            out["refresh_ms"].append((time.thread_time() - cpu0) * 1000)
            out["latency_ms"].append((time.perf_counter() - wall0) * 1000)
        assert app.renders == rounds + 1, "every round must have been rendered"
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--size", default="160x45", help="terminal COLSxROWS")
    args = parser.parse_args(argv)
    cols, rows = (int(v) for v in args.size.lower().split("x"))
    out = asyncio.run(measure(args.instances, args.rounds, (cols, rows)))
    for key, values in out.items():
        values = sorted(values)
        print(
            f"{key:<11} median {statistics.median(values):7.2f}  "
            f"p90 {values[int(len(values) * 0.9) - 1]:7.2f}  max {values[-1]:7.2f}"
        )
    med = {k: statistics.median(v) for k, v in out.items()}
    print(
        f"instances={args.instances} size={args.size} rounds={args.rounds} "
        f"refresh_ms_median={med['refresh_ms']:.2f} handler_ms_median={med['handler_ms']:.2f} "
        f"latency_ms_median={med['latency_ms']:.2f} target_ms=20 "
        f"ok={'yes' if med['refresh_ms'] <= 20 else 'no'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
