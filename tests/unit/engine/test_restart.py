from typing import Any

from vsup.engine.restart import (
    DETERMINISTIC,
    RestartTracker,
    backoff_delay,
    is_failure,
)
from vsup.layout.spec import RestartPolicy


def policy(**kw):
    base: dict[str, Any] = dict(
        policy="on-failure", backoff_s=10, backoff_max_s=60, stable_s=600, max_failures=7
    )
    base.update(kw)
    return RestartPolicy(**base)


def test_delays_are_immediate_then_doubling_up_to_the_cap_then_failed():
    tracker = RestartTracker(policy())
    decisions = [tracker.decide("killed", None, ready_for_s=None) for _ in range(7)]
    assert [d.action for d in decisions] == ["restart"] * 6 + ["failed"]
    assert [d.delay_s for d in decisions[:6]] == [0, 10, 20, 40, 60, 60]
    assert decisions[-1].failures == 7
    assert "max_failures = 7" in decisions[-1].why


def test_backoff_delay_formula_matches_the_design():
    p = policy(backoff_s=10, backoff_max_s=300)
    assert [backoff_delay(p, n) for n in range(1, 9)] == [0, 10, 20, 40, 80, 160, 300, 300]


def test_a_stable_run_resets_the_failure_count():
    tracker = RestartTracker(policy(stable_s=600))
    for _ in range(3):
        tracker.decide("unknown", 1, ready_for_s=5)
    assert tracker.failures == 3
    again = tracker.decide("unknown", 1, ready_for_s=600)
    assert again.action == "restart" and again.delay_s == 0 and again.failures == 1


def test_a_short_ready_period_does_not_reset():
    tracker = RestartTracker(policy(stable_s=600))
    tracker.decide("unknown", 1, ready_for_s=None)
    d = tracker.decide("unknown", 1, ready_for_s=599.9)
    assert d.failures == 2 and d.delay_s == 10


def test_deterministic_exits_fail_fast_whatever_max_failures():
    for reason in sorted(DETERMINISTIC):
        d = RestartTracker(policy(max_failures=5)).decide(reason, 1, ready_for_s=None)
        assert d.action == "failed", reason
        assert reason in d.why


def test_deterministic_spawns_allows_a_configured_number():
    tracker = RestartTracker(policy(max_failures=5), deterministic_spawns=2)
    first = tracker.decide("model_not_found", 1, None)
    second = tracker.decide("model_not_found", 1, None)
    assert (first.action, first.delay_s) == ("restart", 0)
    assert second.action == "failed"


def test_on_failure_does_not_restart_a_clean_exit():
    d = RestartTracker(policy()).decide("unknown", 0, None)
    assert d.action == "stopped"


def test_engine_dead_with_exit_code_zero_is_a_failure():
    # vLLM exits 0 after its EngineCore died (captured: engine_dead_core_killed.log).
    assert is_failure("engine_dead", 0)
    assert RestartTracker(policy()).decide("engine_dead", 0, None).action == "restart"


def test_always_restarts_clean_exits_and_never_restarts_nothing():
    assert RestartTracker(policy(policy="always")).decide("unknown", 0, None).action == "restart"
    never = RestartTracker(policy(policy="never"))
    assert never.decide("killed", None, None).action == "failed"
    assert RestartTracker(policy(policy="never")).decide("unknown", 0, None).action == "stopped"


def test_max_failures_zero_never_gives_up():
    tracker = RestartTracker(policy(max_failures=0, backoff_max_s=60))
    actions = {tracker.decide("oom", None, None).action for _ in range(50)}
    assert actions == {"restart"}


def test_reset_starts_the_backoff_over():
    tracker = RestartTracker(policy())
    for _ in range(4):
        tracker.decide("oom", None, None)
    tracker.reset()
    assert tracker.decide("oom", None, None).delay_s == 0
