"""When an instance is at rest (telemetry/rest.py): a few good scrapes in a row with nothing in
flight and no figure moving; anything moving, in flight or unknown ends it at once."""

from __future__ import annotations

from dataclasses import replace

from vsup.telemetry.metrics import EngineFigures, VllmMetrics
from vsup.telemetry.rest import QUIET_SCRAPES, RestWatch

IDLE = VllmMetrics(
    kv_cache_usage=0.0,
    preemptions_total=0.0,
    requests_running=0.0,
    requests_waiting=0.0,
    prompt_tokens_total=100.0,
    generation_tokens_total=200.0,
    request_success_total=10.0,
    vllm_seen=True,
    per_engine={
        "0": EngineFigures(
            requests_running=0.0,
            requests_waiting=0.0,
            prompt_tokens_total=100.0,
            generation_tokens_total=200.0,
            request_success_total=10.0,
            kv_cache_usage=0.0,
        )
    },
)


def rested(watch: RestWatch, m: VllmMetrics = IDLE, load: int | None = 0) -> RestWatch:
    for _ in range(QUIET_SCRAPES + 1):  # the first scrape has nothing to compare with
        watch.observe(True, m, load)
    return watch


def test_an_idle_server_rests_after_its_quiet_scrapes_and_not_before():
    watch = RestWatch()
    for _ in range(QUIET_SCRAPES):
        watch.observe(True, IDLE, 0)
        assert not watch.at_rest
    watch.observe(True, IDLE, 0)
    assert watch.at_rest


def test_a_counter_that_moves_ends_the_rest_at_once():
    for moved in (
        replace(IDLE, generation_tokens_total=201.0),
        replace(IDLE, prompt_tokens_total=101.0),
        replace(IDLE, request_success_total=11.0),
        replace(IDLE, preemptions_total=1.0),
        replace(IDLE, kv_cache_usage=0.01),
        replace(IDLE, per_engine={"0": replace(IDLE.per_engine["0"], kv_cache_usage=0.02)}),
    ):
        watch = rested(RestWatch())
        watch.observe(True, moved, 0)
        assert not watch.at_rest, moved
        # the new figures, standing still, rest again after as many quiet scrapes
        for _ in range(QUIET_SCRAPES - 1):
            watch.observe(True, moved, 0)
        assert not watch.at_rest
        watch.observe(True, moved, 0)
        assert watch.at_rest


def test_a_request_in_flight_ends_the_rest_even_with_frozen_figures():
    # /load: requests the API server holds that no engine shows (a freeze that began idle)
    watch = rested(RestWatch())
    watch.observe(True, IDLE, 2)
    assert not watch.at_rest
    # the engine's gauges: requests running or waiting, counters frozen (a hung engine)
    hung = replace(IDLE, requests_running=3.0, requests_waiting=5.0)
    watch = RestWatch()
    for _ in range(QUIET_SCRAPES + 5):
        watch.observe(True, hung, None)
    assert not watch.at_rest
    one_rank = replace(IDLE, per_engine={"0": replace(IDLE.per_engine["0"], requests_waiting=1)})
    assert not rested(RestWatch(), one_rank).at_rest


def test_a_failed_scrape_or_a_server_without_figures_is_never_at_rest():
    watch = rested(RestWatch())
    watch.observe(False, None, None)
    assert not watch.at_rest
    # --disable-log-stats: no vLLM series, so nothing says it is idle
    assert not rested(RestWatch(), VllmMetrics(vllm_seen=False)).at_rest
    assert not rested(RestWatch(), replace(IDLE, requests_running=None)).at_rest


def test_a_sleeping_server_rests_but_not_while_a_sleep_or_wake_is_in_flight():
    asleep = replace(IDLE, sleeping=True, sleep_level=1)
    assert rested(RestWatch(), asleep).at_rest
    assert not rested(RestWatch(), replace(asleep, wakes_in_flight=1.0)).at_rest
    assert not rested(RestWatch(), replace(IDLE, sleeps_in_flight=1.0)).at_rest
    watch = rested(RestWatch(), asleep)
    watch.observe(True, IDLE, 0)  # it woke: the sleep state moved
    assert not watch.at_rest


def test_clear_forgets_the_quiet_scrapes():
    watch = rested(RestWatch())
    watch.clear()
    assert not watch.at_rest
