"""The canary's latency rules at small samples (engine/canary.py, docs/canary.md "Noise"): a
latency over the ratio fails the canary only when the requests behind it are enough evidence
(a one-sided exact test at the histogram bounds between the two quantiles); the latencies of
the canary's warm-up are not compared (canarywatch.py reads every server at its end). Series
built with vLLM 0.32's bucket bounds, as in test_canary_gate.py; failures, restarts and stalls
are judged as before."""

from __future__ import annotations

import math

import pytest

from vsup.engine.canary import (
    Decision,
    Histogram,
    Reading,
    Window,
    decide,
    evidence,
    fisher_greater,
)
from vsup.engine.canarywatch import _verdict
from vsup.layout.spec import CanarySettings

from tests.unit.engine.test_canary_gate import ITL_BOUNDS, TTFT_BOUNDS, hist, window

# the layout of tests/integration/router/test_router_vsup.py's neutral change, less its floor
CI_GATE = CanarySettings(watch_s=12, min_requests=5)
GATE = CanarySettings(watch_s=60)


def ci_case() -> tuple[Window, Window]:
    """CI 2026-12-06, 2 shared cores: a neutral change's canary at "p50 TTFT 3.0x the others
    (295 ms vs 100 ms over 12 s, 19 vs 21 requests)", both sides widely spread."""
    itl = window(19, 100, 20, seconds=12).itl
    canary = hist(TTFT_BOUNDS, [0.09] * 2 + [0.2] * 6 + [0.3] * 8 + [0.6] * 3)
    others = hist(TTFT_BOUNDS, [0.07] * 6 + [0.09] * 5 + [0.2] * 5 + [0.3] * 4 + [0.6])
    return Window(12, 19, 0, canary, itl), Window(12, 21, 0, others, itl)


def test_the_ci_case_is_not_enough_evidence_rather_than_a_failure():
    canary, others = ci_case()
    v = decide("r0", canary, {"r1": others}, CI_GATE)
    assert v.decision == Decision.INSUFFICIENT, v.reason
    assert v.reason == (
        "canary r0: not enough evidence (p50 TTFT 3.0x the others (297 ms vs 98 ms over 12 s, "
        "19 vs 21 requests), but 89% of its requests over 100 ms vs 48% at the others is "
        "98.4% sure, 99.9% needed)"
    )
    assert v.figures["p50_ttft_ms"] == [296.875, 98.0]
    # the layout may ask for less certainty: then the same figures fail it
    loose = CanarySettings(watch_s=12, min_requests=5, confidence=0.95)
    assert decide("r0", canary, {"r1": others}, loose).decision == Decision.FAIL


def test_a_clear_p99_regression_with_enough_requests_still_fails():
    # 200 vs 800 requests, p99 TTFT 3x, tight spread
    canary = window(200, 810, 20, spread=0.1)
    others = {"a": window(400, 270, 20, spread=0.1), "b": window(400, 270, 20, spread=0.1)}
    v = decide("c", canary, others, GATE)
    assert v.decision == Decision.FAIL, v.reason
    # (through vLLM's buckets, (250 ms, 500 ms] and (750 ms, 1 s], the quantiles read 2x)
    assert "p99 TTFT 2.0x" in v.reason and "200 vs 800 requests" in v.reason, v.reason
    assert v.figures["sure"]["p99_ttft_ms"] > 0.999999


def test_a_regression_of_the_tail_alone_fails_on_its_p99():
    # one request in ten at 1.2 s: p50 as the others', p99 over 4x
    ttft = hist(TTFT_BOUNDS, [0.27] * 180 + [1.2] * 20)
    canary = Window(60, 200, 0, ttft, window(200, 100, 20).itl)
    others = {"a": window(400, 270, 20, spread=0.1), "b": window(400, 270, 20, spread=0.1)}
    v = decide("c", canary, others, GATE)
    assert v.decision == Decision.FAIL, v.reason
    assert v.reason.startswith("canary c: p99 TTFT ") and "p50" not in v.reason


