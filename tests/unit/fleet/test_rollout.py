"""Which of a node's instances ended the fleet rollout there, read from its status JSON."""

from __future__ import annotations

from vsup.answers import ApplyPlan
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


def test_a_router_restart_on_a_node_needs_consent_as_in_vsup_up(capsys, monkeypatch):
    """A `[router]` change restarts a node's serving router (its endpoint is down a second or
    more): `vsup fleet up` names it in the plan line and refuses it without a terminal."""
    import io

    from vsup.commands import exits, fleet
    from vsup.fleet.model import Node
    from vsup.fleet.rollout import NodePlan, serving_of

    status = {"instances": [instance("a", "ready")], "router": {"state": "ready"}}
    serving = serving_of(status)
    plan = ApplyPlan(unchanged=("a",), router="restart")
    node = NodePlan(Node(name="n1", ssh="n1"), plan=plan, serving=serving)
    assert node.interrupts == ["@router"]
    assert fleet.plan_line(plan, serving) == "unchanged: a; router: restart (serving)"
    # a router that does not serve (failed, stopped) is not interrupted by its restart
    idle = serving_of({"instances": [], "router": {"state": "failed"}})
    assert NodePlan(Node(name="n1", ssh="n1"), plan=plan, serving=idle).interrupts == []

    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    assert fleet.confirm({"n1": node.interrupts}) == exits.NOT_CONFIRMED
    assert "(n1: @router (the router))" in capsys.readouterr().err
