"""Asking every node at once: `FleetClient` (tunnels from `transport`, control-API clients on
them) and the per-node health memory (reachable or not, since when, why).

Every node is asked in its own task under its own deadline: `timeout_s` for an answer over a
warm tunnel, plus `connect_timeout_s` when it has to connect first. A node that is down or
slow is reported as such when its deadline passes; it never holds up the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from vsup.control.errors import ControlError, DaemonUnavailable
from vsup.fleet.http import NodeClient
from vsup.fleet.model import Fleet, Node
from vsup.fleet.transport import NoDaemon, Transport, Tunnel, Unreachable
from vsup.fleet.units import NodeAnswer, UnitView, units_of
from vsup.fleet.view import NodeView, summarize, unreachable

T = TypeVar("T")


def now_iso(t: float | None = None) -> str:
    return (
        datetime.fromtimestamp(time.time() if t is None else t, UTC)
        .isoformat(timespec="seconds")
        .replace("+00:00", "Z")
    )


class Health:
    """Per node: whether its last query answered, since when, its last answer, why not.
    Kept in `RUN/health.json` so that each `vsup fleet status` can say "since"."""

    SAVE_EVERY_S = 30.0  # `last_seen` alone is written at most this often (the dashboard)

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.nodes: dict[str, dict[str, Any]] = {}
        self._changed = False  # a node went down or came back since the last save
        self._saved_at = 0.0
        if path is not None:
            with contextlib.suppress(OSError, ValueError):
                doc = json.loads(path.read_text())
                if isinstance(doc, dict):
                    self.nodes = {k: v for k, v in doc.items() if isinstance(v, dict)}

    def note(self, name: str, ok: bool, why: str | None = None) -> dict[str, Any]:
        """Record one query's outcome; the node's record (`since`, `last_seen`, `why`)."""
        stamp = now_iso()
        rec = self.nodes.get(name) or {}
        if rec.get("ok") is not ok or (not ok and rec.get("why") != why):
            self._changed = True
        if rec.get("ok") is not ok:
            rec = {"ok": ok, "since": stamp, "last_seen": rec.get("last_seen")}
        if ok:
            rec["last_seen"] = stamp
            rec.pop("why", None)
        else:
            rec["why"] = why
        self.nodes[name] = rec
        return rec

    def save(self, force: bool = False) -> None:
        """Write the records when a node changed state (or `SAVE_EVERY_S` passed)."""
        if self.path is None:
            return
        now = time.monotonic()
        if not (force or self._changed or now - self._saved_at >= self.SAVE_EVERY_S):
            return
        from vsup.fsutil import write_atomic

        with contextlib.suppress(OSError):
            write_atomic(self.path, json.dumps(self.nodes, indent=1), mode=0o600)
            self._changed = False
            self._saved_at = now


class FleetClient:
    """The fleet's nodes over SSH. Use `async with FleetClient(fleet) as fc`."""

    def __init__(
        self, fleet: Fleet, transport: Transport | None = None, remember: bool = True
    ) -> None:
        self.fleet = fleet
        self.transport = transport or Transport(fleet)
        self.health = Health(self.transport.run / "health.json" if remember else None)
        self._clients: dict[str, tuple[Path, NodeClient]] = {}
        self.units: list[UnitView] = []  # the last `status_all`'s servers across nodes

    async def __aenter__(self) -> FleetClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        for _, client in self._clients.values():
            with contextlib.suppress(Exception):
                await client.aclose()
        self._clients.clear()

    def client_for(self, tunnel: Tunnel, timeout: float | None = None) -> NodeClient:
        """A control-API client on the tunnel's local socket (kept alive between calls)."""
        held = self._clients.get(tunnel.node)
        if held is not None and held[0] == tunnel.local_socket:
            return held[1]
        client = NodeClient(tunnel.local_socket, timeout=timeout or self.fleet.timeout_s)
        self._clients[tunnel.node] = (tunnel.local_socket, client)
        return client

    async def _drop_client(self, node: Node) -> None:
        held = self._clients.pop(node.name, None)
        if held is not None:
            with contextlib.suppress(Exception):
                await held[1].aclose()

    async def call(
        self, node: Node, fn: Callable[[NodeClient], Awaitable[T]], timeout: float | None = None
    ) -> tuple[T, Tunnel]:
        """`fn(client)` on the node's daemon, connecting first when needed. A tunnel found
        from before that no longer leads anywhere is made again once."""
        for attempt in (0, 1):
            tunnel = await self.transport.connect(node)
            client = self.client_for(tunnel)
            try:
                if timeout is None:
                    return await fn(client), tunnel
                return await asyncio.wait_for(fn(client), timeout), tunnel
            except DaemonUnavailable:
                # a reset through the tunnel: the remote socket is gone, or the master is
                await self._drop_client(node)
                self.transport.invalidate(node)
                if attempt:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    async def status(self, node: Node) -> tuple[NodeView, dict[str, Any] | None]:
        """The node's view and its status JSON (None when it did not answer), within its
        deadline. Never raises for the node's failures: they are the view's `error`."""
        t0 = time.monotonic()
        warm = self.transport.cached(node) is not None
        # the answer itself gets timeout_s (a hanging node is reported then); the rest of the
        # budget is for connecting, also when a tunnel found from before has to be made again
        budget = self.fleet.timeout_s + self.fleet.connect_timeout_s
        base = {"groups": node.groups, "warm": warm}
        doc: dict[str, Any] | None = None
        try:
            answer, tunnel = await asyncio.wait_for(
                self.call(node, lambda c: c.status(), timeout=self.fleet.timeout_s), budget
            )
        except TimeoutError:
            took = time.monotonic() - t0
            view = self._down(node, f"no answer within {took:.0f} s", False, base)
        except NoDaemon as exc:
            view = self._down(node, str(exc), True, base)
        except Unreachable as exc:
            view = self._down(node, str(exc), False, base)
        except DaemonUnavailable as exc:
            # SSH works (the tunnel was made) but nothing answers through it.
            why = (
                f"the node's daemon does not answer through the tunnel ({exc}); its sshd may "
                "refuse unix-socket forwarding (AllowStreamLocalForwarding, AllowTcpForwarding)"
            )
            view = self._down(node, why, True, base)
        except (ControlError, ValueError, KeyError, TypeError) as exc:
            view = self._down(node, f"its daemon's answer is not a status: {exc}", True, base)
        else:
            doc = answer
            rec = self.health.note(node.name, True)
            view = summarize(
                node.name,
                node.ssh,
                answer,
                tunnel.info,
                since=rec.get("since"),
                last_seen=rec.get("last_seen"),
                latency_ms=round((time.monotonic() - t0) * 1000, 1),
                **base,
            )
        return view, doc

    def _down(self, node: Node, why: str, reachable: bool, base: dict[str, Any]) -> NodeView:
        rec = self.health.note(node.name, False, why)
        return unreachable(
            node.name,
            node.ssh,
            why,
            reachable=reachable,
            since=rec.get("since"),
            last_seen=rec.get("last_seen"),
            **base,
        )

    async def paths_all(self, nodes: Iterable[Node]) -> dict[str, dict[str, Any] | str]:
        """Each node's `vsup paths --json` asked now (its vLLM version as installed now, not
        the one a tunnel made earlier learned), in parallel: read-only, it starts no daemon.
        A node that cannot be asked: why not, in words."""

        async def one(node: Node) -> dict[str, Any] | str:
            budget = self.fleet.connect_timeout_s + self.fleet.timeout_s
            try:
                return await self.transport.remote_vsup(node, "paths", "--json", timeout=budget)
            except Unreachable as exc:
                return str(exc)

        chosen = list(nodes)
        answers = await asyncio.gather(*(one(n) for n in chosen))
        return {n.name: a for n, a in zip(chosen, answers, strict=True)}

    async def status_all(self, nodes: Iterable[Node] | None = None) -> list[NodeView]:
        """Every node's view, asked in parallel, in the fleet file's order."""
        chosen = list(self.fleet.nodes if nodes is None else nodes)
        results = await asyncio.gather(*(self.status(n) for n in chosen))
        self.health.save()
        # every server across nodes as one row, from its members' answers
        self.units = units_of([NodeAnswer(v.name, doc, v.reachable, v.error) for v, doc in results])
        return [view for view, _ in results]
