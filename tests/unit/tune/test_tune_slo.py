"""The SLO text, its errors, and goodput against it."""

from __future__ import annotations

import pytest

from vsup.tune.slo import RequestTimes, SloError, judge, parse_slo, request_times, stat


def test_parses_terms_with_units():
    slo = parse_slo("ttft_p99<=2s, tpot_p99<=100ms,e2el_mean<30s")
    assert [(t.metric, t.stat, t.op, t.limit_ms) for t in slo.terms] == [
        ("ttft", "p99", "<=", 2000.0),
        ("tpot", "p99", "<=", 100.0),
        ("e2el", "mean", "<", 30000.0),
    ]
    assert slo.text == "ttft_p99<=2s,tpot_p99<=100ms,e2el_mean<30s"
    assert parse_slo("TTFT_P99.9<=250MS").terms[0].stat == "p99.9"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("ttft_p99<=2", "needs a unit: 2s or 2ms"),
        ("ttft_p99<=2min", "unknown unit 'min'"),
        ("latency_p99<=2s", "unknown metric 'latency'"),
        ("ttft_p100<=2s", "between p0 and p100"),
        ("ttft<=2s", "write METRIC_STAT<=VALUE UNIT"),
        ("ttft_p99>=2s", "write METRIC_STAT<=VALUE UNIT"),
        ("ttft_p99<=0s", "above 0"),
        ("ttft_p99<=1s,ttft_p99<=2s", "given twice"),
        ("ttft_p99<=1s,", "separated by commas"),
        ("", "separated by commas"),
    ],
)
def test_bad_terms_say_what_to_write(text, says):
    with pytest.raises(SloError, match=says.replace("(", r"\(").replace(")", r"\)")):
        parse_slo(text)


def test_request_times_from_the_bench_records():
    (t,) = request_times([{"ttft": 0.2, "latency": 1.2, "output_len": 11}])
    assert t.ttft == pytest.approx(200) and t.tpot == pytest.approx(100) and t.e2el == 1200
    (one,) = request_times([{"ttft": 0.2, "latency": 0.2, "output_len": 1}])
    assert one.tpot is None


def test_goodput_counts_the_requests_under_every_threshold():
    slo = parse_slo("ttft_p50<=1s,tpot_p99<=50ms")
    times = [
        RequestTimes(ttft=100, tpot=10, e2el=500),
        RequestTimes(ttft=900, tpot=60, e2el=1500),  # tpot too slow: not good
        RequestTimes(ttft=1500, tpot=10, e2el=2000),  # ttft too slow: not good
        RequestTimes(ttft=200, tpot=20, e2el=700),
    ]
    v = judge(slo, times, failed=0, duration_s=2.0)
    assert v.good_requests == 2 and v.goodput == 1.0 and v.attainment == 0.5
    # p50 of TTFT is 550 ms (holds); p99 of TPOT is ~59.7 ms (does not)
    assert [t["holds"] for t in v.terms] == [True, False] and not v.met
    assert stat(times, "ttft", "p50") == pytest.approx(550)
    assert stat(times, "tpot", "mean") == pytest.approx(25)


def test_failed_requests_break_the_slo_and_are_never_good():
    slo = parse_slo("ttft_p99<=1s")
    times = [RequestTimes(ttft=100, tpot=10, e2el=500)] * 3
    assert judge(slo, times, failed=0, duration_s=1.0).met
    v = judge(slo, times, failed=1, duration_s=1.0)
    assert not v.met and v.good_requests == 3 and v.attainment == 0.75


def test_no_requests_meet_nothing_and_no_slo_counts_every_completed_one():
    assert not judge(parse_slo("ttft_p99<=1s"), [], failed=4, duration_s=1.0).met
    v = judge(None, [RequestTimes(1, 1, 1)] * 4, failed=0, duration_s=2.0)
    assert v.met and v.goodput == 2.0 and v.terms == ()
