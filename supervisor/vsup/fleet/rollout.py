"""`vsup fleet up`: one layout rolled over several nodes, one node at a time (and `vsup fleet
rollback`: each node's own previous layout, the same way).

First every target is asked for a dry run (in parallel; a node whose daemon does not run gets
one started by its own `vsup daemon --detach`): a layout that one node refuses, or a node that
cannot be reached, changes nothing anywhere. Then node by node: `POST /v1/apply` (the node's own
rolling apply, in waves as `vsup up` does), and its status is followed until its rollout has
ended and every instance of the plan is ready. The first node that fails stops the fleet
rollout; the nodes after it are not touched. `outcomes` says which node runs which layout.

A server across nodes (a layout's `span`) is one unit: its head waits for every rank before it
answers, so its nodes cannot become ready one after the other. When the rollout reaches the
first of them, all of them get the layout at once (each with `[layout] node` set to its name:
`texts`), and then each is followed until it serves.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from vsup.answers import ApplyAnswer, ApplyPlan, Problem
from vsup.control.errors import ControlError
from vsup.fleet.http import NodeClient
from vsup.fleet.model import Node
from vsup.fleet.query import FleetClient
from vsup.fleet.transport import NoDaemon
from vsup.states import NodeOutcome, PullState, RolloutState, State

# States in which an instance answers requests: stopping or restarting it interrupts service.
SERVING = ("ready", "unhealthy")
WAITED_KEYS = ("start", "restart", "update", "unchanged")
ROUTER = "@router"  # a serving router in `NodePlan.serving` and in the consent, as in `vsup up`
ROUTER_DOWN = ("restart", "stop")  # router plans that take its endpoint down


def serving_of(status: dict[str, Any]) -> set[str]:
    """The names that answer requests on a node now (`@router` for its serving router)."""
    names = {i["name"] for i in status.get("instances", ()) if i.get("state") in SERVING}
    if (status.get("router") or {}).get("state") in SERVING:
        names.add(ROUTER)
    return names


@dataclass(frozen=True)
class Rollback:
    """The kept layout a node goes back to (`vsup fleet rollback`; a node's `GET /v1/layouts`
    entry): its journal `seq`, text, name, the file it came from and when it was applied."""

    seq: int
    toml: str
    name: str | None = None
    path: str | None = None
    t: str | None = None


@dataclass
class NodePlan:
    """A node's dry run of the layout, and what runs there now."""

    node: Node
    plan: ApplyPlan | None = None
    errors: list[Problem] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)
    serving: set[str] = field(default_factory=set)
    layout: str | None = None  # the layout it runs now
    error: str | None = None  # unreachable, or no daemon could be started
    # `vsup fleet rollback`: each node's own kept layout (fleet/rollback.py); None: the
    # fleet's layout, the same text everywhere
    target: Rollback | None = None
    toml: str | None = None  # the text this node gets (its own with a span); None: the layout

    @property
    def interrupts(self) -> list[str]:
        """The serving instances the plan stops or restarts, in plan order; then `@router`
        when it restarts or stops the node's serving router (a `[router]` change: every
        request through it fails meanwhile), as `vsup up` asks."""
        plan = self.plan or ApplyPlan()
        names = [n for n in (*plan.stop, *plan.restart) if n in self.serving]
        if plan.router in ROUTER_DOWN and ROUTER in self.serving:
            names.append(ROUTER)
        return names


@dataclass
class Outcome:
    """Where a node stands after the fleet rollout: `applied`, `failed`, `untouched`."""

    node: str
    state: str
    layout: str | None  # the layout it runs now (the new one once applied, even if failed)
    why: str | None = None
    seconds: float | None = None


async def _plan_one(fc: FleetClient, node: Node, toml: str) -> NodePlan:
    out = NodePlan(node, toml=toml)

    async def dry(c: NodeClient) -> tuple[ApplyAnswer, dict[str, Any]]:
        return await c.apply(toml, None, dry_run=True), await c.status()

    try:
        try:
            (answer, status), _ = await fc.call(node, dry, timeout=60)
        except NoDaemon:
            await fc.transport.start_daemon(node)
            (answer, status), _ = await fc.call(node, dry, timeout=60)
    except Exception as exc:  # unreachable, refused: the node cannot take part
        out.error = str(exc) or type(exc).__name__
        return out
    out.plan = answer.plan
    out.errors = list(answer.errors)
    out.warnings = list(answer.warnings)
    out.serving = serving_of(status)
    out.layout = (status.get("supervisor") or {}).get("layout")
    return out


