"""Stall detection (telemetry/stall.py): work and no progress, from successive scrapes, on a
fake clock; figures from real CPU vLLM 0.32 payloads (one engine, and two data-parallel ranks
with one frozen: tests/fixtures/vllm-0.32-cpu/dp2/README.md)."""

from __future__ import annotations

from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from vsup.telemetry.instance import InstanceTelemetry
from vsup.telemetry.metrics import EngineFigures, VllmMetrics, parse_metrics
from vsup.telemetry.scrape import CanaryOutcome, CanaryResult, ScrapeResult
from vsup.telemetry.stall import Evidence, StallWatch

from tests.support.clock import FakeClock

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "vllm-0.32-cpu"
# running 1, waiting 9, generation 1029, prompt 45, KV 0.4: a server under load
LOAD = parse_metrics((FIX / "metrics_load.txt").read_text())
IDLE = parse_metrics((FIX / "metrics_idle.txt").read_text())
DP_IDLE = parse_metrics((FIX / "dp2" / "metrics_dp_idle.txt").read_text())
DP1_FROZEN_LOAD = parse_metrics((FIX / "dp2" / "metrics_dp1_frozen_load.txt").read_text())
DP1_FROZEN_IDLE = parse_metrics((FIX / "dp2" / "metrics_dp1_frozen_idle.txt").read_text())
FRESH_S = 5.0


def moved(m: VllmMetrics, engine: str = "0", **changes: Any) -> VllmMetrics:
    """`m` with one engine's figures changed (and the server's sums, for one engine)."""
    per = dict(m.per_engine)
    per[engine] = replace(per[engine], **changes)
    names = {f.name for f in fields(VllmMetrics)}
    whole = {k: v for k, v in changes.items() if k in names and len(per) == 1}
    return replace(m, per_engine=per, **whole)


def feed(watch: StallWatch, clock: FakeClock, metrics, seconds: int, load: int | None = None):
    """One scrape a second for `seconds`, the same figures each time (nothing moves)."""
    for _ in range(seconds):
        clock.advance(1.0)
        watch.observe(metrics, clock.monotonic(), clock.wall(), server_load=load)


def verdict(watch: StallWatch, clock: FakeClock, after: float = 60.0):
    return watch.view(clock.monotonic(), after, FRESH_S)


def test_the_real_payloads_have_what_the_watch_reads():
    assert LOAD.requests_running == 1.0 and LOAD.requests_waiting == 9.0
    assert LOAD.generation_tokens_total and LOAD.prompt_tokens_total and LOAD.kv_cache_usage
    assert LOAD.request_success_total == 2.0  # summed over finished_reason
    (one,) = LOAD.per_engine.values()
    assert (one.requests_running, one.requests_waiting, one.sleeping) == (1.0, 9.0, False)
    assert IDLE.requests_running == 0.0 and IDLE.requests_waiting == 0.0
    frozen = DP1_FROZEN_LOAD.per_engine
    assert list(frozen) == ["0", "1"]
    assert frozen["0"].requests_running == 8.0 and frozen["1"].requests_running == 8.0
    assert DP1_FROZEN_LOAD.requests_running == 16.0  # the sums stay what they were


def test_work_with_frozen_counters_is_a_stall_after_stall_after_s():
    clock, watch = FakeClock(), StallWatch()
    watch.observe(LOAD, clock.monotonic(), clock.wall())
    began = clock.wall()
    feed(watch, clock, LOAD, 59)
    assert verdict(watch, clock).stalled is False
    feed(watch, clock, LOAD, 2)
    view = verdict(watch, clock)
    assert (view.stalled, view.for_s, view.since_wall) == (True, 61.0, began)
    assert view.evidence == Evidence.ENGINE and view.ranks == ()


def test_an_idle_server_is_never_stalled_however_long_nothing_moves():
    clock, watch = FakeClock(), StallWatch()
    feed(watch, clock, IDLE, 600)
    assert verdict(watch, clock).stalled is False
    feed(watch, clock, IDLE, 600, load=0)  # with load tracking: nothing in flight either
    assert verdict(watch, clock).stalled is False
    assert watch.idle is True


