"""The clients' figures pooled per layout.

Each client saves its run with `--save-detailed` (per-request TTFT, latency, output length), so
a layout's percentiles are computed over all its requests together, the way vLLM's client
computes them for one server (TPOT = (latency - TTFT) / (output tokens - 1), numpy's linear
percentile). Throughput is the layout's tokens over the longest client's duration: the clients
start together, so that is the run's wall time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

# What the JSON keeps of each client's own summary (the per-request lists are pooled instead).
CLIENT_KEYS = (
    "duration",
    "completed",
    "failed",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    "max_output_tokens_per_s",
    "max_concurrent_requests",
    "median_ttft_ms",
    "p99_ttft_ms",
    "median_tpot_ms",
    "p99_tpot_ms",
    "median_itl_ms",
    "p99_itl_ms",
    "median_e2el_ms",
    "p99_e2el_ms",
)


def percentile(values: Sequence[float], p: float) -> float | None:
    """numpy.percentile's default (linear) method; None for no values."""
    xs = sorted(values)
    if not xs:
        return None
    rank = (len(xs) - 1) * p / 100.0
    lo = math.floor(rank)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (rank - lo)


def client_summary(result: dict[str, Any]) -> dict[str, Any]:
    """The client's own headline figures (its JSON less the per-request lists)."""
    return {k: result.get(k) for k in CLIENT_KEYS if k in result}


def _requests(result: dict[str, Any]) -> list[dict[str, float]]:
    """One record per successful request of a detailed client result."""
    out = []
    ttfts = result.get("ttfts") or []
    lat = result.get("latencies") or []
    if not lat and result.get("itls"):
        # vLLM 0.26's client saves no `latencies`; a request's latency is its time to the first
        # token plus its inter-token gaps (what later clients store as `latencies`)
        lat = [t + sum(gaps or ()) for t, gaps in zip(ttfts, result["itls"], strict=False)]
    lens = result.get("output_lens") or []
    errors = result.get("errors") or [""] * len(ttfts)
    for i in range(min(len(ttfts), len(lat), len(lens))):
        if lens[i] and not (i < len(errors) and errors[i]):
            out.append({"ttft": ttfts[i], "latency": lat[i], "output_len": lens[i]})
    return out


def _stats_ms(values: Sequence[float]) -> dict[str, float | None]:
    p50, p99 = percentile(values, 50), percentile(values, 99)  # None for no values
    return {
        "mean": sum(values) / len(values) * 1000 if values else None,
        "p50": None if p50 is None else p50 * 1000,
        "p99": None if p99 is None else p99 * 1000,
    }


def pool(results: Sequence[dict[str, Any] | None], prompts: Sequence[int]) -> dict[str, Any]:
    """A layout's figures from its clients' results (None for a client that saved nothing;
    its prompts count as failed requests)."""
    got = [r for r in results if r]
    completed = sum(int(r.get("completed") or 0) for r in got)
    failed = sum(int(r.get("failed") or 0) for r in got)
    failed += sum(n for r, n in zip(results, prompts, strict=True) if not r)
    input_tokens = sum(int(r.get("total_input_tokens") or 0) for r in got)
    output_tokens = sum(int(r.get("total_output_tokens") or 0) for r in got)
    duration = max((float(r.get("duration") or 0.0) for r in got), default=0.0)
    reqs = [q for r in got for q in _requests(r)]
    ttft = [q["ttft"] for q in reqs]
    tpot = [(q["latency"] - q["ttft"]) / (q["output_len"] - 1) for q in reqs if q["output_len"] > 1]
    e2el = [q["latency"] for q in reqs]

    def rate(x: float) -> float | None:
        return x / duration if duration > 0 else None

    return {
        "prompts": sum(prompts),
        "completed": completed,
        "failed": failed,
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "duration_s": duration or None,
        "request_throughput": rate(completed),
        "output_throughput": rate(output_tokens),
        "total_token_throughput": rate(input_tokens + output_tokens),
        "ttft_ms": _stats_ms(ttft),
        "tpot_ms": _stats_ms(tpot),
        "e2el_ms": _stats_ms(e2el),
    }