async def _plan_rollback(
    fc: FleetClient, node: Node, pick: Callable[[dict[str, Any]], Rollback]
) -> NodePlan:
    """A node's own previous layout (`pick` chooses it from the node's kept layouts, or
    raises ValueError saying why there is none) and its dry run. A node without a daemon
    cannot take part: the kept layouts are its daemon's (none is started)."""
    out = NodePlan(node)

    async def dry(c: NodeClient) -> tuple[Rollback, ApplyAnswer, dict[str, Any]]:
        target = pick(await c.layouts())
        answer = await c.apply(target.toml, target.path, dry_run=True)
        return target, answer, await c.status()

    try:
        (target, answer, status), _ = await fc.call(node, dry, timeout=60)
    except Exception as exc:  # unreachable, no daemon, nothing to go back to
        out.error = str(exc) or type(exc).__name__
        return out
    out.target = target
    out.plan = answer.plan
    out.errors = list(answer.errors)
    out.warnings = list(answer.warnings)
    out.serving = serving_of(status)
    out.layout = (status.get("supervisor") or {}).get("layout")
    return out


async def plan_rollbacks(
    fc: FleetClient, nodes: list[Node], pick: Callable[[dict[str, Any]], Rollback]
) -> list[NodePlan]:
    """Every target's previous layout and its dry run, in parallel, in the order given."""
    return list(await asyncio.gather(*(_plan_rollback(fc, n, pick) for n in nodes)))


async def plan_all(
    fc: FleetClient, nodes: list[Node], toml: str, texts: dict[str, str] | None = None
) -> list[NodePlan]:
    """Every target's dry run, in parallel, in the order given; `texts`: each node's own text
    of the layout (by node name), else `toml` for all."""
    return list(
        await asyncio.gather(*(_plan_one(fc, n, (texts or {}).get(n.name, toml)) for n in nodes))
    )


def rollout_line(r: dict[str, Any]) -> str:
    """'rollout wave 2/3: restarting b1 (1/3 done)' (as `vsup up` says it)."""
    head = f"rollout wave {r.get('wave')}/{r.get('waves')}"
    if r.get("state") == RolloutState.RUNNING:
        doing = f"restarting {', '.join(r.get('current') or ())}" if r.get("current") else "waiting"
        return f"{head}: {doing} ({r.get('done')}/{r.get('total')} done)"
    if r.get("state") == RolloutState.FAILED:
        return f"rollout failed: {r.get('failure')}"
    return f"rollout {r.get('state')} ({r.get('done')}/{r.get('total')} restarted)"


def _failed_instance(doc: dict[str, Any], names: set[str]) -> str | None:
    for i in doc.get("instances", ()):
        if i["name"] not in names:
            continue
        pull = i.get("pull") or {}
        if pull.get("state") == PullState.FAILED:
            # the daemon leaves the instance stopped until the next apply: waiting for it to
            # become ready would only wait out --timeout
            return (
                f"instance {i['name']} not started: the pull of {pull.get('model')} failed "
                f"({pull.get('reason')}): {pull.get('message')}"
            )
        if i.get("state") == State.FAILED:
            le = i.get("last_exit") or {}
            why = i.get("failed_why") or le.get("reason") or "failed"
            return f"instance {i['name']} failed: {why}"
    return None


async def apply_and_wait(
    fc: FleetClient,
    node: Node,
    toml: str,
    timeout: float,
    say: Callable[[str], None],
    interval: float = 0.5,
    target: Rollback | None = None,
) -> str | None:
    """Apply on one node and wait until it serves the layout; None when it does, else why not.
    `target`: a rollback's kept layout (its text and path instead of `toml`, and its seq
    journaled with the apply; a daemon older than that key gets the plain apply)."""
    applied = await apply_one(fc, node, toml, target)
    if isinstance(applied, str):
        return applied
    return await wait_served(fc, node, *applied, time.monotonic() + timeout, say, interval)


async def apply_one(
    fc: FleetClient, node: Node, toml: str, target: Rollback | None = None
) -> tuple[set[str], bool] | str:
    """`POST /v1/apply` on one node: (the names to wait for, whether it rolls), else why the
    node refused."""

    async def apply(c: NodeClient) -> ApplyAnswer:
        if target is None:
            return await c.apply(toml, None)
        try:
            return await c.apply(target.toml, target.path, rollback_of=target.seq)
        except ControlError as exc:
            if exc.status != 400 or "'rollback_of'" not in str(exc):
                raise
        return await c.apply(target.toml, target.path)

    answer, _ = await fc.call(node, apply, timeout=120)
    if answer.errors:
        return "refused the layout: " + "; ".join(str(e) for e in answer.errors)
    plan = answer.plan or ApplyPlan()
    return {n for k in WAITED_KEYS for n in getattr(plan, k)}, bool(plan.rolling)