def test_generated_tokens_keep_it_from_stalling():
    clock, watch = FakeClock(), StallWatch()
    gen = LOAD.generation_tokens_total or 0.0
    for i in range(120):
        clock.advance(1.0)
        m = moved(LOAD, generation_tokens_total=gen + (i // 50))  # a token every 50 s
        watch.observe(m, clock.monotonic(), clock.wall())
        assert verdict(watch, clock).stalled is False


def test_a_finished_request_is_progress_though_it_generated_nothing():
    # an embedding or score request: no generation or prompt token counted on the way
    clock, watch = FakeClock(), StallWatch()
    done = LOAD.request_success_total or 0.0
    for i in range(120):
        clock.advance(1.0)
        watch.observe(
            moved(LOAD, request_success_total=done + i // 50), clock.monotonic(), clock.wall()
        )
        assert verdict(watch, clock).stalled is False


def test_a_long_chunked_prefill_is_progress_through_kv_growth_alone():
    # vLLM counts prompt tokens when a prefill ends; meanwhile the scheduler's stats (sent each
    # step) show KV blocks being allocated chunk after chunk.
    clock, watch = FakeClock(), StallWatch()
    prefill = moved(LOAD, requests_running=1.0, requests_waiting=0.0, kv_cache_usage=0.01)
    m = prefill
    for i in range(300):
        clock.advance(1.0)
        m = moved(prefill, kv_cache_usage=0.01 + 0.003 * (i // 20))  # a block every 20 s
        watch.observe(m, clock.monotonic(), clock.wall(), server_load=1)
        assert verdict(watch, clock).stalled is False
    # the prefill ends: prompt tokens counted; then decode stops dead
    ended = moved(m, prompt_tokens_total=(LOAD.prompt_tokens_total or 0) + 50_000)
    watch.observe(ended, clock.monotonic(), clock.wall(), server_load=1)
    feed(watch, clock, ended, 61, load=1)
    assert verdict(watch, clock).stalled is True


def test_kv_usage_falling_is_no_progress():
    clock, watch = FakeClock(), StallWatch()
    for i in range(70):
        clock.advance(1.0)
        m = moved(LOAD, kv_cache_usage=0.9 - 0.01 * i)  # requests aborted by their clients
        watch.observe(m, clock.monotonic(), clock.wall())
    assert verdict(watch, clock).stalled is True


def test_requests_arriving_at_a_hung_engine_are_no_progress():
    clock, watch = FakeClock(), StallWatch()
    for i in range(70):
        clock.advance(1.0)
        watch.observe(moved(LOAD, requests_waiting=9.0 + i), clock.monotonic(), clock.wall())
    assert verdict(watch, clock).stalled is True


def test_the_timer_starts_when_work_arrives_not_at_the_last_token_before_an_idle_spell():
    clock, watch = FakeClock(), StallWatch()
    feed(watch, clock, IDLE, 300)
    feed(watch, clock, LOAD, 30)
    assert verdict(watch, clock).stalled is False
    feed(watch, clock, LOAD, 31)
    assert verdict(watch, clock).stalled is True
    feed(watch, clock, IDLE, 1)  # the requests ended (clients gave up): not stalled
    assert verdict(watch, clock).stalled is False


def test_a_freeze_while_idle_is_seen_once_requests_wait_at_the_api_server():
    # vLLM with --enable-server-load-tracking, EngineCore SIGSTOPped while idle, then
    # requests: /load counts them, the engine's gauges (frozen at idle) never do.
    clock, watch = FakeClock(), StallWatch()
    feed(watch, clock, IDLE, 120, load=0)
    assert verdict(watch, clock).stalled is False
    began = clock.wall() + 1
    feed(watch, clock, IDLE, 59, load=3)
    view = verdict(watch, clock)
    assert view.stalled is False and view.unaccounted == 3
    assert watch.idle is False  # no canary to a server holding requests
    feed(watch, clock, IDLE, 2, load=3)
    view = verdict(watch, clock)
    assert (view.stalled, view.evidence, view.since_wall) == (True, Evidence.SERVER, began)
    assert view.for_s == 60.0
    # SIGCONT: the engine takes them, tokens flow, the requests end
    watch.observe(moved(IDLE, generation_tokens_total=10_000.0), clock.monotonic(), clock.wall())
    assert verdict(watch, clock).stalled is False


def test_without_load_tracking_such_a_freeze_is_not_seen():
    clock, watch = FakeClock(), StallWatch()
    feed(watch, clock, IDLE, 600, load=None)
    assert verdict(watch, clock).stalled is False


def test_requests_the_engine_already_shows_are_not_counted_twice():
    clock, watch = FakeClock(), StallWatch()
    gen = LOAD.generation_tokens_total or 0.0
    for i in range(120):  # 10 at the engine, 10 at the server: none unaccounted
        clock.advance(1.0)
        m = moved(LOAD, generation_tokens_total=gen + i)
        watch.observe(m, clock.monotonic(), clock.wall(), server_load=10)
        assert verdict(watch, clock).unaccounted == 0
        assert verdict(watch, clock).stalled is False


def test_one_reading_between_requests_does_not_end_a_spell_of_unaccounted_ones():
    # /load and /metrics are read one after the other: a request ending between the two
    # reads is counted by the gauges but not by /load, once
    clock, watch = FakeClock(), StallWatch()
    feed(watch, clock, IDLE, 30, load=1)
    feed(watch, clock, IDLE, 1, load=0)
    feed(watch, clock, IDLE, 30, load=1)
    assert verdict(watch, clock).stalled is True
    feed(watch, clock, IDLE, 2, load=0)  # two readings: the requests are gone
    assert verdict(watch, clock).stalled is False


def test_a_load_read_that_fails_once_does_not_start_the_spell_again():
    # a frozen engine's API server on a loaded node: one /load read times out while /metrics
    # answers; the requests it counted are still held, the verdict is not put off
    clock = FakeClock()
    tel = InstanceTelemetry(clock)
    tel.start_run(1, None)

    def scrape(**load: Any) -> None:
        clock.advance(1.0)
        tel.observe(ScrapeResult("http://x/metrics", True, IDLE, status=200, **load))

    for _ in range(30):
        scrape(server_load=0)
    began = clock.wall() + 1
    for _ in range(40):
        scrape(server_load=3)
    scrape(load_error="http://x/load: no answer within the timeout")
    assert tel.fields()["requests_in_flight"] is None  # shown as unknown, not as 0
    for _ in range(20):
        scrape(server_load=3)
    view = tel.stall_view(60.0)
    assert (view.stalled, view.evidence, view.since_wall) == (True, Evidence.SERVER, began)
    # a /load that stays away says nothing after a few misses (no stall from an old count)
    for _ in range(4):
        scrape(load_error="http://x/load: answered HTTP 404")
    assert tel.stall_view(60.0).stalled is False


def test_a_sleeping_engine_is_never_stalled():
    # sleep mode: a request to a sleeper waits for its wake-up by design
    clock, watch = FakeClock(), StallWatch()
    asleep = moved(IDLE, sleeping=True)
    feed(watch, clock, asleep, 120, load=2)
    assert verdict(watch, clock).stalled is False
    feed(watch, clock, moved(LOAD, sleeping=True), 120, load=10)
    assert verdict(watch, clock).stalled is False


def test_no_fresh_figures_or_detection_off_say_nothing():
    clock, watch = FakeClock(), StallWatch()
    feed(watch, clock, LOAD, 90)
    assert verdict(watch, clock).stalled is True
    assert watch.view(clock.monotonic(), 0, FRESH_S).stalled is None
    assert watch.view(clock.monotonic(), None, FRESH_S).stalled is None
    clock.advance(FRESH_S + 1)  # scrapes stopped answering: the health check's business
    assert verdict(watch, clock).stalled is None
    assert StallWatch().view(clock.monotonic(), 60.0, FRESH_S).stalled is None


def test_payload_without_request_gauges_is_never_judged():
    clock, watch = FakeClock(), StallWatch()
    bare = replace(
        LOAD,
        requests_running=None,
        requests_waiting=None,
        per_engine={"0": EngineFigures(generation_tokens_total=5.0)},
    )
    feed(watch, clock, bare, 120)
    assert verdict(watch, clock).stalled is False


# ---------------------------------------------------------------- data parallel


def test_a_rank_frozen_under_load_beside_a_working_one_is_named():
    clock, watch = FakeClock(), StallWatch()
    gen0 = DP1_FROZEN_LOAD.per_engine["0"].generation_tokens_total or 0.0
    began = clock.wall() + 1
    for i in range(61):  # rank 0 keeps generating; rank 1's figures stay as frozen
        clock.advance(1.0)
        m = moved(DP1_FROZEN_LOAD, "0", generation_tokens_total=gen0 + 100 * i)
        watch.observe(m, clock.monotonic(), clock.wall(), server_load=16)
    view = verdict(watch, clock)
    assert (view.stalled, view.ranks, view.evidence) == (True, (1,), Evidence.ENGINE)
    assert view.since_wall == began
    # summed over ranks the server moved all along: only per-engine figures show it
    assert watch.engines == ("0", "1")


def test_a_rank_frozen_while_idle_holds_the_requests_its_working_neighbour_did_not_take():
    # the real sequence: idle, then 1 request held at frozen rank 1 while rank 0 answered 5
    # more and went idle again; /load 1 and no engine showing it
    clock, watch = FakeClock(), StallWatch()
    feed(watch, clock, DP_IDLE, 30, load=0)
    began = clock.wall() + 1
    feed(watch, clock, DP1_FROZEN_IDLE, 59, load=1)
    assert verdict(watch, clock).stalled is False
    feed(watch, clock, DP1_FROZEN_IDLE, 2, load=1)
    view = verdict(watch, clock)
    assert (view.stalled, view.ranks, view.evidence) == (True, (1,), Evidence.SERVER)
    assert view.since_wall == began and view.unaccounted == 1


def test_requests_no_gauge_shows_beside_a_rank_stuck_under_load_do_not_name_an_idle_rank():
    # rank 1 froze under load with one request more than its last stats show; rank 0 answers
    # its share, then idles: the request /load counts beyond the gauges is rank 1's
    clock, watch = FakeClock(), StallWatch()
    frozen = DP1_FROZEN_LOAD.per_engine["1"]
    held = int((frozen.requests_running or 0) + (frozen.requests_waiting or 0)) + 1
    gen0 = DP1_FROZEN_LOAD.per_engine["0"].generation_tokens_total or 0.0
    for i in range(10):
        clock.advance(1.0)
        m = moved(DP1_FROZEN_LOAD, "0", generation_tokens_total=gen0 + 100 * (i + 1))
        watch.observe(m, clock.monotonic(), clock.wall(), server_load=held + 8)
    done = moved(
        DP1_FROZEN_LOAD,
        "0",
        generation_tokens_total=gen0 + 1000,
        requests_running=0.0,
        requests_waiting=0.0,
    )
    feed(watch, clock, done, 120, load=held)
    view = verdict(watch, clock)
    assert (view.stalled, view.ranks, view.evidence) == (True, (1,), Evidence.ENGINE)
    assert view.unaccounted == 1


def test_when_every_rank_moved_since_the_requests_came_the_ones_without_progress_stall():
    clock, watch = FakeClock(), StallWatch()
    feed(watch, clock, DP_IDLE, 5, load=0)
    feed(watch, clock, DP_IDLE, 5, load=1)
    both = moved(moved(DP_IDLE, "0", generation_tokens_total=20_000.0), "1", kv_cache_usage=0.5)
    feed(watch, clock, both, 1, load=1)  # both ranks moved once, then nothing moves
    feed(watch, clock, both, 59, load=1)
    assert verdict(watch, clock).stalled is False
    feed(watch, clock, both, 1, load=1)
    assert verdict(watch, clock).ranks == (0, 1)


# ---------------------------------------------------------------- canary


def test_a_lost_canary_is_a_stall_from_its_sending_until_progress_or_an_answer():
    clock, watch = FakeClock(), StallWatch()
    feed(watch, clock, IDLE, 10)
    sent_t, sent_wall = clock.monotonic(), clock.wall()
    feed(watch, clock, IDLE, 60)
    watch.canary_lost(None, sent_t, sent_wall)
    view = verdict(watch, clock)
    assert (view.stalled, view.evidence, view.since_wall, view.for_s) == (
        True,
        Evidence.CANARY,
        sent_wall,
        60.0,
    )
    watch.canary_answered()
    assert verdict(watch, clock).stalled is False
    watch.canary_lost(None, sent_t, sent_wall)
    watch.observe(moved(IDLE, generation_tokens_total=10_000.0), clock.monotonic(), clock.wall())
    assert verdict(watch, clock).stalled is False  # the engine moved again


def test_a_canary_lost_at_one_rank_names_it_and_progress_elsewhere_does_not_clear_it():
    clock, watch = FakeClock(), StallWatch()
    feed(watch, clock, DP_IDLE, 5)
    watch.canary_lost("1", clock.monotonic(), clock.wall())
    clock.advance(60)
    watch.observe(
        moved(DP_IDLE, "0", generation_tokens_total=20_000.0), clock.monotonic(), clock.wall()
    )
    view = verdict(watch, clock)
    assert (view.stalled, view.ranks, view.evidence) == (True, (1,), Evidence.CANARY)


def test_instance_telemetry_sends_a_canary_only_to_a_fresh_idle_server_each_interval():
    clock = FakeClock()
    tel = InstanceTelemetry(clock)
    tel.start_run(1, None)
    assert not tel.canary_due(30.0)  # no figures yet
    tel.observe(ScrapeResult("http://x/metrics", True, IDLE, status=200))
    assert tel.canary_due(30.0) and not tel.canary_due(0.0)
    sent = tel.canary_sent()
    assert not tel.canary_due(30.0)  # one in flight
    clock.advance(60.0)
    tel.observe(ScrapeResult("http://x/metrics", True, IDLE, status=200))
    lost = CanaryResult("http://x/v1/completions", CanaryOutcome.TIMED_OUT, error="no answer")
    tel.canary_done(lost, None, sent)
    view = tel.stall_view(60.0)
    assert view.stalled is True and view.evidence == Evidence.CANARY and view.for_s == 60.0
    assert tel.canary_due(30.0)  # 60 s since the last one was sent
    tel.canary_done(CanaryResult("u", CanaryOutcome.ANSWERED, status=200), None, tel.canary_sent())
    assert tel.stall_view(60.0).stalled is False
    refused = CanaryResult("u", CanaryOutcome.FAILED, status=401, error="HTTP 401")
    tel.canary_done(refused, None, tel.canary_sent())
    assert tel.stall_view(60.0).stalled is False and tel.canary_error == "HTTP 401"
    clock.advance(40.0)
    tel.observe(ScrapeResult("http://x/metrics", True, LOAD, status=200))
    assert not tel.canary_due(30.0)  # busy: the figures tell


def test_instance_telemetry_reports_the_load_and_forgets_a_stall_with_a_new_run():
    clock = FakeClock()
    tel = InstanceTelemetry(clock)
    tel.start_run(1, None)
    for _ in range(70):
        clock.advance(1.0)
        tel.observe(ScrapeResult("http://x/metrics", True, LOAD, status=200, server_load=12))
    assert tel.stall_view(60.0).stalled is True
    assert tel.fields()["requests_in_flight"] == 12
    clock.advance(10.0)  # no scrape since: the figure is stale
    assert tel.fields()["requests_in_flight"] is None
    tel.start_run(2, None)
    assert tel.stall_view(60.0).stalled is None
    tel.observe(ScrapeResult("http://x/metrics", True, LOAD, status=200))
    assert tel.stall_view(60.0).stalled is False
    assert tel.fields()["requests_in_flight"] is None  # this scrape read no /load


def _prefill_series() -> list[tuple[float, ...]]:
    rows = []
    for line in (FIX / "prefill_slowed.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            rows.append(tuple(float(x) for x in line.split()))
    return rows


def _replay(rows, kv_frozen: bool) -> list[bool | None]:
    clock, watch = FakeClock(), StallWatch()
    start = clock.monotonic()
    verdicts = []
    for t, running, waiting, prompt, gen, kv in rows:
        clock.advance(start + t - clock.monotonic())
        m = moved(
            LOAD,
            requests_running=running,
            requests_waiting=waiting,
            prompt_tokens_total=prompt,
            generation_tokens_total=gen,
            request_success_total=0.0,
            kv_cache_usage=0.0 if kv_frozen else kv,
        )
        # the API server holds the one request throughout (load tracking on)
        watch.observe(m, clock.monotonic(), clock.wall(), server_load=1)
        verdicts.append(watch.view(clock.monotonic(), 5.0, FRESH_S).stalled)
    return verdicts


def test_a_real_slowed_chunked_prefill_is_no_stall_though_no_token_is_counted_for_9_s():
    rows = _prefill_series()
    busy = [r for r in rows if r[1] > 0]
    assert busy[-1][0] - busy[0][0] > 9.0  # longer than stall_after_s below, no token counted
    assert {(r[3], r[4]) for r in busy} == {(0.0, 0.0)}
    assert _replay(rows, kv_frozen=False) == [False] * len(rows)
    # the same figures with KV usage frozen (no way to see the chunks) would have been a stall
    assert _replay(rows[:-1], kv_frozen=True)[-1] is True


def test_the_shared_calm_view_is_what_the_full_judgement_says_at_every_second():
    """`view` answers a calm watch (nothing busy without progress, no spell of unaccounted
    requests, no lost canary: nearly every view) with one shared StallView: at each second of
    a freeze seen by the gauges and of one seen only by /load, it equals the full judgement,
    up to and past the second the verdict turns."""
    for metrics, load in ((LOAD, None), (IDLE, 4)):
        clock, watch = FakeClock(), StallWatch()
        watch.observe(metrics, clock.monotonic(), clock.wall(), server_load=load)
        verdicts = []
        for _ in range(70):
            feed(watch, clock, metrics, 1, load=load)
            got = verdict(watch, clock)
            assert got == watch._stalled_or_calm(clock.monotonic(), 60.0)
            verdicts.append(got.stalled)
        assert verdicts[:58] == [False] * 58 and verdicts[-5:] == [True] * 5
        assert verdict(watch, clock, after=600.0) is verdict(watch, clock, after=900.0)
