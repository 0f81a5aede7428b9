"""Which of a node's instances ended the fleet rollout there, read from its status JSON."""

from __future__ import annotations

from vsup.fleet.rollout import _failed_instance


def instance(name: str, state: str, **extra: object) -> dict:
    return {"name": name, "state": state, "last_exit": None, "failed_why": None, **extra}


def test_a_failed_pull_fails_the_node_at_once_naming_the_instance_and_the_reason():
    pull = {
        "model": "org/m",
        "state": "failed",
        "reason": "network",
        "message": "the hub cannot be reached",
    }
    doc = {"instances": [instance("x", "stopped", pull=pull), instance("y", "starting")]}
    why = _failed_instance(doc, {"x", "y"})
    assert why == (
        "instance x not started: the pull of org/m failed (network): the hub cannot be reached"
    )
    # an instance outside the plan does not count; one still pulling is waited for
    assert _failed_instance(doc, {"y"}) is None
    pulling = {"instances": [instance("x", "stopped", pull=dict(pull, state="pulling"))]}
    assert _failed_instance(pulling, {"x"}) is None


def test_a_failed_instance_fails_the_node_with_its_reason():
    doc = {"instances": [instance("x", "failed", last_exit={"reason": "port_in_use"})]}
    assert _failed_instance(doc, {"x"}) == "instance x failed: port_in_use"
