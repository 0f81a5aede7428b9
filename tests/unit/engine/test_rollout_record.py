"""A rollout as the state file keeps it, and as a later daemon finds it: interrupted."""

from __future__ import annotations

import json

import pytest

from vsup.engine.rollout import Rollout, RolloutState


def mid_wave_two() -> Rollout:
    r = Rollout(("a", "b", "c", "d"), 1, 2.0, "2026-12-01T04:00:00.000Z")
    r.begin_wave(1)
    r.wave_ready()
    r.begin_wave(2)
    return r


def test_the_record_rebuilds_the_rollout_exactly():
    r = mid_wave_two()
    back = Rollout.from_record(json.loads(json.dumps(r.to_record())))
    assert back.to_json() == r.to_json()
    assert (back.wave, back.done, back.current, back.pending) == (2, ["a"], ("b",), ("c", "d"))
    assert back.drain_timeout_s == 2.0 and back.waves == r.waves


def test_a_later_daemon_finds_a_running_rollout_interrupted():
    r = Rollout.from_record(mid_wave_two().to_record())
    r.interrupted("2026-12-01T04:01:00.000Z")
    assert r.state == RolloutState.INTERRUPTED and not r.active
    status = r.status(outdated={"b", "c", "d", "x"})
    assert status.state == "interrupted" and status.interrupted_at == "2026-12-01T04:01:00.000Z"
    assert status.old_config == ("b", "c", "d") and status.restarted == ("a",)
    assert (status.wave, status.waves, status.done, status.total) == (2, 4, 1, 4)
    done = Rollout.from_record({**mid_wave_two().to_record(), "state": "done"})
    done.interrupted("later")
    assert done.state == RolloutState.DONE  # only a running one was interrupted


def test_without_a_layout_to_compare_the_old_config_is_what_was_not_restarted():
    assert mid_wave_two().status().old_config == ("b", "c", "d")


@pytest.mark.parametrize(
    "bad",
    [
        {},
        {"names": "abc", "wave": "x"},
        {"names": ["a"], "state": "sideways"},
        {"names": ["a"], "wave": 5},
    ],
)
def test_a_bad_record_is_refused_naming_the_rollout(bad):
    with pytest.raises(ValueError, match="rollout"):
        Rollout.from_record(bad)
