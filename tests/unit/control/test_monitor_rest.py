"""The monitor asks an instance at rest (telemetry/rest.py) only every `rest_s` instead of every
poll, tells the engine when a rest begins and ends (so its health loop asks nothing itself
meanwhile), and asks every poll again as soon as a scrape shows a request, or the daemon says
a transition is under way (`Target.rest_s` 0). A loopback server shaped like vLLM's API server
answers; the clock is a fake one, advanced a second per poll as the daemon polls."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from vsup.control.monitor import Monitor
from vsup.telemetry.gpu.base import NoneProbe
from vsup.telemetry.rest import QUIET_SCRAPES

from tests.support.clock import FakeClock
from tests.unit.control.test_monitor_stall import VllmLike, target


def scrapes(srv: VllmLike) -> int:
    return sum(1 for p in srv.paths if p.startswith("/metrics"))


async def polls(mon: Monitor, clock: FakeClock, t, n: int, srv: VllmLike) -> list[bool]:
    """`n` polls a second apart: whether each one scraped."""
    out = []
    for _ in range(n):
        clock.advance(1.0)
        before = scrapes(srv)
        await mon.poll([t])
        out.append(scrapes(srv) > before)
    return out


@contextlib.asynccontextmanager
async def watched() -> AsyncIterator[tuple[Monitor, FakeClock, VllmLike, list]]:
    """A monitor on a fake clock, the server it scrapes, and what it told the engine."""
    clock = FakeClock()
    told: list[tuple[str, int, float]] = []
    async with VllmLike() as srv:
        mon = Monitor(clock, poll_interval=1.0, probe=NoneProbe())
        mon.on_rest = lambda name, run, window: told.append((name, run, window))
        await mon.open()
        try:
            yield mon, clock, srv, told
        finally:
            await mon.close()


async def test_an_idle_instance_is_asked_every_rest_interval_and_at_once_again_when_busy():
    async with watched() as (mon, clock, srv, told):
        t = target(srv.url, load_tracking=True, rest_s=3.0)
        # the first scrape and its quiet ones: every poll
        assert await polls(mon, clock, t, QUIET_SCRAPES + 1, srv) == [True] * (QUIET_SCRAPES + 1)
        assert told == []
        # at rest: one scrape every third poll; the engine told once, with the rest's window
        at_rest = await polls(mon, clock, t, 9, srv)
        assert at_rest == [False, False, True] * 3
        assert told == [("a", 1, 4.5)]
        # a request comes: seen at the next scrape of the rest, then every poll again
        srv.load = 1
        woke = await polls(mon, clock, t, 6, srv)
        assert woke[:3].count(True) == 1 and woke[woke.index(True) :] == [True] * (
            6 - woke.index(True)
        )
        assert told[-1] == ("a", 1, 0.0)


async def test_an_instance_in_transition_or_with_no_rest_interval_is_asked_every_poll():
    async with watched() as (mon, clock, srv, told):
        t = target(srv.url, load_tracking=True, rest_s=0.0)
        assert await polls(mon, clock, t, 10, srv) == [True] * 10
        assert told == []
        # at rest, then a transition (the daemon's rest_s 0): every poll from the next one
        t = target(srv.url, load_tracking=True, rest_s=3.0)
        assert await polls(mon, clock, t, 3, srv) == [False, False, True]
        t = target(srv.url, load_tracking=True, rest_s=0.0)
        assert await polls(mon, clock, t, 3, srv) == [True] * 3
        assert told == [("a", 1, 4.5), ("a", 1, 0.0)]
