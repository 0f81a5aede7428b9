"""Counter rates over a window, across counter resets, with an injected clock; the history."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from vsup.telemetry.metrics import VllmMetrics, parse_metrics
from vsup.telemetry.rates import CounterRate, History, InstanceRates

from tests.support.clock import FakeClock

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "vllm-0.32-cpu"


def test_steady_counter_gives_its_rate() -> None:
    c = CounterRate(window_s=10)
    for t in range(0, 6):
        c.update(float(t), 100.0 + 10 * t)
    assert c.rate() == pytest.approx(10.0)


def test_one_reading_is_not_a_rate() -> None:
    c = CounterRate(window_s=10)
    c.update(0.0, 5.0)
    assert c.rate() is None


def test_rate_covers_only_the_window() -> None:
    c = CounterRate(window_s=10)
    value = 0.0
    for t in range(0, 21):  # 10/s for 20 s
        c.update(float(t), value)
        value += 10
    value -= 10
    for t in range(21, 26):  # then idle for 5 s
        c.update(float(t), value)
    # window (15, 25]: 5 s at 10/s then 5 s idle
    assert c.rate() == pytest.approx(5.0)


def test_a_counter_that_drops_restarted_and_its_new_value_is_increase() -> None:
    c = CounterRate(window_s=100)
    for t, v in [(0, 100), (1, 110), (2, 120), (3, 5), (4, 15)]:
        c.update(float(t), float(v))
    # increases 10 + 10 + 5 (since the reset) + 10 over 4 s
    assert c.rate() == pytest.approx(35 / 4)


def test_a_reset_the_values_cannot_show_is_taken_from_the_caller() -> None:
    c = CounterRate(window_s=100)
    c.update(0.0, 100.0)
    c.update(1.0, 150.0, reset=True)  # a new server already past the old count
    assert c.rate() == pytest.approx(150.0)


def test_missing_and_non_finite_readings_are_skipped() -> None:
    c = CounterRate(window_s=100)
    c.update(0.0, 0.0)
    c.update(1.0, None)
    c.update(2.0, math.nan)
    c.update(3.0, math.inf)
    c.update(4.0, 40.0)
    assert c.rate() == pytest.approx(10.0)


def test_readings_out_of_order_are_ignored() -> None:
    c = CounterRate(window_s=100)
    c.update(5.0, 50.0)
    c.update(4.0, 0.0)
    c.update(6.0, 60.0)
    assert c.rate() == pytest.approx(10.0)


def test_a_counter_no_longer_read_has_no_rate() -> None:
    c = CounterRate(window_s=10)
    c.update(0.0, 0.0)
    c.update(1.0, 10.0)
    assert c.rate(now=5.0) == pytest.approx(10.0)
    assert c.rate(now=12.0) is None


def _m(
    gen: float,
    prompt: float = 0,
    preempt: float = 0,
    queries: float | None = None,
    hits: float | None = None,
    start: float | None = 1000.0,
) -> VllmMetrics:
    return VllmMetrics(
        generation_tokens_total=gen,
        prompt_tokens_total=prompt,
        preemptions_total=preempt,
        prefix_cache_queries_total=queries,
        prefix_cache_hits_total=hits,
        process_start_time_s=start,
    )


def test_instance_rates_from_an_injected_clock() -> None:
    clock = FakeClock()
    rates = InstanceRates(clock)
    assert rates.observe(_m(0)).generation_tokens_per_s is None
    clock.advance(2)
    r = rates.observe(_m(gen=200, prompt=50, preempt=1, queries=100, hits=25))
    assert r.generation_tokens_per_s == pytest.approx(100.0)
    assert r.prompt_tokens_per_s == pytest.approx(25.0)
    assert r.preemptions_per_min == pytest.approx(30.0)


def test_prefix_hit_rate_is_windowed_with_the_since_start_ratio_as_fallback() -> None:
    clock = FakeClock()
    rates = InstanceRates(clock)
    r = rates.observe(_m(0, queries=100, hits=90))
    assert r.prefix_cache_hit_rate == pytest.approx(0.9)  # one reading: since start
    clock.advance(1)
    r = rates.observe(_m(0, queries=200, hits=100))
    assert r.prefix_cache_hit_rate == pytest.approx(0.1)  # 10 hits of 100 queries lately


def test_a_new_process_start_time_marks_a_reset() -> None:
    clock = FakeClock()
    rates = InstanceRates(clock, tokens_window_s=100)
    rates.observe(_m(gen=1000, start=1000.0))
    clock.advance(10)
    r = rates.observe(_m(gen=1500, start=2000.0))  # restarted and already at 1500
    assert r.generation_tokens_per_s == pytest.approx(150.0)


def test_a_new_run_number_marks_a_reset() -> None:
    clock = FakeClock()
    rates = InstanceRates(clock, tokens_window_s=100)
    rates.observe(_m(gen=1000, start=None), run=1)
    clock.advance(10)
    r = rates.observe(_m(gen=1500, start=None), run=2)
    assert r.generation_tokens_per_s == pytest.approx(150.0)


def test_rates_from_two_real_scrapes_of_a_preempting_server() -> None:
    first = parse_metrics((FIX / "metrics_load.txt").read_text())
    text = (FIX / "metrics_load_next.txt").read_text()
    dt = float(text.splitlines()[0].split()[-1])  # `# scraped_after_s 1.351`
    second = parse_metrics(text)
    clock = FakeClock()
    rates = InstanceRates(clock)
    rates.observe(first)
    clock.advance(dt)
    r = rates.observe(second)
    assert second.preemptions_total is not None and first.preemptions_total is not None
    assert second.generation_tokens_total is not None and first.generation_tokens_total is not None
    assert r.preemptions_per_min == pytest.approx(
        (second.preemptions_total - first.preemptions_total) / dt * 60
    )
    assert r.preemptions_per_min is not None
    assert r.preemptions_per_min > 0
    assert r.generation_tokens_per_s == pytest.approx(
        (second.generation_tokens_total - first.generation_tokens_total) / dt
    )


def test_clear_forgets_everything() -> None:
    clock = FakeClock()
    rates = InstanceRates(clock)
    rates.observe(_m(0))
    clock.advance(1)
    rates.observe(_m(10))
    rates.clear()
    clock.advance(1)
    assert rates.observe(_m(20)).generation_tokens_per_s is None


def test_history_keeps_the_last_span_in_order_and_serves_parallel_lists() -> None:
    h = History(span_s=600)
    for t in range(0, 1000, 10):
        h.append(float(t), t / 1000, float(t), 0.0)
    h.append(500.0, 0.1, 0.1, 0.1)  # the wall clock stepped back: dropped
    doc = h.to_json()
    assert doc["t"][0] == 390.0 and doc["t"][-1] == 990.0
    assert doc["t"] == sorted(doc["t"])  # type: ignore[type-var]  # the time column holds no None
    assert set(doc) == {"t", "kv_cache_usage", "generation_tokens_per_s", "preemptions_per_min"}
    assert len({len(v) for v in doc.values()}) == 1


def test_history_is_bounded_by_count_too() -> None:
    h = History(span_s=600, max_points=50)
    for i in range(1000):
        h.append(i * 0.01, None, None, None)
    assert len(h) == 50
    assert h.points()[-1].t == pytest.approx(9.99)


def test_history_keeps_unknowns_as_none() -> None:
    h = History()
    h.append(1.0, None, 2.0, None)
    assert h.to_json() == {
        "t": [1.0],
        "kv_cache_usage": [None],
        "generation_tokens_per_s": [2.0],
        "preemptions_per_min": [None],
    }


def test_history_kv_peak_is_the_maximum_within_the_window_and_skips_gaps():
    from vsup.telemetry.rates import History

    h = History(span_s=600)
    assert h.kv_peak(60) is None
    h.append(100.0, 0.9, None, None)
    h.append(150.0, None, None, None)
    h.append(170.0, 0.3, None, None)
    h.append(200.0, 0.5, None, None)
    assert h.kv_peak(60) == 0.5  # the 0.9 at t=100 is older than a minute before t=200
    assert h.kv_peak(120) == 0.9