def test_more_requests_of_the_same_shape_turn_doubt_into_a_failure():
    # the CI case's shape kept for 10 x the requests is a real regression
    canary, others = ci_case()

    def times(w: Window, k: int) -> Window:
        ttft = Histogram(w.ttft.bounds, tuple(c * k for c in w.ttft.counts))
        itl = Histogram(w.itl.bounds, tuple(c * k for c in w.itl.counts))
        return Window(w.seconds, w.requests * k, 0, ttft, itl)

    v = decide("r0", times(canary, 10), {"r1": times(others, 10)}, CI_GATE)
    assert v.decision == Decision.FAIL, v.reason
    assert v.reason.startswith("canary r0: p50 TTFT 3.0x the others")


def test_an_itl_difference_counts_requests_not_tokens():
    # 12 requests a side of 200 tokens: 2,400 ITL observations each, but 12 requests' worth of
    # evidence (a request's tokens share its moments of contention). 3 in 4 of the canary's
    # tokens at 160 ms against 1 in 3 of the others': conclusive as 2,400 tokens, not as 12
    # requests
    ttft = hist(TTFT_BOUNDS, [0.1] * 12)
    canary = Window(12, 12, 0, ttft, hist(ITL_BOUNDS, [0.16] * 1800 + [0.06] * 600))
    others = Window(12, 12, 0, ttft, hist(ITL_BOUNDS, [0.16] * 800 + [0.06] * 1600))
    mine, theirs = canary.itl.quantile(0.5), others.itl.quantile(0.5)
    assert mine is not None and theirs is not None and mine > 2 * theirs
    proof = evidence(canary, others, "itl", mine, theirs)
    assert proof is not None and (proof.n_mine, proof.n_theirs) == (12, 12)
    assert (proof.mine, proof.theirs) == (9, 4) and proof.sure < 0.9
    v = decide("c", canary, {"o": others}, CanarySettings(watch_s=12, min_requests=5))
    assert v.decision == Decision.INSUFFICIENT and "p50 ITL 2.4x" in v.reason, v.reason


def test_both_quantiles_in_one_bucket_is_no_evidence():
    # 1.05 s vs 2.4 s are both in (1, 2.5]: the ratio is the interpolation's
    canary = Window(60, 300, 0, hist(TTFT_BOUNDS, [2.4] * 300), window(300, 100, 20).itl)
    others = Window(60, 300, 0, hist(TTFT_BOUNDS, [2.4] * 150 + [1.05] * 150),
                    window(300, 100, 20).itl)  # fmt: skip
    mine, theirs = canary.ttft.quantile(0.5), others.ttft.quantile(0.5)
    assert mine is not None and theirs is not None
    proof = evidence(canary, others, "ttft", mine, theirs)
    assert proof is not None and proof.bound == 1.0  # the others' bucket's lower bound
    assert proof.mine == 300 and proof.theirs == 300  # every request of both above 1 s


def test_failures_restarts_and_stalls_are_judged_as_before_at_any_count():
    canary, others = ci_case()
    failing = Window(12, 19, 6, canary.ttft, canary.itl)
    v = decide("r0", failing, {"r1": others}, CI_GATE)
    assert v.decision == Decision.FAIL and v.reason.startswith("canary r0: 6 of 19 requests failed")
    restarted = Window(12, 19, 0, canary.ttft, canary.itl, restarted=True)
    assert decide("r0", restarted, {"r1": others}, CI_GATE).decision == Decision.FAIL
    stalled = decide("r0", canary, {"r1": others}, CI_GATE, stalls=1)
    assert stalled.decision == Decision.FAIL and "stalled" in stalled.reason


def test_fisher_exact_test_against_known_values():
    # brute force over the hypergeometric tail (scipy.stats.fisher_exact, 'greater')
    assert fisher_greater(11, 19, 4, 21) == pytest.approx(0.0130594, rel=1e-5)
    assert fisher_greater(8, 19, 0, 21) == pytest.approx(0.000982801, rel=1e-5)
    assert fisher_greater(4, 21, 11, 19) == 1.0  # not greater: no evidence
    assert fisher_greater(0, 10, 0, 10) == 1.0
    # a million requests: the normal approximation's figure (the tail is summed only until
    # its terms vanish)
    assert fisher_greater(57_800, 200_000, 230_000, 800_000) == pytest.approx(0.0925, rel=0.02)
    assert fisher_greater(200_000, 200_000, 0, 800_000) == 0.0


# -- the warm-up: the canary's first requests are not compared

START = 1_000.0


def reading(ttft: list[float], finished: float, errored: float = 0.0) -> Reading:
    itl = [0.02] * (10 * len(ttft))
    return Reading(
        ttft=hist(TTFT_BOUNDS, ttft),
        itl=hist(ITL_BOUNDS, itl),
        finished=finished,
        errored=errored,
        start_time=START,
    )