async def wait_served(
    fc: FleetClient,
    node: Node,
    names: set[str],
    rolling: bool,
    deadline: float,
    say: Callable[[str], None],
    interval: float = 0.5,
) -> str | None:
    """Follow a node's status until its rollout ended and every one of `names` is ready; None
    then, else why not (a failure, or `deadline` passed)."""
    timeout = max(0.0, deadline - time.monotonic())
    shown: str | None = None
    while True:
        doc, _ = await fc.call(node, lambda c: c.status(), timeout=fc.fleet.timeout_s * 2)
        r = doc.get("rollout") if rolling else None
        if r:
            line = rollout_line(r)
            if line != shown:
                say(line)
                shown = line
            if r.get("state") == RolloutState.FAILED:
                return str(r.get("failure") or "its rollout failed")
        failed = _failed_instance(doc, names)
        if failed:
            return failed
        states = {i["name"]: i.get("state") for i in doc.get("instances", ())}
        rolled = not r or r.get("state") != RolloutState.RUNNING
        if rolled and all(states.get(n) == State.READY for n in names):
            return None
        if time.monotonic() > deadline:
            waiting = sorted(n for n in names if states.get(n) != State.READY)
            return f"not ready within {timeout:.0f} s: " + ", ".join(
                f"{n} {states.get(n)}{_waits_for(doc, n)}" for n in waiting
            )
        await asyncio.sleep(interval)


def _waits_for(doc: dict[str, Any], name: str) -> str:
    """` (waits for ...)`: what instance `name`'s start waits for (a span's follower: its
    head), when its status says; else nothing."""
    for i in doc.get("instances", ()):
        if i.get("name") == name:
            message = (i.get("wait") or {}).get("message")
            return f" (waits for {message})" if message else ""
    return ""


async def _roll_unit(
    fc: FleetClient,
    plans: list[NodePlan],
    toml: str,
    timeout: float,
    say: Callable[[str], None],
) -> list[str | None]:
    """The nodes of a server across nodes: the layout applied on all of them (in the order
    given), then each followed until it serves; one answer per node, as `apply_and_wait`'s."""
    deadline = time.monotonic() + timeout
    applied: list[tuple[set[str], bool] | str] = []
    for p in plans:
        say(f"{p.node.name}: applying")
        try:
            applied.append(await apply_one(fc, p.node, p.toml or toml))
        except Exception as exc:  # the node went away mid-way
            applied.append(f"lost contact: {exc}")

    async def follow(p: NodePlan, a: tuple[set[str], bool] | str) -> str | None:
        if isinstance(a, str):
            return a

        def said(text: str, n: str = p.node.name) -> None:
            say(f"{n}: {text}")

        try:
            return await wait_served(fc, p.node, *a, deadline, said)
        except Exception as exc:
            return f"lost contact: {exc}"

    return list(await asyncio.gather(*(follow(p, a) for p, a in zip(plans, applied, strict=True))))


async def roll(
    fc: FleetClient,
    plans: list[NodePlan],
    toml: str,
    layout_name: str | None,
    timeout: float,
    say: Callable[[str], None],
    together: set[str] | frozenset[str] = frozenset(),
) -> list[Outcome]:
    """Apply node by node; stop at the first failure. One Outcome per node, in order. The
    nodes in `together` (a server across nodes) go at once, where the first of them comes."""
    outcomes: list[Outcome] = []
    failed = False
    unit_done: dict[str, Outcome] = {}
    for p in plans:
        name = p.node.name
        if failed and name not in unit_done:
            outcomes.append(Outcome(name, "untouched", p.layout, "the fleet rollout stopped"))
            continue
        if name in together:
            if not unit_done:
                unit = [q for q in plans if q.node.name in together]
                t0 = time.monotonic()
                answers = await _roll_unit(fc, unit, toml, timeout, say)
                took = round(time.monotonic() - t0, 1)
                for q, why in zip(unit, answers, strict=True):
                    n = q.node.name
                    if why is None:
                        say(f"{n}: serves {layout_name or 'the layout'} ({took:.0f} s)")
                        unit_done[n] = Outcome(n, "applied", layout_name, None, took)
                    else:
                        say(f"{n}: FAILED: {why}")
                        unit_done[n] = Outcome(n, "failed", layout_name, why, took)
                failed = failed or any(o.state == NodeOutcome.FAILED for o in unit_done.values())
            outcomes.append(unit_done[name])
            continue
        say(f"{name}: applying")
        t0 = time.monotonic()

        def said(text: str, n: str = name) -> None:
            say(f"{n}: {text}")

        try:
            why = await apply_and_wait(fc, p.node, p.toml or toml, timeout, said, target=p.target)
        except Exception as exc:  # the node went away mid-way
            why = f"lost contact: {exc}"
        took = round(time.monotonic() - t0, 1)
        goes_to = p.target.name if p.target is not None else layout_name
        if why is None:
            say(f"{name}: serves {goes_to or 'the layout'} ({took:.0f} s)")
            outcomes.append(Outcome(name, "applied", goes_to, None, took))
        else:
            say(f"{name}: FAILED: {why}")
            outcomes.append(Outcome(name, "failed", goes_to, why, took))
            failed = True
    return outcomes
