"""A node not ready when `vsup fleet up`'s deadline passes says what its instance waits for:
a span's follower names its head (docs/fleet.md, "Faults: states and advice"). A fake fleet
client stands in for SSH and the node's daemon; the status answer is the daemon's shape."""

from __future__ import annotations

from typing import Any, cast

from vsup.fleet.model import Node
from vsup.fleet.query import FleetClient
from vsup.fleet.rollout import wait_served


class _Fleet:
    timeout_s = 1.0


class _FleetClient:
    fleet = _Fleet()

    def __init__(self, instance: dict[str, Any]) -> None:
        self.instance = instance

    async def call(self, node: Node, fn: Any, timeout: float | None = None) -> tuple[Any, None]:
        return {"instances": [self.instance], "rollout": None}, None


async def test_a_follower_not_ready_at_the_deadline_names_what_it_waits_for():
    head = "its head gpu01 at 10.0.0.1:8000: no answer on /health yet"
    follower = {"name": "big", "state": "starting", "wait": {"kind": "span_head", "message": head}}
    fc = cast(FleetClient, _FleetClient(follower))
    why = await wait_served(fc, Node("gpu02", "gpu02"), {"big"}, False, 0.0, lambda s: None)
    assert why == f"not ready within 0 s: big starting (waits for {head})"


async def test_without_a_wait_the_state_alone_is_said():
    fc = cast(FleetClient, _FleetClient({"name": "big", "state": "starting", "wait": None}))
    why = await wait_served(fc, Node("gpu02", "gpu02"), {"big"}, False, 0.0, lambda s: None)
    assert why == "not ready within 0 s: big starting"