def test_a_fresh_servers_slow_first_requests_are_not_compared_after_the_warm_up():
    # the canary's first 40 requests (its warm-up: compilation, caches) at 3 s; then both
    # sides alike at 100 ms, 300 requests each
    before = {"c": reading([], 0), "o": reading([], 0)}
    warm = {"c": reading([3.0] * 40, 40), "o": reading([0.1] * 40, 40)}
    after = {
        "c": reading([3.0] * 40 + [0.1] * 300, 340),
        "o": reading([0.1] * 340, 340),
    }
    measured = _verdict(("c",), before, after, 60, GATE, warm, 6.0)
    assert measured.decision == Decision.PASS, measured.reason
    assert measured.figures["requests"] == [340, 340]  # requests and failures: the whole window
    assert measured.figures["warmup_s"] == 6.0
    assert measured.figures["p99_ttft_ms"][0] < 250
    # the same series measured from the start: the warm-up's requests fail it
    unwarmed = _verdict(("c",), before, after, 60, GATE)
    assert unwarmed.decision == Decision.FAIL and "p99 TTFT" in unwarmed.reason


def test_failures_during_the_warm_up_still_count():
    before = {"c": reading([], 0), "o": reading([], 0)}
    warm = {"c": reading([0.1] * 40, 40, errored=8), "o": reading([0.1] * 40, 40)}
    after = {"c": reading([0.1] * 340, 340, errored=8), "o": reading([0.1] * 340, 340)}
    v = _verdict(("c",), before, after, 60, GATE, warm, 6.0)
    assert v.decision == Decision.FAIL and v.reason.startswith("canary c: 8 of 340 requests")


def test_a_server_that_restarted_after_the_warm_up_is_measured_from_its_new_start():
    warm = reading([3.0] * 40, 40)
    after = Reading(ttft=hist(TTFT_BOUNDS, [0.1] * 5), finished=5, start_time=START + 30)
    w = Window.between(reading([], 0), after, 60, latency_from=warm)
    assert w.restarted and w.ttft.count == 5


def test_the_warm_up_by_default_is_a_tenth_of_the_watch_within_3_s_and_a_quarter():
    assert CanarySettings(watch_s=600).warmup == 60
    assert CanarySettings(watch_s=12).warmup == 3
    assert CanarySettings(watch_s=4).warmup == 1
    assert CanarySettings(watch_s=0.3).warmup == pytest.approx(0.075)
    assert CanarySettings(watch_s=600, warmup_s=0).warmup == 0
    assert math.isclose(CanarySettings(watch_s=60, warmup_s=20).warmup, 20)


def _itl_window(requests: int, slow_share: float, slow_ms: float, fast_ms: float) -> Window:
    """`requests` with 60 tokens each; `slow_share` of the tokens at `slow_ms`, the rest at
    `fast_ms`; every first token at 15 ms."""
    tokens = 60 * requests
    slow = round(tokens * slow_share)
    itl = hist(ITL_BOUNDS, [slow_ms / 1000] * slow + [fast_ms / 1000] * (tokens - slow))
    ttft = hist(TTFT_BOUNDS, [0.015] * requests)
    return Window(45, requests, 0, ttft, itl)


def test_a_gpu_s_itl_regression_under_ttft_s_floor_fails_on_itl():
    # the H100's enforce-eager canary (docs/gpu-runs/2026-12-06-h100-canary): ITL p99 about
    # 2.5x the others' but under 20 ms apart; ITL's floor is a quarter of TTFT's (5 ms)
    canary = _itl_window(865, 0.05, 20.0, 6.0)
    others = {"b": _itl_window(887, 0.005, 15.0, 5.0)}
    v = decide("a", canary, others, CanarySettings(watch_s=45))
    assert v.decision == Decision.FAIL, v.reason
    assert v.reason.startswith("canary a: p99 ITL "), v.reason
    mine, theirs = v.figures["p99_itl_ms"]
    assert 5 < mine - theirs < 20 and mine / theirs > 2
    # the same figures where the floor is set higher by the layout pass as before
    lenient = CanarySettings(watch_s=45, min_delta_ms=80)
    assert decide("a", canary, others, lenient).decision == Decision.PASS
