"""Check the NVML health reader against nvidia-smi on a real NVIDIA node, and time it.

    python benchmarks/gpu_health_check.py [--rounds 200]

Prints, per GPU, vsup's `health` object (as in `vsup status --json`) beside nvidia-smi's
figures for the same things, then the cost: one probe snapshot with and without health, and
each health call on GPU 0 alone. Exits 1 when a figure both give differs (clocks and power move
between the two reads, so they are shown, not compared), or when XID events could not be
registered (xid_count null): vsup then sees no XIDs on this node.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT / "supervisor") not in sys.path:
    sys.path.insert(0, str(ROOT / "supervisor"))

# health key -> nvidia-smi --query-gpu field; compared exactly when both give a value
COMPARED = {
    "ecc_volatile_corrected": "ecc.errors.corrected.volatile.total",
    "ecc_volatile_uncorrected": "ecc.errors.uncorrected.volatile.total",
    "ecc_aggregate_corrected": "ecc.errors.corrected.aggregate.total",
    "ecc_aggregate_uncorrected": "ecc.errors.uncorrected.aggregate.total",
    "rows_remapped_correctable": "remapped_rows.correctable",
    "rows_remapped_uncorrectable": "remapped_rows.uncorrectable",
    "sm_clock_max_mhz": "clocks.max.sm",
    "mem_clock_max_mhz": "clocks.max.mem",
    "power_limit_w": "enforced.power.limit",
}
SHOWN = {
    "sm_clock_mhz": "clocks.sm",
    "mem_clock_mhz": "clocks.mem",
    "throttle_reasons": "clocks_event_reasons.active",
    "row_remap_pending": "remapped_rows.pending",
    "row_remap_failed": "remapped_rows.failure",
    "retired_pages_pending": "retired_pages.pending",
}


def smi_field(index: int, field: str) -> str | None:
    """One nvidia-smi field (asked alone: an unknown field fails the whole query)."""
    out = subprocess.run(
        ["nvidia-smi", "-i", str(index), f"--query-gpu={field}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    text = out.stdout.strip()
    if out.returncode or not text or text.startswith("[") or "Not Supported" in text:
        return None
    return text


def same(ours: object, theirs: str) -> bool:
    try:
        return abs(float(ours) - float(theirs)) < 0.5  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return str(ours) == theirs


def timed(fn, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    from vsup.telemetry.gpu.nvml import NvmlProbe

    probe = NvmlProbe()
    bad = 0
    try:
        samples = probe.snapshot()
        for g in samples:
            h = g.health
            doc = None if h is None else dataclasses.asdict(h)
            print(f"GPU {g.index} {g.name}: health = {json.dumps(doc, indent=1)}")
            if doc is None:
                bad += 1
                continue
            if doc["xid_count"] is None:
                print(f"  ! XID events could not be registered on GPU {g.index}")
                bad += 1
            if not shutil.which("nvidia-smi"):
                continue
            for key, field in {**COMPARED, **SHOWN}.items():
                theirs = smi_field(g.index, field)
                verdict = ""
                if key in COMPARED and theirs is not None and doc[key] is not None:
                    verdict = "ok" if same(doc[key], theirs) else "DIFFERS"
                    bad += verdict == "DIFFERS"
                print(f"  {key:28} vsup={doc[key]!s:24} nvidia-smi {field}={theirs} {verdict}")
        n = len(samples)
        with_health = timed(probe.snapshot, args.rounds)
        health = probe._health
        probe._health = type("NoHealth", (), {"read": lambda self, i, h: None})()
        without = timed(probe.snapshot, args.rounds)
        probe._health = health
        print(f"snapshot of {n} GPUs: {with_health:.0f} us with health, {without:.0f} us without")
        handle = probe._handles[0]
        nv = probe._nv
        calls = {
            "throttle": lambda: nv.nvmlDeviceGetCurrentClocksEventReasons(handle),
            "clock sm": lambda: nv.nvmlDeviceGetClockInfo(handle, nv.NVML_CLOCK_SM),
            "ecc total": lambda: nv.nvmlDeviceGetTotalEccErrors(
                handle, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC
            ),
            "remapped rows": lambda: nv.nvmlDeviceGetRemappedRows(handle),
            "power limit": lambda: nv.nvmlDeviceGetEnforcedPowerLimit(handle),
            "slow read (all)": lambda: health._read_slow(0, handle),
            "xid drain": lambda: health._read_xids(0, handle),
        }
        for name, fn in calls.items():
            try:
                print(f"  {name:16} {timed(fn, args.rounds):8.1f} us")
            except nv.NVMLError as exc:
                print(f"  {name:16} {exc}")
    finally:
        probe.close()
    print(f"result: {'ok' if not bad else f'{bad} problem(s)'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
