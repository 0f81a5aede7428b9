"""Start order: who may start or stop on a device, and when.

Two instances on one GPU must not overlap a start with anything else on that GPU: vLLM profiles
free memory while it starts, so a co-tenant starting at the same time, or one freeing memory
meanwhile, skews the profile (smaller KV caches, `No available memory for the cache blocks`,
`Error in memory profiling`; vllm#55827, #56830). Hence, per device (`spec.devices`: `gpuN`
per GPU, `cpu` shared by every CPU instance):
- a *start* hold is exclusive: one instance starts at a time, from spawn until it answers
  /health 200 or the attempt ends;
- *stop* holds (SIGTERM/SIGKILL and the sweep of a tree, up to the release of its memory) may
  overlap one another, never a start;
- an instance with several GPUs holds all of them at once (never some, so two TP instances
  cannot deadlock);
- requests are served first come, first served, so a stream of starts cannot starve a stop.
Instances on different devices never wait for each other.

An instance holds at most one hold; turning its own start hold into a stop hold (a start that
timed out, a crash during start-up) never waits, since nothing else can hold its devices.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

MODES = ("start", "stop")


@dataclass
class _Hold:
    name: str
    devices: frozenset[str]
    mode: str
    granted: asyncio.Future = field(repr=False)


def _conflict(a: _Hold, b: _Hold) -> bool:
    return a.name != b.name and bool(a.devices & b.devices) and ("start" in (a.mode, b.mode))


class DeviceScheduler:
    """Grants start and stop holds on devices (see the module doc)."""

    def __init__(self, on_change: Callable[[list[str]], None] | None = None) -> None:
        """`on_change(waiting)` is called after the holds change, with the names still waiting
        (so they can tell whom they wait for now)."""
        self._held: dict[str, _Hold] = {}
        self._queue: list[_Hold] = []
        self._on_change = on_change

    def request(self, name: str, devices: tuple[str, ...], mode: str) -> asyncio.Future:
        """Queue a request now; the future resolves when it is granted. `withdraw(name)`
        takes a request back (granted or not)."""
        if mode not in MODES:
            raise ValueError(mode)
        if name in self._held or any(r.name == name for r in self._queue):
            raise RuntimeError(f"{name} already holds or waits for a turn")
        req = _Hold(name, frozenset(devices), mode, asyncio.get_running_loop().create_future())
        self._queue.append(req)
        self._grant()
        return req.granted

    async def acquire(self, name: str, devices: tuple[str, ...], mode: str) -> None:
        """Wait for the hold; cancelling the wait leaves the queue."""
        granted = self.request(name, devices, mode)
        try:
            await asyncio.shield(granted)
        except asyncio.CancelledError:
            self.withdraw(name)
            raise

    def withdraw(self, name: str) -> None:
        """Leave the queue, or give back the hold if it was granted meanwhile."""
        for req in self._queue:
            if req.name == name:
                self._queue.remove(req)
                if req.granted is not None and not req.granted.done():
                    req.granted.cancel()
                break
        else:
            self._held.pop(name, None)
        self._grant()

    def to_stop(self, name: str) -> bool:
        """Turn `name`'s start hold into a stop hold; False if it holds no start."""
        hold = self._held.get(name)
        if hold is None or hold.mode != "start":
            return False
        hold.mode = "stop"
        self._grant()
        return True

    def release(self, name: str) -> None:
        if self._held.pop(name, None) is not None:
            self._grant()

    def mode(self, name: str) -> str | None:
        hold = self._held.get(name)
        return hold.mode if hold is not None else None

    def blockers(self, name: str) -> list[tuple[str, str]]:
        """(instance, mode) pairs that `name`'s queued request waits for."""
        req = next((r for r in self._queue if r.name == name), None)
        if req is None:
            return []
        ahead = list(self._held.values())
        ahead += self._queue[: self._queue.index(req)]
        return [(h.name, h.mode) for h in ahead if _conflict(h, req)]

    def blocking(self, name: str) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
        """`blockers(name)` split in two: the holds granted now (a co-tenant starting or
        stopping) and the requests queued ahead of it (their turn comes first)."""
        req = next((r for r in self._queue if r.name == name), None)
        if req is None:
            return [], []
        held = [(h.name, h.mode) for h in self._held.values() if _conflict(h, req)]
        ahead = self._queue[: self._queue.index(req)]
        return held, [(h.name, h.mode) for h in ahead if _conflict(h, req)]

    def _grant(self) -> None:
        waiting: list[_Hold] = []
        for req in list(self._queue):
            blocked = any(_conflict(h, req) for h in self._held.values()) or any(
                _conflict(w, req) for w in waiting
            )
            if blocked:
                waiting.append(req)
                continue
            self._queue.remove(req)
            self._held[req.name] = req
            if req.granted is not None and not req.granted.done():
                req.granted.set_result(None)
        if self._on_change is not None and self._queue:
            self._on_change([r.name for r in self._queue])
