"""An instance's intent (engine/intent.py): one value for what is wanted, changed only by moves
the table allows."""

from __future__ import annotations

import pytest

from vsup.engine.intent import (
    TRANSITIONS,
    IllegalIntent,
    Intent,
    IntentCell,
    Kind,
    Restart,
    Run,
    Stop,
    check,
    kind_of,
)
from vsup.states import ExitReason

from tests.factories import instance_spec


def test_an_instance_starts_out_wanting_nothing():
    cell = IntentCell()
    assert cell.intent == Stop() and not cell.wants_run and cell.end_asked


def test_a_start_then_a_stop_with_a_drain():
    cell = IntentCell()
    cell.start()
    assert cell.intent == Run() and cell.wants_run and not cell.end_asked
    cell.stop(drain=True, drain_timeout_s=5.0)
    assert cell.intent == Stop(True, 5.0) and cell.drain == (True, 5.0)  # type: ignore[comparison-overlap]  # mypy keeps cell.intent narrowed across cell.stop()


def test_a_restart_is_pending_until_the_runner_takes_it_with_its_spec():
    cell = IntentCell()
    cell.start()
    new = instance_spec(port=8001)
    cell.restart(drain=True, spec=new)
    assert cell.wants_run and cell.end_asked and cell.pending_spec == new
    cell.start()  # a person's start meanwhile: the run it ends is still to end
    assert isinstance(cell.intent, Restart)
    assert cell.take() == new
    assert cell.intent == Run() and cell.pending_spec is None  # type: ignore[comparison-overlap]  # mypy keeps cell.intent narrowed across cell.start()
    assert cell.take() is None  # a plain start: nothing to take


def test_a_second_restart_keeps_the_first_ones_spec_unless_it_brings_one():
    cell = IntentCell()
    cell.start()
    first, second = instance_spec(port=8001), instance_spec(port=8002)
    cell.restart(spec=first)
    cell.restart(drain=True)  # a person's restart after an apply's
    assert cell.intent == Restart(drain=True, spec=first)
    cell.restart(spec=second)
    assert cell.pending_spec == second
    cell.drop_spec()  # the instance took a spec directly (an update)
    assert isinstance(cell.intent, Restart) and cell.pending_spec is None


def test_a_stall_restart_ends_the_run_as_stalled_and_only_from_a_plain_run():
    cell = IntentCell()
    with pytest.raises(IllegalIntent, match="stop -> stall"):
        cell.stall_restart("no token for 60 s")
    cell.start()
    cell.stall_restart("no token for 60 s")
    assert cell.stall is not None and cell.stall.cause == ExitReason.STALLED
    assert cell.wants_run and not cell.end_asked  # it ends as `stalled`, not as asked
    with pytest.raises(IllegalIntent, match="stall -> stall"):
        cell.stall_restart("again")
    cell.restart()  # a person's restart outranks it
    assert cell.stall is None and cell.end_asked
    with pytest.raises(IllegalIntent, match="restart -> stall"):
        cell.stall_restart("again")


def test_the_policy_giving_up_stops_a_run_but_not_a_persons_pending_restart():
    cell = IntentCell()
    cell.start()
    cell.give_up()
    assert cell.intent == Stop()
    cell.start()
    cell.stall_restart("stalled")
    cell.give_up()  # the stalled run's exit tripped the breaker
    assert cell.intent == Stop()
    cell.start()
    cell.restart(spec=instance_spec(port=8001))
    cell.give_up()  # the run before the restart failed: the restart (and its spec) still runs
    assert isinstance(cell.intent, Restart) and cell.pending_spec == instance_spec(port=8001)
    cell.stop()  # the engine's own stop outranks every wish
    assert cell.intent == Stop()


def test_taking_a_start_while_nothing_should_run_is_a_bug():
    with pytest.raises(IllegalIntent, match="take"):
        IntentCell().take()


def test_every_kind_has_its_moves_and_illegal_ones_raise():
    assert set(TRANSITIONS) == set(Kind)
    values: dict[Kind, Intent] = {
        Kind.STOP: Stop(),
        Kind.RUN: Run(),
        Kind.RESTART: Restart(),
        Kind.STALL: Restart(cause=ExitReason.STALLED, why="x"),
    }
    for old, new in ((a, b) for a in Kind for b in Kind):
        allowed = new in TRANSITIONS[old] or (old == new and old != Kind.STALL)
        if allowed:
            check(values[old], values[new], "test")
        else:
            with pytest.raises(IllegalIntent):
                check(values[old], values[new], "test")
    assert {kind_of(v) for v in values.values()} == set(Kind)
