"""`vsup fleet events [-f]`: the nodes' journals (GET /v1/events) merged by time.

Each node's journal keeps its own `seq`; the merge orders by the events' `t` (UTC, ISO 8601)
within each round of reads, so a follow shows every node's events as they come, a second at
most after they happen. A node that stops answering is said once, and again when it is back;
its events are read from where it left off (nothing is skipped while it was away). The command
(commands/fleet.py) says each event in `vsup events`' words.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from vsup.fleet.http import NodeClient
from vsup.fleet.model import Node
from vsup.fleet.query import FleetClient

# `since` beyond any journal: the answer is empty and its `next` is where the journal ends.
END = 2**62


class Merger:
    """Per node, where its journal was read up to; `round()` reads every node once."""

    def __init__(self, fc: FleetClient, nodes: list[Node]) -> None:
        self.fc = fc
        self.nodes = nodes
        self.next: dict[str, int | None] = {n.name: None for n in nodes}
        self.down: dict[str, str] = {}

    async def _read(self, node: Node, tail: int) -> list[dict[str, Any]]:
        nxt = self.next[node.name]

        async def read(c: NodeClient) -> list[dict[str, Any]]:
            since = nxt
            if since is None:
                end = await c.events(since=END)
                since = max(0, int(end["next"]) - tail)
            out: list[dict[str, Any]] = []
            while True:
                doc = await c.events(since=since, limit=1000)
                out.extend(doc["events"])
                since = int(doc["next"])
                if len(doc["events"]) < 1000:
                    break
            self.next[node.name] = since
            return out

        events, _ = await self.fc.call(node, read, timeout=self.fc.fleet.timeout_s * 2)
        for ev in events:
            ev["node"] = node.name
        return events

    async def round(self, tail: int, note: Callable[[str], None]) -> list[dict[str, Any]]:
        """New events of every node, merged by time; `note` hears of nodes going and coming."""
        results = await asyncio.gather(
            *(
                asyncio.wait_for(self._read(n, tail), self.fc.fleet.timeout_s * 3)
                for n in self.nodes
            ),
            return_exceptions=True,
        )
        merged: list[dict[str, Any]] = []
        for node, res in zip(self.nodes, results, strict=True):
            if isinstance(res, BaseException):
                why = str(res) or type(res).__name__
                if node.name not in self.down:
                    note(f"{node.name}: not answering: {why}")
                self.down[node.name] = why
                continue
            if node.name in self.down:
                note(f"{node.name}: answering again")
                del self.down[node.name]
            merged.extend(res)
        merged.sort(key=lambda e: (str(e.get("t", "")), e.get("node", ""), e.get("seq", 0)))
        return merged
