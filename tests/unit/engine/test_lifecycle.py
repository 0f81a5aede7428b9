from functools import partial

import pytest

from vsup.clock import iso_utc
from vsup.engine.lifecycle import Lifecycle
from vsup.layout.spec import RestartPolicy
from vsup.snapshot import LastExit

from tests.factories import instance_spec
from tests.support.clock import FakeClock

spec = partial(
    instance_spec,
    restart=RestartPolicy(backoff_s=10, backoff_max_s=40, stable_s=100, max_failures=4),
    start_timeout_s=60,
)


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def changes():
    return []


@pytest.fixture
def lc(clock, changes):
    return Lifecycle(spec(), clock, on_change=lambda old, new: changes.append((old, new)))


def exit_(clock, reason, code=None, signal=None):
    return LastExit(code, signal, reason, iso_utc(clock.wall()), None)


def start_and_spawn(lc, run):
    lc.attempt()
    lc.spawned(run)


def test_start_spawn_ready_records_times(lc, clock, changes):
    lc.request_start()
    assert lc.state == "starting" and lc.spawned_at is None
    clock.advance(2)
    lc.spawned(1)
    clock.advance(30)
    assert lc.became_ready()
    assert lc.state == "ready" and lc.ready_since == clock.monotonic()
    assert lc.state_since == clock.monotonic()
    assert changes == [("stopped", "starting"), ("starting", "ready")]


def test_start_timeout_is_measured_from_the_spawn_not_the_wait_for_a_turn(lc, clock):
    lc.request_start()
    clock.advance(500)  # waited for a co-tenant
    assert not lc.start_timed_out()
    lc.spawned(1)
    clock.advance(59.9)
    assert not lc.start_timed_out()
    assert lc.start_remaining_s() == pytest.approx(0.1)
    clock.advance(0.1)
    assert lc.start_timed_out()


def test_crash_loop_follows_the_backoff_and_trips_the_breaker(lc, clock):
    lc.request_start()
    delays = []
    for run in range(1, 10):
        if lc.state == "failed":
            break
        if lc.state == "backoff":
            assert not lc.backoff_due() or lc.backoff_remaining_s() == 0
            clock.advance(lc.backoff_remaining_s())
            assert lc.backoff_due()
        start_and_spawn(lc, run)
        clock.advance(1)
        decision = lc.exited(exit_(clock, "killed", signal="SIGKILL"))
        if decision.action == "restart":
            delays.append(decision.delay_s)
    assert lc.state == "failed"
    assert delays == [0, 10, 20]
    assert lc.run == 4  # max_failures spawns, then no more
    assert lc.restarts == 3
    assert lc.failed_why == "the restart policy gave up: 4 consecutive failures (max_failures = 4)"
    clock.advance(10_000)
    assert not lc.backoff_due() and lc.backoff_remaining_s() is None
    lc.request_start()  # a person: the why goes with the state
    assert lc.state == "starting" and lc.failed_why is None


def test_a_failure_outside_the_policy_keeps_its_why_until_the_state_changes(lc, clock):
    assert lc.failed_why is None
    lc.request_start()
    start_and_spawn(lc, 1)
    lc.fail("processes of a outlived SIGKILL: 7 x (D)")
    assert lc.state == "failed" and lc.failed_why == "processes of a outlived SIGKILL: 7 x (D)"
    lc.begin_stop()  # a stop of a failed instance changes nothing
    assert lc.failed_why == "processes of a outlived SIGKILL: 7 x (D)"
    lc.request_start()
    assert lc.state == "starting" and lc.failed_why is None


def test_backoff_is_not_due_before_its_delay(lc, clock):
    lc.request_start()
    start_and_spawn(lc, 1)
    lc.exited(exit_(clock, "oom"))  # first restart: at once
    assert lc.state == "backoff" and lc.backoff_due()
    start_and_spawn(lc, 2)
    lc.exited(exit_(clock, "oom"))
    assert lc.backoff_remaining_s() == 10
    clock.advance(9.5)
    assert not lc.backoff_due()
    clock.advance(0.5)
    assert lc.backoff_due()


