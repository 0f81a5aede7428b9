"""The rates an instance answers between two readings (kept from the last answer, telemetry/
rates.py) are the rates worked out afresh: the same until a window runs out, None after."""

from __future__ import annotations

from vsup.telemetry.metrics import VllmMetrics
from vsup.telemetry.rates import History, InstanceRates, Rates

from tests.support.clock import FakeClock


def fresh(readings: list[tuple[float, VllmMetrics]], now: float) -> Rates:
    """The rates of a new InstanceRates fed `readings`, asked once at `now`."""
    rates = InstanceRates(FakeClock())
    for t, m in readings:
        rates.observe(m, run=1, t=t)
    return rates.rates(now)


def test_rates_asked_again_and_again_match_a_fresh_answer_through_the_windows_ends() -> None:
    clock = FakeClock(start=0.0)
    rates = InstanceRates(clock)
    readings: list[tuple[float, VllmMetrics]] = []
    for i in range(5):
        # tokens every second; preemptions (a 60 s window) only in the first two
        m = VllmMetrics(
            generation_tokens_total=100.0 * i,
            prompt_tokens_total=10.0 * i,
            preemptions_total=float(i) if i < 2 else None,
        )
        readings.append((clock.monotonic(), m))
        rates.observe(m, run=1)
        clock.advance(1.0)
    asked = []
    for step in (0.0, 0.5, 6.0, 0.0, 0.5, 2.5, 50.0, 0.0):  # past 10 s, then past 60 s
        clock.advance(step)
        now = clock.monotonic()
        got = rates.rates()
        assert got == fresh(readings, now), now
        asked.append(got)
    assert asked[0].generation_tokens_per_s == 100.0 and asked[0].preemptions_per_min == 60.0
    # the tokens window (10 s) has run out: no rate; the preemptions one has not
    assert asked[5].generation_tokens_per_s is None and asked[5].preemptions_per_min == 60.0
    assert asked[-1].preemptions_per_min is None
    # a new reading is taken at once
    clock.advance(1.0)
    m = VllmMetrics(generation_tokens_total=600.0, prompt_tokens_total=60.0)
    rates.observe(m, run=1)
    readings.append((clock.monotonic(), m))
    assert rates.rates() == fresh(readings, clock.monotonic())


def test_the_kv_peak_asked_again_follows_each_new_point_and_window() -> None:
    h = History(span_s=600.0)
    h.append(100.0, 0.9, None, None)
    assert h.kv_peak(60) == 0.9 and h.kv_peak(60) == 0.9
    h.append(130.0, 0.2, None, None)
    assert h.kv_peak(60) == 0.9  # still within the minute
    h.append(170.0, 0.3, None, None)
    assert h.kv_peak(60) == 0.3 and h.kv_peak(120) == 0.9  # the 0.9 left the minute
    h.clear()
    assert h.kv_peak(60) is None
    h.append(200.0, None, None, None)
    assert h.kv_peak(60) is None
    h.append(201.0, 0.4, None, None)
    assert h.kv_peak(60) == 0.4
