"""Engine API behaviour that needs no process."""

import pytest

from vsup.engine import AdoptRecord, ApplyPlan, Engine, UnknownInstance
from vsup.journalevents import AdoptEvent, JournalEvent
from vsup.states import State

from tests.factories import instance_spec
from tests.support.clock import FakeClock


async def test_unknown_instance_names_it(tmp_path):
    engine = Engine(FakeClock(), tmp_path)
    with pytest.raises(UnknownInstance, match="no instance named 'nope'"):
        await engine.start("nope")
    with pytest.raises(KeyError):
        await engine.stop("nope")


def test_diff_of_an_empty_engine_starts_everything_in_layout_order(tmp_path):
    engine = Engine(FakeClock(), tmp_path)
    plan = engine.diff([instance_spec("b"), instance_spec("a", port=8001)])
    assert plan == ApplyPlan(start=("b", "a"))
    assert plan.to_json() == {
        "start": ["b", "a"],
        "restart": [],
        "stop": [],
        "unchanged": [],
        "update": [],
        "rolling": [],
    }


def test_diff_refuses_two_instances_of_one_name(tmp_path):
    with pytest.raises(ValueError, match="two instances are named 'a'"):
        Engine(FakeClock(), tmp_path).diff([instance_spec("a"), instance_spec("a")])


def test_adopt_record_round_trips_through_json():
    rec = AdoptRecord(10, 1700000000.25, 10, 8000, 3, restarts=2, descendants={11: 1700000001.5})
    assert AdoptRecord.from_json(rec.to_json()) == rec


async def test_adopting_a_gone_pid_registers_a_stopped_instance(tmp_path):
    events: list[JournalEvent] = []
    engine = Engine(FakeClock(), tmp_path, events.append)
    assert engine.adopt(instance_spec("a"), AdoptRecord(2**22 + 7, 1.0, 2**22 + 7, 8000, 4)) is None
    inst = engine.instances["a"]
    assert (inst.state, inst.run, inst.last_exit.reason) == ("stopped", 4, "unknown")
    assert [e.kind for e in events] == ["adopt", "exit"]
    adopt = events[0]
    assert isinstance(adopt, AdoptEvent) and "is gone" in (adopt.why or "")
    await engine.shutdown(stop_instances=True)


async def test_stopping_a_never_started_instance_changes_nothing(tmp_path):
    engine = Engine(FakeClock(), tmp_path)
    engine.adopt(instance_spec("a"), AdoptRecord(2**22 + 7, 1.0, 2**22 + 7, 8000, 1))
    await engine.stop("a")
    assert engine.instances["a"].state == "stopped"
    await engine.shutdown(stop_instances=False)


async def test_restore_registers_an_idle_instance_as_the_state_file_had_it(tmp_path):
    from vsup.snapshot import LastExit

    engine = Engine(FakeClock(), tmp_path)
    last = LastExit(1, None, "oom", "2026-01-01T00:00:00.000Z", "CUDA out of memory")
    why = "the restart policy gave up: 5 consecutive failures (max_failures = 5)"
    inst = engine.restore(
        instance_spec("a"), State.FAILED, run=7, restarts=3, last_exit=last, failed_why=why
    )
    assert (inst.state, inst.run, inst.restarts, inst.last_exit) == ("failed", 7, 3, last)
    assert inst.failed_why == why and inst.status_fields()["failed_why"] == why
    # a state file of an older vsup has no why: the instance still says something
    old = engine.restore(instance_spec("c"), State.FAILED)
    assert old.failed_why == "it was failed when the previous daemon stopped"
    assert not inst.supervised and inst.log_path() == tmp_path / "a" / "run-0007.log"
    assert engine.diff([instance_spec("a")]).start == ("a",)
    with pytest.raises(ValueError):
        engine.restore(instance_spec("b"), State.READY)


async def test_status_names_the_model_as_vllm_serves_it(tmp_path):
    from vsup.snapshot import empty_instance

    engine = Engine(FakeClock(), tmp_path)
    named = engine.restore(instance_spec("a", args={"served-model-name": "tiny"}), State.STOPPED)
    plain = engine.restore(instance_spec("b", port=8001), State.STOPPED)
    assert named.status_fields()["served_model_name"] == "tiny"
    assert plain.status_fields()["served_model_name"] is None
    assert empty_instance(**named.status_fields()).served_model_name == "tiny"