def test_ready_for_stable_s_resets_the_backoff(lc, clock):
    lc.request_start()
    for run in (1, 2):
        start_and_spawn(lc, run)
        lc.exited(exit_(clock, "unknown", code=1))
        clock.advance(lc.backoff_remaining_s())
    start_and_spawn(lc, 3)
    lc.became_ready()
    clock.advance(100)
    d = lc.exited(exit_(clock, "unknown", code=1))
    assert d.delay_s == 0 and d.failures == 1


def test_unhealthy_after_consecutive_failures_only(lc, clock):
    lc.request_start()
    lc.spawned(1)
    assert not lc.health_failed(None)  # while starting, failures do not count
    lc.became_ready()
    assert not lc.health_failed(None)
    assert not lc.health_failed(None)
    lc.health_ok()
    assert not lc.health_failed(503)
    assert not lc.health_failed(503)
    assert lc.health_failed(503)
    assert lc.state == "unhealthy" and lc.unhealthy_cause == "engine_dead"


def test_no_answer_is_unhealthy_only_once_silent_for_the_grace(lc, clock):
    lc.request_start()
    lc.spawned(1)
    lc.became_ready()
    assert lc.unhealthy_grace_s == 30  # the default
    for _ in range(3):
        assert not lc.health_failed(None)  # a saturated API server misses checks: not hung
    clock.advance(20)
    lc.health_ok()  # it answered: the silence starts over
    clock.advance(29)
    for _ in range(5):
        assert not lc.health_failed(None)
    assert lc.state == "ready"
    clock.advance(1)
    assert lc.health_failed(None)
    assert lc.state == "unhealthy" and lc.unhealthy_cause == "unhealthy"


def test_an_answer_that_is_not_200_counts_at_once_and_ends_the_silence(lc, clock):
    lc.request_start()
    lc.spawned(1)
    lc.became_ready()
    clock.advance(100)
    assert not lc.health_failed(None)
    assert not lc.health_failed(500)  # an answer: the server is not hung...
    assert not lc.health_failed(None)  # ...so silence counts from it
    clock.advance(30)
    assert lc.health_failed(None)


def test_stop_keeps_stopping_until_the_sweep_is_done(lc, clock, changes):
    lc.request_start()
    lc.spawned(1)
    lc.became_ready()
    lc.begin_stop()
    d = lc.exited(exit_(clock, "stopped", code=0))
    assert d.action == "stopped" and lc.state == "stopping"
    lc.finish_stop()
    assert lc.state == "stopped"
    assert changes[-2:] == [("ready", "stopping"), ("stopping", "stopped")]
    assert lc.restarts == 0


def test_deterministic_failure_fails_at_the_first_spawn(lc, clock):
    lc.request_start()
    lc.spawned(1)
    d = lc.exited(exit_(clock, "model_not_found", code=1))
    assert d.action == "failed" and lc.state == "failed" and lc.run == 1


def test_a_person_starting_a_failed_instance_resets_the_breaker(lc, clock):
    lc.request_start()
    for run in range(1, 5):
        start_and_spawn(lc, run)
        lc.exited(exit_(clock, "oom"))
        if lc.state == "backoff":
            clock.advance(lc.backoff_remaining_s())
    assert lc.state == "failed"
    lc.request_start()
    assert lc.state == "starting" and lc.failures == 0
    lc.spawned(5)
    assert lc.exited(exit_(clock, "oom")).delay_s == 0
    assert lc.restarts == 3  # runs 2-4 were automatic; run 5 was a person's start


def test_stop_during_backoff_cancels_the_restart(lc, clock):
    lc.request_start()
    lc.spawned(1)
    lc.exited(exit_(clock, "killed", signal="SIGKILL"))
    assert lc.state == "backoff"
    lc.begin_stop()
    lc.finish_stop()
    assert lc.state == "stopped" and lc.backoff_remaining_s() is None
    clock.advance(1000)
    assert not lc.backoff_due()


