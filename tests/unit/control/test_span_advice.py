"""Advice for the faults of a server across nodes (docs/fleet.md, "Faults"): a follower that
waits for its head, a follower's start that timed out (the head is what did not come), and a
port taken on the head's node. Plain data: the member's status as the daemon reports it."""

from __future__ import annotations

from vsup.control.advice import AdviceInputs, compute_advice
from vsup.engine.spanwatch import waiting_words
from vsup.layout.spec import SpanRole
from vsup.snapshot import (
    SPAN_HEAD_WAIT,
    InstanceStatus,
    LastExit,
    LifecycleStatus,
    SpanNodeStatus,
    SpanStatus,
    WaitReason,
)
from vsup.states import State

NODES = (SpanNodeStatus("gpu01", 0, 1), SpanNodeStatus("gpu02", 1, 1))
ROLE = SpanRole(
    node="gpu02",
    head=False,
    start_rank=1,
    ranks=1,
    members=(("gpu01", 1), ("gpu02", 1)),
    address="10.0.0.1",
    rpc_port=13345,
    port=8000,
)


def member(node: str, **life) -> InstanceStatus:
    part = next(n for n in NODES if n.node == node)
    span = SpanStatus(node, node == "gpu01", part.start_rank, 1, 2, NODES, "10.0.0.1", 8000)
    return InstanceStatus(name="big", lifecycle=LifecycleStatus(**life), port=8000, span=span)


def advice_of(inst: InstanceStatus):
    return compute_advice([inst], [], AdviceInputs(recent_failures={}))


def test_a_follower_waiting_for_its_head_is_said_with_the_head_and_its_address():
    wait = WaitReason(kind=SPAN_HEAD_WAIT, message=waiting_words(ROLE, head_ok=False))
    assert wait.message.startswith("its head gpu01 at 10.0.0.1:8000: no answer on /health yet")
    (a,) = advice_of(member("gpu02", state=State.STARTING, wait=wait))
    assert (a.kind, a.severity, a.instance) == ("span_head", "info", "big")
    assert "on gpu02, waiting for its head gpu01 at 10.0.0.1:8000" in a.message, a.message
    assert "`vsup logs big` on gpu01" in a.message


def test_an_old_head_that_still_answers_is_waited_out_in_words():
    words = waiting_words(ROLE, head_ok=True)
    assert words.startswith("its head gpu01 at 10.0.0.1:8000 to start again"), words


def test_no_wait_no_advice():
    assert advice_of(member("gpu02", state=State.STARTING)) == ()
    assert advice_of(member("gpu02", state=State.READY)) == ()


def test_a_followers_start_timeout_names_its_node_and_its_head():
    timed_out = LastExit(None, "SIGTERM", "startup_timeout", "2026-12-06T08:00:00Z", None)
    (a,) = advice_of(
        member("gpu02", state=State.BACKOFF, last_exit=timed_out, start_timeout_s=600.0)
    )
    assert a.kind == "start_timeout"
    assert "this node (gpu02) runs ranks of a server across nodes" in a.message, a.message
    assert "its head gpu01 at 10.0.0.1:8000" in a.message
    assert "`vsup logs big` on gpu01" in a.message


def test_a_port_taken_on_the_heads_node_says_which_node():
    taken = LastExit(1, None, "port_in_use", "2026-12-06T08:00:00Z", None)
    (a,) = advice_of(
        member(
            "gpu01",
            state=State.FAILED,
            last_exit=taken,
            failed_why="the restart policy gave up: port_in_use recurs",
        )
    )
    assert a.kind == "crash_loop" and a.severity == "critical"
    assert "port 8000 on gpu01 is taken by another process (gpu01 runs the head" in a.message
    assert "its followers on gpu02 wait for it" in a.message
    assert "`ss -ltnp 'sport = :8000'` there" in a.message and "vsup fleet up" in a.message
