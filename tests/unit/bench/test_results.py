"""Pooling the clients' figures into a layout's figures."""

from __future__ import annotations

import numpy as np
import pytest

from vsup.bench.results import percentile, pool


@pytest.mark.parametrize("p", [0, 1, 50, 90, 99, 100])
@pytest.mark.parametrize("values", [[3.0], [1.0, 2.0], [5, 1, 4, 2, 3, 9, 0.5]])
def test_percentile_is_numpys_linear_one(values, p):
    assert percentile(values, p) == pytest.approx(float(np.percentile(values, p)))


def test_percentile_of_nothing_is_unknown():
    assert percentile([], 50) is None


def detailed(ttfts, latencies, output_lens, duration, errors=None, failed=0):
    return {
        "duration": duration,
        "completed": sum(1 for n in output_lens if n),
        "failed": failed,
        "total_input_tokens": 32 * len(ttfts),
        "total_output_tokens": sum(output_lens),
        "ttfts": ttfts,
        "latencies": latencies,
        "output_lens": output_lens,
        "errors": errors or [""] * len(ttfts),
    }


def test_two_clients_pool_over_all_requests_and_the_longest_duration():
    a = detailed([0.1, 0.2], [1.1, 1.2], [11, 11], duration=2.0)
    b = detailed([0.3, 0.4], [1.3, 2.4], [11, 21], duration=4.0)
    t = pool([a, b], [2, 2])
    assert (t["completed"], t["failed"], t["prompts"]) == (4, 0, 4)
    assert t["output_tokens"] == 54 and t["duration_s"] == 4.0
    assert t["output_throughput"] == pytest.approx(54 / 4.0)
    assert t["request_throughput"] == pytest.approx(1.0)
    assert t["ttft_ms"]["p50"] == pytest.approx(250.0)
    assert t["ttft_ms"]["p99"] == pytest.approx(float(np.percentile([100, 200, 300, 400], 99)))
    # TPOT as vLLM's client defines it: (latency - ttft) / (output tokens - 1)
    tpots = [(1.0) / 10, (1.0) / 10, (1.0) / 10, (2.0) / 20]
    assert t["tpot_ms"]["p50"] == pytest.approx(float(np.percentile(tpots, 50)) * 1000)


def test_one_client_matches_its_own_median():
    a = detailed([0.1, 0.5, 0.2], [1.0, 2.0, 1.5], [16, 16, 16], duration=2.0)
    t = pool([a], [3])
    assert t["ttft_ms"]["p50"] == pytest.approx(200.0)


def test_failed_requests_are_left_out_of_latencies_and_a_silent_client_counts_as_failed():
    a = detailed([0.1, 0.0], [1.0, 0.0], [16, 0], duration=2.0, errors=["", "boom"], failed=1)
    t = pool([a, None], [2, 5])
    assert t["completed"] == 1 and t["failed"] == 1 + 5
    assert t["ttft_ms"]["p50"] == pytest.approx(100.0)


def test_no_result_at_all_gives_unknown_figures_not_zeros():
    t = pool([None], [4])
    assert t["completed"] == 0 and t["failed"] == 4
    assert t["output_throughput"] is None and t["ttft_ms"]["p50"] is None


def test_a_client_without_latencies_gets_them_from_ttft_and_inter_token_gaps():
    """vLLM 0.26's detailed result (seen on the H200) has `itls` but no `latencies`."""
    a = detailed([0.1, 0.2], [1.1, 1.2], [11, 11], duration=2.0)
    del a["latencies"]
    a["itls"] = [[0.1] * 10, [0.1] * 10]
    t = pool([a], [2])
    assert t["ttft_ms"]["p50"] == pytest.approx(150.0)
    assert t["e2el_ms"]["p50"] == pytest.approx(1150.0)
    assert t["tpot_ms"]["p50"] == pytest.approx(100.0)
