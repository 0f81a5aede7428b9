"""How long vsup takes to read a vLLM /metrics payload, against a full prometheus_client parse.

    python -m benchmarks.metrics_parse [PAYLOAD ...] [--iterations N]

Payloads default to the ones captured from the real CPU vLLM 0.32 (tests/fixtures/vllm-0.32-cpu:
idle ~52 KB, under load ~62 KB). For each: the median over N runs of `parse_metrics` (filter the
needed lines, parse those) and of `text_string_to_metric_families` over the whole payload (what
a straightforward reader does), after a warm-up. The last line gives the payload with the
slowest fast parse (the worst case): `parse_ms=.. baseline_ms=.. ratio=..`. Targets:
parse_ms <= 0.3, ratio >= 20.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from vsup.telemetry.metrics import parse_metrics  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "vllm-0.32-cpu"
DEFAULT = ("metrics_idle.txt", "metrics_load.txt")


def median_ms(fn: Callable[..., object], iterations: int) -> float:
    # Warm up for a fixed time, not a count: the first few hundred runs pay for cold caches
    # and the CPU clocking up.
    until = time.perf_counter() + 0.3
    while time.perf_counter() < until:
        fn()
    samples = []
    gc.disable()
    try:
        for _ in range(iterations):
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
    finally:
        gc.enable()
    return statistics.median(samples) * 1e3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("payloads", nargs="*", type=Path)
    ap.add_argument("--iterations", type=int, default=2000)
    args = ap.parse_args(argv)
    paths = args.payloads or [FIXTURES / name for name in DEFAULT]
    results = []
    for path in paths:
        text = path.read_text()
        fast = median_ms(lambda text=text: parse_metrics(text), args.iterations)
        full = median_ms(
            lambda text=text: list(text_string_to_metric_families(text)),
            max(50, args.iterations // 20),
        )
        m = parse_metrics(text)
        print(
            f"{path.name}: {len(text)} bytes, fast {fast:.4f} ms, full {full:.3f} ms, "
            f"x{full / fast:.0f} (kv={m.kv_cache_usage} preemptions={m.preemptions_total})"
        )
        results.append((fast, full))
    fast, full = max(results)
    print(f"parse_ms={fast:.4f} baseline_ms={full:.3f} ratio={full / fast:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
