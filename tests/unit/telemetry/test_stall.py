"""Stall detection (telemetry/stall.py): work and no token processed, from successive scrapes,
on a fake clock; figures shaped like the real CPU vLLM 0.32 payloads."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from vsup.clock import FakeClock
from vsup.telemetry.instance import InstanceTelemetry
from vsup.telemetry.metrics import parse_metrics
from vsup.telemetry.scrape import ScrapeResult
from vsup.telemetry.stall import StallWatch

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "vllm-0.32-cpu"
# running 1, waiting 9, generation 1029, prompt 45, KV 0.4: a server under load
LOAD = parse_metrics((FIX / "metrics_load.txt").read_text())
IDLE = parse_metrics((FIX / "metrics_idle.txt").read_text())
FRESH_S = 5.0


def feed(watch: StallWatch, clock: FakeClock, metrics, seconds: int, step: float = 1.0):
    """One scrape a second for `seconds`, the same figures each time (nothing moves)."""
    for _ in range(seconds):
        clock.advance(step)
        watch.observe(metrics, clock.monotonic(), clock.wall())


def test_the_real_load_payload_has_what_the_watch_reads():
    assert LOAD.requests_running == 1.0 and LOAD.requests_waiting == 9.0
    assert LOAD.generation_tokens_total and LOAD.prompt_tokens_total and LOAD.kv_cache_usage
    assert IDLE.requests_running == 0.0 and IDLE.requests_waiting == 0.0


def test_work_with_frozen_counters_is_a_stall_after_stall_after_s():
    clock, watch = FakeClock(), StallWatch()
    watch.observe(LOAD, clock.monotonic(), clock.wall())
    began = clock.wall()
    feed(watch, clock, LOAD, 59)
    assert watch.view(clock.monotonic(), 60.0, FRESH_S).stalled is False
    feed(watch, clock, LOAD, 2)
    view = watch.view(clock.monotonic(), 60.0, FRESH_S)
    assert view.stalled is True
    assert view.for_s == 61.0
    assert view.since_wall == began


def test_an_idle_server_is_never_stalled_however_long_nothing_moves():
    clock, watch = FakeClock(), StallWatch()
    feed(watch, clock, IDLE, 600)
    assert watch.view(clock.monotonic(), 60.0, FRESH_S).stalled is False


def test_generated_tokens_keep_it_from_stalling():
    clock, watch = FakeClock(), StallWatch()
    gen = LOAD.generation_tokens_total or 0.0
    for i in range(120):
        clock.advance(1.0)
        m = replace(LOAD, generation_tokens_total=gen + (i // 50))  # a token every 50 s
        watch.observe(m, clock.monotonic(), clock.wall())
        assert watch.view(clock.monotonic(), 60.0, FRESH_S).stalled is False


def test_a_long_chunked_prefill_is_progress_through_kv_growth_alone():
    # vLLM counts prompt tokens when a prefill ends; meanwhile the scheduler's stats (sent each
    # step) show KV blocks being allocated chunk after chunk.
    clock, watch = FakeClock(), StallWatch()
    prefill = replace(LOAD, requests_running=1.0, requests_waiting=0.0, kv_cache_usage=0.01)
    for i in range(300):
        clock.advance(1.0)
        m = replace(prefill, kv_cache_usage=0.01 + 0.003 * (i // 20))  # a block every 20 s
        watch.observe(m, clock.monotonic(), clock.wall())
        assert watch.view(clock.monotonic(), 60.0, FRESH_S).stalled is False
    # the prefill ends: prompt tokens counted; then decode stops dead
    ended = replace(m, prompt_tokens_total=(LOAD.prompt_tokens_total or 0) + 50_000)
    watch.observe(ended, clock.monotonic(), clock.wall())
    feed(watch, clock, ended, 61)
    assert watch.view(clock.monotonic(), 60.0, FRESH_S).stalled is True


def test_kv_usage_falling_is_no_progress():
    clock, watch = FakeClock(), StallWatch()
    for i in range(70):
        clock.advance(1.0)
        m = replace(LOAD, kv_cache_usage=0.9 - 0.01 * i)  # requests aborted by their clients
        watch.observe(m, clock.monotonic(), clock.wall())
    assert watch.view(clock.monotonic(), 60.0, FRESH_S).stalled is True


def test_requests_arriving_at_a_hung_engine_are_no_progress():
    clock, watch = FakeClock(), StallWatch()
    for i in range(70):
        clock.advance(1.0)
        watch.observe(replace(LOAD, requests_waiting=9.0 + i), clock.monotonic(), clock.wall())
    assert watch.view(clock.monotonic(), 60.0, FRESH_S).stalled is True


def test_the_timer_starts_when_work_arrives_not_at_the_last_token_before_an_idle_spell():
    clock, watch = FakeClock(), StallWatch()
    feed(watch, clock, IDLE, 300)
    feed(watch, clock, LOAD, 30)
    assert watch.view(clock.monotonic(), 60.0, FRESH_S).stalled is False
    feed(watch, clock, LOAD, 31)
    assert watch.view(clock.monotonic(), 60.0, FRESH_S).stalled is True
    feed(watch, clock, IDLE, 1)  # the requests ended (clients gave up): not stalled
    assert watch.view(clock.monotonic(), 60.0, FRESH_S).stalled is False


def test_no_fresh_figures_or_detection_off_say_nothing():
    clock, watch = FakeClock(), StallWatch()
    feed(watch, clock, LOAD, 90)
    assert watch.view(clock.monotonic(), 60.0, FRESH_S).stalled is True
    assert watch.view(clock.monotonic(), 0, FRESH_S).stalled is None
    assert watch.view(clock.monotonic(), None, FRESH_S).stalled is None
    clock.advance(FRESH_S + 1)  # scrapes stopped answering: the health check's business
    assert watch.view(clock.monotonic(), 60.0, FRESH_S).stalled is None
    assert StallWatch().view(clock.monotonic(), 60.0, FRESH_S).stalled is None


def test_payload_without_request_gauges_is_never_judged():
    clock, watch = FakeClock(), StallWatch()
    bare = replace(LOAD, requests_running=None, requests_waiting=None)
    feed(watch, clock, bare, 120)
    assert watch.view(clock.monotonic(), 60.0, FRESH_S).stalled is False


def test_instance_telemetry_forgets_a_stall_with_a_new_run():
    clock = FakeClock()
    tel = InstanceTelemetry(clock)
    tel.start_run(1, None)
    for _ in range(70):
        clock.advance(1.0)
        tel.observe(ScrapeResult("http://x/metrics", True, LOAD, status=200))
    assert tel.stall_view(60.0).stalled is True
    tel.start_run(2, None)
    assert tel.stall_view(60.0).stalled is None
    tel.observe(ScrapeResult("http://x/metrics", True, LOAD, status=200))
    assert tel.stall_view(60.0).stalled is False


def _prefill_series() -> list[tuple[float, ...]]:
    rows = []
    for line in (FIX / "prefill_slowed.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            rows.append(tuple(float(x) for x in line.split()))
    return rows


def test_a_real_slowed_chunked_prefill_is_no_stall_though_no_token_is_counted_for_9_s():
    rows = _prefill_series()
    busy = [r for r in rows if r[1] > 0]
    assert busy[-1][0] - busy[0][0] > 9.0  # longer than stall_after_s below, no token counted
    assert {(r[3], r[4]) for r in busy} == {(0.0, 0.0)}
    clock, watch = FakeClock(), StallWatch()
    start = clock.monotonic()
    verdicts = []
    for t, running, waiting, prompt, gen, kv in rows:
        clock.advance(start + t - clock.monotonic())
        m = replace(
            LOAD,
            requests_running=running,
            requests_waiting=waiting,
            prompt_tokens_total=prompt,
            generation_tokens_total=gen,
            kv_cache_usage=kv,
        )
        watch.observe(m, clock.monotonic(), clock.wall())
        verdicts.append(watch.view(clock.monotonic(), 5.0, FRESH_S).stalled)
    assert verdicts == [False] * len(rows)
    # the same figures with KV usage frozen (no way to see the chunks) would have been a stall
    clock, watch = FakeClock(), StallWatch()
    start = clock.monotonic()
    frozen = []
    for t, running, waiting, prompt, gen, _kv in rows[:-1]:
        clock.advance(start + t - clock.monotonic())
        m = replace(
            LOAD,
            requests_running=running,
            requests_waiting=waiting,
            prompt_tokens_total=prompt,
            generation_tokens_total=gen,
            kv_cache_usage=0.0,
        )
        watch.observe(m, clock.monotonic(), clock.wall())
        frozen.append(watch.view(clock.monotonic(), 5.0, FRESH_S).stalled)
    assert frozen[-1] is True
