"""What a scan of the node's processes costs: the engine's and the HBM attribution's vs psutil.

    python -m benchmarks.proc_scan [--iterations N]

The engine reads /proc for process trees (`engine.proc.process_table`, shared by all runners
and rescanned at most every half chores interval), and the GPU attribution reads it each poll
(`telemetry.hbm.ProcessTable.scan`); both read `/proc/PID/stat` directly instead of going
through psutil. Prints the median of N scans of each, per scan and per process, beside
`psutil.process_iter` asking for the same fields. The last line: `processes=..
engine_us_per_process=.. hbm_us_per_process=.. psutil_us_per_process=..`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402

from vsup.engine.proc import process_table  # noqa: E402
from vsup.telemetry.hbm import ProcessTable  # noqa: E402


def median_s(fn: Callable[[], object], iterations: int) -> float:
    fn()  # warm the page cache and the imports
    samples = []
    for _ in range(iterations):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iterations", type=int, default=50)
    args = ap.parse_args(argv)
    count = sum(1 for p in os.listdir("/proc") if p.isdigit())
    scans = {
        "engine": process_table,
        "hbm": ProcessTable.scan,
        "psutil": lambda: [p.info for p in psutil.process_iter(["ppid", "create_time"])],
    }
    per_process = {}
    for name, fn in scans.items():
        s = median_s(fn, args.iterations)
        per_process[name] = s / count * 1e6
        print(f"{name}: {s * 1e3:.2f} ms per scan of {count} processes")
    figures = " ".join(f"{k}_us_per_process={v:.1f}" for k, v in per_process.items())
    print(f"processes={count} {figures}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
