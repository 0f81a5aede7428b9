"""A server across nodes watched as one unit, without vLLM (docs/fleet.md, "Watched as one"):
the head's probe of a rank that does not answer -> the head restarts, naming the rank and its
node; a follower starting behind an old head that still answers is not ready until that head
restarted; its head gone -> the follower is ended and restarts, saying why."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from vsup.control.stalls import StallActions
from vsup.engine.lifecycle import Lifecycle
from vsup.engine.spanwatch import HeadWatch, gone_why
from vsup.layout.compiled import compile_document
from vsup.layout.model import loads_layout
from vsup.layout.spec import InstanceSpec
from vsup.snapshot import empty_instance
from vsup.states import ExitReason, State

from tests.support.clock import FakeClock

LAYOUT = """[layout]
name = "unit"
node = "{node}"

[[instance]]
name = "big"
model = "acme/tiny-model"
command = ["python", "-m", "vllm.entrypoints.openai.api_server"]
gpus = []
port = 8000
stall_after_s = 15
span = {{ ranks = {{ gpu01 = 1, gpu02 = 1 }}, address = "10.0.0.1" }}
"""


def member(node: str) -> InstanceSpec:
    compiled, diagnostics = compile_document(loads_layout(LAYOUT.format(node=node), Path("/l")))
    assert compiled is not None, [d.format() for d in diagnostics]
    return compiled.specs[0]


@dataclass
class _Inst:
    spec: InstanceSpec


@dataclass
class _Engine:
    instances: dict
    restarted: list = field(default_factory=list)
    router: None = None

    def restart_stalled(self, name: str, why: str, rank: int | None = None) -> bool:
        self.restarted.append((name, why, rank))
        return True


def test_a_rank_that_does_not_answer_the_heads_probe_restarts_the_head_naming_its_node():
    head = member("gpu01")
    assert head.restart.on_stall and head.canary_interval_s > 0
    engine = _Engine({"big": _Inst(head)})
    events: list = []
    actions = StallActions(lambda ev: events.append(ev.kind), engine)
    answered = empty_instance("big", state="ready", run=1, stalled=False)
    actions.observe([answered])
    assert engine.restarted == []  # every rank answered: nothing to do
    hung = empty_instance(
        "big", state="ready", run=1, stalled=True, stalled_for_s=15.3,
        stall_evidence="canary", stalled_ranks=(1,),
    )  # fmt: skip
    actions.observe([hung])
    assert engine.restarted == [
        ("big", "rank 1 on gpu02 did not answer in 15 s (the unit restarts as one)", 1)
    ]
    assert events == ["stalled"]


def test_a_follower_does_not_watch_ranks_itself():
    """The head's daemon probes every rank; a follower has nothing to judge (no API server of
    its own), so it never restarts for a stall."""
    follower = member("gpu02")
    engine = _Engine({"big": _Inst(follower)})
    actions = StallActions(lambda ev: None, engine)
    assert follower.stall_after_s == 0 and not follower.restart.on_stall
    actions.observe([empty_instance("big", state="ready", run=1, stalled=None)])
    assert engine.restarted == []


def test_a_follower_is_ready_only_behind_a_head_that_started_after_it():
    # fleet up: the head is not up yet, then answers once every rank joined
    watch = HeadWatch()
    assert [watch.ready(ok) for ok in (False, False, True)] == [False, False, True]
    # the follower restarted while the old head still answers (it lies: a rank is gone)
    watch = HeadWatch()
    assert [watch.ready(ok) for ok in (True, True, True)] == [False, False, False]
    # ... until that head restarts: it goes away, and the new one answers
    assert [watch.ready(ok) for ok in (False, True)] == [False, True]
    # a run adopted from an earlier daemon joined whatever head answers
    assert HeadWatch(trusted=True).ready(True)


def test_a_ready_followers_head_gone_ends_it_to_join_the_next_head():
    follower = replace(member("gpu02"), unhealthy_after=3, unhealthy_grace_s=30.0)
    clock = FakeClock()
    lc = Lifecycle(follower, clock)
    lc.request_start()
    lc.spawned(1)
    assert lc.became_ready()
    # the head stops answering: a busy head gets its grace, a gone one is gone after it
    assert not lc.health_failed(None) and not lc.health_failed(None)
    assert not lc.health_failed(None)
    clock.advance(31)
    assert lc.health_failed(None)
    assert lc.state == State.UNHEALTHY and lc.unhealthy_cause == ExitReason.UNHEALTHY
    assert follower.span is not None
    assert gone_why(follower.span, None) == (
        "its head gpu01 at 10.0.0.1:8000 did not answer on /health: the head is gone or "
        "restarting, and a follower joins a head only at its start; restarting to join the "
        "head's next run"
    )
    # a head whose engine died says 503 at once: the follower goes after unhealthy_after checks
    lc2 = Lifecycle(follower, clock)
    lc2.request_start()
    lc2.spawned(1)
    lc2.became_ready()
    assert [lc2.health_failed(503) for _ in range(3)] == [False, False, True]
    assert lc2.unhealthy_cause == ExitReason.ENGINE_DEAD
    assert "said 503" in gone_why(follower.span, 503)
