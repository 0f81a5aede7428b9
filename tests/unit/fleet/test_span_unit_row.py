"""A server across nodes as one row of `vsup fleet status` (docs/fleet.md, "Seen as one row"),
from its members' status answers: each node's document is a real daemon's `status --json`
(tests/fixtures/status, an in-process daemon over vLLM emulators) whose instances are replaced
by the node's member, written the way the daemon writes one (`InstanceStatus.to_json`)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from vsup.fleet.units import NodeAnswer, units_of
from vsup.snapshot import InstanceStatus, LastExit, LifecycleStatus, SpanNodeStatus, SpanStatus
from vsup.states import State

RECORDED = Path(__file__).parents[2] / "fixtures" / "status" / "schema1-before-parts.json"
NODES = (SpanNodeStatus("gpu01", 0, 2), SpanNodeStatus("gpu02", 2, 1))


def member(node: str, state: State, **life: Any) -> dict[str, Any]:
    part = next(n for n in NODES if n.node == node)
    inst = InstanceStatus(
        name="big",
        lifecycle=LifecycleStatus(state=state, **life),
        port=8000,
        span=SpanStatus(
            node=node,
            head=node == "gpu01",
            start_rank=part.start_rank,
            ranks=part.ranks,
            size=3,
            nodes=NODES,
            address="10.0.0.1",
            port=8000,
        ),
    )
    return inst.to_json()


def node_doc(*instances: dict[str, Any]) -> dict[str, Any]:
    doc: dict[str, Any] = copy.deepcopy(json.loads(RECORDED.read_text())["daemon"])
    doc["instances"] = [*doc["instances"][:1], *instances]  # an instance of its own too
    return json.loads(json.dumps(doc))  # as it comes over the wire


def test_every_member_ready_makes_the_unit_ready_with_its_members_in_rank_order():
    (unit,) = units_of(
        [
            NodeAnswer("gpu02", node_doc(member("gpu02", State.READY))),
            NodeAnswer("gpu01", node_doc(member("gpu01", State.READY))),
        ]
    )
    assert (unit.instance, unit.head, unit.state, unit.text) == ("big", "gpu01", "ready", "ready")
    assert unit.advice is None
    assert [(m.node, m.head, m.where, m.state) for m in unit.members] == [
        ("gpu01", True, "gpu01 ranks 0-1", "ready"),
        ("gpu02", False, "gpu02 rank 2", "ready"),
    ]
    doc = unit.to_json()
    assert doc["state"] == "ready" and doc["size"] == 3 and doc["address"] == "10.0.0.1"
    assert [m["node"] for m in doc["members"]] == ["gpu01", "gpu02"]


def test_a_starting_follower_names_the_units_state_with_its_node():
    (unit,) = units_of(
        [
            NodeAnswer("gpu01", node_doc(member("gpu01", State.READY))),
            NodeAnswer("gpu02", node_doc(member("gpu02", State.STARTING))),
        ]
    )
    assert unit.text == "starting: gpu02 rank 2 starting"
    assert unit.advice and "every member is ready" in unit.advice


def test_the_worst_member_names_the_unit_a_failed_one_with_its_reason():
    failed = member(
        "gpu01",
        State.FAILED,
        last_exit=LastExit(
            reason="port_in_use", code=1, signal=None, at="2026-12-06T08:00:00Z", log_excerpt=None
        ),
        failed_why="port_in_use fails fast",
    )
    (unit,) = units_of(
        [
            NodeAnswer("gpu01", node_doc(failed)),
            NodeAnswer("gpu02", node_doc(member("gpu02", State.STARTING))),
        ]
    )
    assert unit.text == "failed: gpu01 ranks 0-1 failed"
    assert unit.members[0].why == "port_in_use fails fast"
    assert "its head on gpu01 failed (port_in_use fails fast)" in (unit.advice or "")


def test_an_unreachable_member_node_makes_the_unit_down_with_advice():
    (unit,) = units_of(
        [
            NodeAnswer("gpu01", node_doc(member("gpu01", State.READY))),
            NodeAnswer("gpu02", None, reachable=False, why="ssh gpu02: Connection timed out"),
        ]
    )
    assert unit.state == "down" and unit.detail == "gpu02 unreachable"
    assert unit.text == "down: gpu02 unreachable"
    assert unit.members[1].state == "unreachable"
    assert unit.members[1].why == "ssh gpu02: Connection timed out"
    advice = unit.advice or ""
    assert "gpu02 (a follower, rank 2) cannot be reached over SSH" in advice, advice
    assert "Connection timed out" in advice and "`ssh gpu02`" in advice


def test_a_member_node_without_daemon_or_without_the_member_is_said():
    no_daemon = units_of(
        [
            NodeAnswer("gpu01", node_doc(member("gpu01", State.READY))),
            NodeAnswer("gpu02", None, reachable=True, why="no vsup daemon runs on gpu02"),
        ]
    )[0]
    assert no_daemon.text == "down: gpu02 rank 2: no daemon"
    assert "no vsup daemon runs on gpu02" in (no_daemon.advice or "")
    none_there = units_of(
        [
            NodeAnswer("gpu01", node_doc(member("gpu01", State.READY))),
            NodeAnswer("gpu02", node_doc()),
        ]
    )[0]
    assert none_there.text == "no member: gpu02 rank 2: no member"
    assert "`vsup fleet up LAYOUT`" in (none_there.advice or "")


def test_a_member_node_not_asked_leaves_the_unit_not_known_whole():
    (unit,) = units_of([NodeAnswer("gpu01", node_doc(member("gpu01", State.READY)))])
    assert unit.text == "not asked: gpu02 rank 2: not asked"


def test_nodes_without_a_span_make_no_unit():
    assert units_of([NodeAnswer("n1", node_doc()), NodeAnswer("n2", None, False, "down")]) == []


def test_a_follower_waiting_for_its_head_says_so_in_the_units_row():
    from vsup.snapshot import SPAN_HEAD_WAIT, WaitReason

    wait = WaitReason(
        kind=SPAN_HEAD_WAIT,
        message="its head gpu01 at 10.0.0.1:8000: no answer on /health yet (...)",
    )
    (unit,) = units_of(
        [
            NodeAnswer("gpu01", node_doc(member("gpu01", State.READY))),
            NodeAnswer("gpu02", node_doc(member("gpu02", State.STARTING, wait=wait))),
        ]
    )
    assert unit.text == (
        "starting: gpu02 rank 2 starting, waiting for its head gpu01 at 10.0.0.1:8000"
    ), unit.text
    assert "waiting for its head gpu01 at 10.0.0.1:8000: no answer" in (unit.advice or "")


def test_a_unit_is_counted_once_in_the_fleets_tokens_per_s_at_its_head():
    """A follower's daemon scrapes its head's /metrics (its base URL is the head's): the
    unit's throughput shows on both nodes' instances, and counts only at the head's node."""
    from vsup.fleet.view import summarize

    def with_rate(doc: dict[str, Any], rate: float) -> dict[str, Any]:
        return {**doc, "generation_tokens_per_s": rate}

    head = node_doc(with_rate(member("gpu01", State.READY), 120.0))
    follower = node_doc(with_rate(member("gpu02", State.READY), 120.0))
    own = head["instances"][0]["generation_tokens_per_s"] or 0.0  # the node's other instance
    assert summarize("gpu01", "gpu01", head).tokens_per_s == round(own + 120.0, 1)
    assert summarize("gpu02", "gpu02", follower).tokens_per_s == round(own, 1)
