"""The monitor asks an instance at rest (telemetry/rest.py) only every `rest_s` instead of every
poll, tells the engine when a rest begins and ends (so its health loop asks nothing itself
meanwhile), and asks every poll again as soon as a scrape shows a request, or the daemon says
a transition is under way (`Target.rest_s` 0). While nobody reads the figures (no status
request for `WATCH_S`), a busy instance is asked at a rest's pace (`rest_s`, `UNWATCHED_S` at
most) instead of every poll.
A loopback server shaped like vLLM's API server answers; the clock is a fake one, advanced a
second per poll as the daemon polls."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from vsup.control.monitor import UNWATCHED_S, WATCH_S, Monitor
from vsup.telemetry.gpu.base import NoneProbe
from vsup.telemetry.rest import QUIET_SCRAPES

from tests.support.clock import FakeClock
from tests.unit.control.test_monitor_stall import VllmLike, target


def scrapes(srv: VllmLike) -> int:
    return sum(1 for p in srv.paths if p.startswith("/metrics"))


async def polls(
    mon: Monitor, clock: FakeClock, t, n: int, srv: VllmLike, read: bool = True
) -> list[bool]:
    """`n` polls a second apart: whether each one scraped. `read`: a status request comes
    before each, as from a dashboard."""
    out = []
    for _ in range(n):
        clock.advance(1.0)
        if read:
            mon.read()
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


async def test_while_nobody_reads_a_busy_instance_is_asked_every_rest_interval_until_read_again():
    assert UNWATCHED_S == 3.0 and WATCH_S == 5.0
    async with watched() as (mon, clock, srv, told):
        srv.load = 1  # a request in flight: busy, never at rest
        t = target(srv.url, load_tracking=True, rest_s=3.0)
        # nobody reads: every third poll (a rest's pace), and the engine's health loop is told
        assert await polls(mon, clock, t, 9, srv, read=False) == [True, False, False] * 3
        assert told == [("a", 1, 4.5)]
        # a status request: every poll from the next one on, the engine told at once
        mon.read()
        assert await polls(mon, clock, t, 4, srv, read=False) == [True] * 4
        assert told[-1] == ("a", 1, 0.0)
        # WATCH_S after that request: every third poll again
        assert await polls(mon, clock, t, 6, srv, read=False) == [False, False, True] * 2
        assert told[-1] == ("a", 1, 4.5)
        # a layout's shorter rest_interval_s is the pace while nobody reads
        t = target(srv.url, load_tracking=True, rest_s=2.0)
        assert await polls(mon, clock, t, 4, srv, read=False) == [False, True, False, True]
        assert told[-1] == ("a", 1, 3.5)


async def test_unread_a_transition_no_rest_interval_or_a_short_stall_window_keep_every_poll():
    async with watched() as (mon, clock, srv, told):
        srv.load = 1
        # a transition (the daemon's rest_s 0), or the layout's rest_interval_s = 0
        t = target(srv.url, load_tracking=True, rest_s=0.0)
        assert await polls(mon, clock, t, 4, srv, read=False) == [True] * 4
        # stall_after_s of 8: a third of it is under 3 s, so every poll
        t = target(srv.url, load_tracking=True, rest_s=3.0, stall_after_s=8.0)
        assert await polls(mon, clock, t, 4, srv, read=False) == [True] * 4
        assert told == []
        # stall_after_s of 9: every 3 s, as without one
        t = target(srv.url, load_tracking=True, rest_s=3.0, stall_after_s=9.0)
        assert await polls(mon, clock, t, 6, srv, read=False) == [False, False, True] * 2


async def test_an_idle_unread_instance_still_comes_to_rest_and_is_asked_every_rest_interval():
    async with watched() as (mon, clock, srv, told):
        t = target(srv.url, load_tracking=True, rest_s=3.0)
        # quiet scrapes every third poll, as many as before a rest (the test above), and the
        # rest's pace after them: the same, and the engine told once
        got = await polls(mon, clock, t, 3 * (QUIET_SCRAPES + 3), srv, read=False)
        assert got == [True, False, False] * (QUIET_SCRAPES + 3)
        assert told == [("a", 1, 4.5)]
        # at rest by now: a status request keeps it on the rest's pace (it moves nothing)
        mon.read()
        assert await polls(mon, clock, t, 3, srv, read=False) == [True, False, False]
