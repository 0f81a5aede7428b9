"""How long vsup takes to read a vLLM /metrics payload, against a full prometheus_client parse.

    python -m benchmarks.metrics_parse [PAYLOAD ...] [--iterations N] [--filtered]

Payloads default to the ones captured from the real CPU vLLM 0.32 (tests/fixtures/vllm-0.32-cpu:
idle ~52 KB, under load ~62 KB). For each: the median over N runs of `parse_metrics` (filter the
needed lines, parse those) and of `text_string_to_metric_families` over the whole payload (what
a straightforward reader does), after a warm-up. The last line gives the payload with the
slowest fast parse (the worst case): `parse_ms=.. baseline_ms=.. ratio=..`. Targets:
parse_ms <= 0.3, ratio >= 20.

`--filtered`: what the daemon parses each second per instance, the ~4 KB filtered page
(`/metrics/?name[]=...`, tests/fixtures/filtered: the emulator's and real vLLM 0.32's). Each
payload is parsed as a server's pages come: the same shape, 64 pages whose counters (`_total`
values) move by one each, in turn; `fast` is the median of a page's parse (a page of a known
shape: docs/benchmarks.md). The payloads default to the two filtered fixtures.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import re
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
FILTERED = ROOT / "tests" / "fixtures" / "filtered"
FILTERED_DEFAULT = ("metrics_emulator.txt", "metrics_vllm032_load.txt")
# a counter's sample line: its head, and its value
_COUNTER = re.compile(r"^(vllm:[a-z_:]+_total(?:\{.*\})?) (\S+)$", re.M)


def moving(text: str, pages: int = 64) -> list[str]:
    """`pages` pages of `text`'s shape, each counter one further than on the page before."""

    def page(k: int) -> str:
        return _COUNTER.sub(lambda m: f"{m.group(1)} {float(m.group(2)) + k}", text)

    return [page(k) for k in range(pages)]


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
    ap.add_argument(
        "--filtered",
        action="store_true",
        help="the filtered pages, parsed as one server's come: counters moving",
    )
    args = ap.parse_args(argv)
    if args.filtered:
        default = [FILTERED / name for name in FILTERED_DEFAULT]
    else:
        default = [FIXTURES / name for name in DEFAULT]
    paths = args.payloads or default
    results = []
    for path in paths:
        text = path.read_text()
        if args.filtered:
            pages = itertools.cycle(moving(text))
            fast = median_ms(lambda pages=pages: parse_metrics(next(pages)), args.iterations)
        else:
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