def test_configure_takes_the_new_policy(lc, clock):
    lc.configure(spec(restart=RestartPolicy(policy="never")))
    lc.request_start()
    lc.spawned(1)
    assert lc.exited(exit_(clock, "oom")).action == "failed"


def test_adopted_process_keeps_its_age(lc, clock):
    lc.spawned(7, started_ago_s=120)
    assert lc.state == "starting" and lc.run == 7
    assert clock.monotonic() - lc.spawned_at == 120


def test_a_stop_asked_for_during_the_spawn_stays_a_stop(lc, changes):
    lc.request_start()
    lc.begin_stop()
    lc.spawned(1)
    assert lc.state == "stopping" and lc.run == 1
    assert changes == [("stopped", "starting"), ("starting", "stopping")]


def test_state_and_exit_reason_enums_are_the_wire_strings():
    import json

    from vsup.engine.states import ExitReason, State
    from vsup.snapshot import EXIT_REASONS, STATES

    assert tuple(State) == STATES
    assert set(ExitReason) == set(EXIT_REASONS)
    assert json.dumps({"state": State.READY, "reason": ExitReason.OOM}) == (
        '{"state": "ready", "reason": "oom"}'
    )


def test_every_move_is_checked_against_the_transition_table():
    import pytest

    from vsup.engine.states import TRANSITIONS, IllegalTransition, State, check_transition

    assert set(TRANSITIONS) == set(State)
    for old in State:
        check_transition(old, old)  # staying is no move
    check_transition(State.STOPPING, State.STARTING)  # a restart goes straight on
    with pytest.raises(IllegalTransition, match="illegal state change stopped -> ready"):
        check_transition(State.STOPPED, State.READY)
    with pytest.raises(IllegalTransition):
        check_transition(State.FAILED, State.READY)


def test_at_rest_a_recent_good_answer_stands_for_the_health_check(lc, clock):
    lc.request_start()
    lc.spawned(1)
    assert lc.became_ready()
    assert not lc.rests()  # not at rest: the health loop checks each second
    lc.rest_window_s = 4.5  # the monitor: at rest, scraped every 3 s
    assert lc.rests()
    clock.advance(4.4)
    assert lc.rests()
    clock.advance(0.2)  # no answer for the whole window (a hung server): check again
    assert not lc.rests()
    lc.health_ok()
    assert lc.rests()
    lc.health_failed(503)  # a failed answer: checked each second until a good one
    assert not lc.rests()
    lc.health_ok()
    assert lc.rests()
    lc.rest_window_s = 0.0  # the rest ended (something moved, or a transition)
    assert not lc.rests()


def test_a_good_answer_to_the_scrape_is_the_check_when_it_comes_anything_else_wakes_the_loop(
    lc, clock
):
    """`health_answered`: a 200 that a telemetry scrape got while the instance is ready is
    that second's check at once (the health loop sleeps meanwhile, runner.py); an answer that
    is not 200, a scrape with no answer, or any answer while not ready wakes the loop, which
    judges it as its own check's."""
    woken = []
    t0 = clock.monotonic()
    lc.nudge = lambda: woken.append(clock.monotonic() - t0)
    lc.request_start()
    lc.spawned(1)
    lc.health_answered(200)  # starting: the loop judges readiness itself
    assert woken == [0.0] and not lc.answered_taken and lc.answered_count == 1
    assert lc.became_ready()
    lc.health_failed(None)  # one check of its own went unanswered
    clock.advance(2.0)
    lc.health_answered(200)
    assert lc.answered_taken and lc.health_failures == 0 and lc.last_answer_at == t0 + 2.0
    assert woken == [0.0] and lc.answered_count == 2
    lc.health_answered(503)  # the engine died: judged by the loop, now
    assert not lc.answered_taken and lc.answered_status == 503 and woken == [0.0, 2.0]
    assert lc.health_failures == 0 and lc.last_answer_at == t0 + 2.0  # not judged here
    clock.advance(1.0)
    lc.health_answered(None)  # a scrape that got no answer: the loop asks itself
    assert woken == [0.0, 2.0, 3.0] and lc.answered_count == 3 and lc.answered_status == 503
