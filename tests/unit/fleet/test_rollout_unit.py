"""`vsup fleet up` of a server across nodes (docs/fleet.md, "Started through each node's
daemon"): the unit's nodes get the layout at once, each its own text, and are followed
together, because neither a head nor a follower becomes ready alone; other nodes still roll one
at a time. A fake fleet client stands in for SSH and the nodes' daemons."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

from vsup.answers import ApplyAnswer, ApplyPlan
from vsup.fleet.model import Node
from vsup.fleet.query import FleetClient
from vsup.fleet.rollout import NodePlan, roll


@dataclass
class _Fleet:
    timeout_s: float = 1.0


@dataclass
class _FleetClient:
    """Each node's daemon: an apply is recorded; its instance is ready only once every node
    of the unit was applied (as a head waits for its ranks, and a follower for its head)."""

    unit: set[str]
    log: list[str] = field(default_factory=list)
    applied: dict[str, str] = field(default_factory=dict)
    fleet: _Fleet = field(default_factory=_Fleet)

    async def call(self, node: Node, fn: Any, timeout: float | None = None) -> tuple[Any, None]:
        return await fn(_NodeClient(self, node.name)), None


@dataclass
class _NodeClient:
    fc: _FleetClient
    name: str

    async def apply(self, toml: str, path: str | None = None) -> ApplyAnswer:
        self.fc.log.append(f"apply {self.name}")
        self.fc.applied[self.name] = toml
        return ApplyAnswer(plan=ApplyPlan(start=("big",)), errors=(), warnings=(), applied=True)

    async def status(self) -> dict[str, Any]:
        whole = self.name not in self.fc.unit or self.fc.unit <= set(self.fc.applied)
        state = "ready" if self.name in self.fc.applied and whole else "starting"
        self.fc.log.append(f"status {self.name} {state}")
        return {"instances": [{"name": "big", "state": state}], "rollout": None}


def fake(fc: _FleetClient) -> FleetClient:
    return cast(FleetClient, fc)


async def test_a_units_nodes_are_applied_at_once_each_with_its_own_text():
    nodes = [Node(name=n, ssh=n) for n in ("n0", "gpu01", "gpu02", "n3")]
    plans = [NodePlan(n, toml=f"layout for {n.name}") for n in nodes]
    fc = _FleetClient(unit={"gpu01", "gpu02"})
    said: list[str] = []
    outcomes = await roll(
        fake(fc), plans, "layout", "unit", 5.0, said.append, together={"gpu01", "gpu02"}
    )
    assert [(o.node, o.state) for o in outcomes] == [
        ("n0", "applied"),
        ("gpu01", "applied"),
        ("gpu02", "applied"),
        ("n3", "applied"),
    ]
    applies = [line for line in fc.log if line.startswith("apply")]
    assert applies == ["apply n0", "apply gpu01", "apply gpu02", "apply n3"]
    # n0 serves before the unit is touched; both of the unit's nodes are applied before
    # either is waited for; n3 only after the unit serves
    assert fc.log.index("status n0 ready") < fc.log.index("apply gpu01")
    assert fc.log.index("apply gpu02") < min(
        i for i, line in enumerate(fc.log) if line.startswith("status gpu")
    )
    assert fc.log.index("apply n3") > fc.log.index("status gpu02 ready")
    assert fc.applied == {n.name: f"layout for {n.name}" for n in nodes}


async def test_one_node_at_a_time_would_never_bring_a_unit_up():
    """Without `together` the head's node would be waited for before the follower's is even
    applied: it is never ready, and the rollout fails at its deadline."""
    nodes = [Node(name=n, ssh=n) for n in ("gpu01", "gpu02")]
    fc = _FleetClient(unit={"gpu01", "gpu02"})
    outcomes = await roll(fc, [NodePlan(n) for n in nodes], "layout", "unit", 0.3, lambda s: None)  # type: ignore[arg-type]
    assert [(o.node, o.state) for o in outcomes] == [("gpu01", "failed"), ("gpu02", "untouched")]
    assert "not ready within" in (outcomes[0].why or "")
