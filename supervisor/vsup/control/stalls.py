"""What the daemon does when an instance stalls: journal the stall's start and end, and restart
the instance when its layout says `restart.on_stall = true`.

The verdict itself is telemetry's (telemetry/stall.py) and reaches the snapshot as the
`stalled`, `stalled_since`, `stalled_for_s`, `stall_evidence`, `stalled_ranks` keys; the
advice (`stalled`) and the alert follow from the snapshot. This module only acts on changes of
that flag, once per poll.

Journal events (`/v1/events`; the daemon's, not the engine's: the engine does not scrape):
- `stalled`: `run`, `requests_running`, `requests_waiting`, `requests_in_flight` (the API
  server's `/load`, null without load tracking), `evidence` (`engine`, `server`, `canary`),
  `ranks` (data parallel: the ranks that stalled), `stalled_since`, `stalled_for_s`,
  `stall_after_s`, `on_stall`;
- `stall_cleared`: `run`, `lasted_s`, `state` (its state now), `why` (`progress`, `idle`,
  `not ready`, or `off`: detection turned off). A poll that cannot tell (`stalled` null: the
  figures stale for a moment) ends nothing.
With `on_stall` the engine adds `stall_restart` (`run`, `pid`, `why`, `rank` for a data-parallel
rank), then the usual `exit` (reason `stalled`, with that `rank`) and `restart_scheduled`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from vsup.journalevents import JournalEvent, StallClearedEvent, StalledEvent, work_words
from vsup.layout.spec import InstanceSpec, SpanRole
from vsup.snapshot import InstanceStatus, StallStatus
from vsup.telemetry.stall import Evidence


class StallJournal(Protocol):
    """Where the events go (`Journal.append`)."""

    def __call__(self, event: JournalEvent) -> object: ...


class HasSpec(Protocol):
    """An engine instance, as far as this module reads it."""

    @property
    def spec(self) -> InstanceSpec: ...


class RouterWake(Protocol):
    def wake(self) -> None: ...


class StallEngine(Protocol):
    """What StallActions uses of the engine."""

    @property
    def instances(self) -> Mapping[str, HasSpec]: ...

    @property
    def router(self) -> RouterWake | None: ...

    def restart_stalled(self, name: str, why: str, rank: int | None = None) -> bool: ...


@dataclass
class _Stall:
    run: int | None
    for_s: float


def stall_work(inst: InstanceStatus) -> str:
    """The work that made no progress, for people: `3 running, 5 waiting`, `2 requests in
    flight at the API server and none at the engine` (data parallel: `.. and 1 of them at the
    engines`), `a canary request unanswered`; with `data-parallel rank 1: ` before it when
    ranks are named."""
    stall = inst.stall
    return work_words(
        stall.evidence if stall is not None else None,
        inst.telemetry.requests_running,
        inst.telemetry.requests_waiting,
        inst.telemetry.requests_in_flight,
        stall.ranks if stall is not None else (),
    )


def span_stall_why(role: SpanRole, stall: StallStatus, after: float | None) -> str | None:
    """A span head's stall in the unit's words: the ranks and the nodes that run them, "rank 1
    on gpu02 did not answer in 15 s" (the per-rank probe); None without ranks named."""
    if not stall.ranks:
        return None
    where = ", ".join(f"rank {r} on {role.node_of(r) or '?'}" for r in stall.ranks)
    if stall.evidence == Evidence.CANARY:
        limit = f" in {after:g} s" if after is not None else ""
        verb = "did" if len(stall.ranks) == 1 else "do"
        return f"{where} {verb} not answer{limit} (the unit restarts as one)"
    return (
        f"{where}: work and no token processed for {stall.for_s or 0:.0f} s "
        "(the unit restarts as one)"
    )


class StallActions:
    """Fed each snapshot's instances; `journal(kind, instance, **keys)` records events and
    `engine.restart_stalled(name, why, rank)` restarts (the engine's normal restart path)."""

    def __init__(self, journal: StallJournal, engine: StallEngine) -> None:
        self._journal = journal
        self._engine = engine
        self._stalled: dict[str, _Stall] = {}

    @property
    def tracking(self) -> bool:
        """Whether a stall is known (so `observe` has one to follow or end)."""
        return bool(self._stalled)

    def knows(self, name: str) -> bool:
        """Whether `name` is stalled as far as the journal knows (a stall to follow or end)."""
        return name in self._stalled

    def observe(self, instances: Iterable[InstanceStatus]) -> None:
        seen = set()
        for inst in instances:
            seen.add(inst.name)
            known = self._stalled.get(inst.name)
            stall = inst.stall
            if stall is not None and stall.stalled and known is None:
                self._began(inst, stall)
            elif stall is not None and stall.stalled and known is not None:
                known.for_s = stall.for_s or known.for_s
            elif known is not None and not self._unknown_meanwhile(inst, known):
                self._ended(inst, known)
        for name in [n for n in self._stalled if n not in seen]:
            del self._stalled[name]  # removed from the layout

    def _unknown_meanwhile(self, inst: InstanceStatus, known: _Stall) -> bool:
        """A reading that cannot tell (`stalled` null: figures gone stale for a moment, a
        slow scrape on a loaded node) of the same ready run with detection still on: the stall
        is not over, it is only not seen this poll. Ending it there would journal a
        `stall_cleared` and then a second `stalled` for one freeze."""
        if inst.stall is not None or not inst.is_ready or inst.lifecycle.run != known.run:
            return False
        spec = self._spec(inst.name)
        return spec is not None and bool(spec.stall_after_s)

    def _began(self, inst: InstanceStatus, stall: StallStatus) -> None:
        self._stalled[inst.name] = _Stall(inst.lifecycle.run, stall.for_s or 0.0)
        spec = self._spec(inst.name)
        on_stall = bool(spec is not None and spec.restart.on_stall)
        after = spec.stall_after_s if spec is not None else None
        self._journal(
            StalledEvent(
                instance=inst.name,
                run=inst.lifecycle.run,
                requests_running=inst.telemetry.requests_running,
                requests_waiting=inst.telemetry.requests_waiting,
                requests_in_flight=inst.telemetry.requests_in_flight,
                evidence=stall.evidence,
                ranks=list(stall.ranks),
                stalled_since=stall.since,
                stalled_for_s=stall.for_s,
                stall_after_s=after,
                on_stall=on_stall,
            )
        )
        self._membership_changed()
        if on_stall:
            limit = f" (stall_after_s = {after:g})" if after is not None else ""
            why = f"{stall_work(inst)} and no token processed for {stall.for_s or 0:.0f} s{limit}"
            if spec is not None and spec.span is not None:
                why = span_stall_why(spec.span, stall, after) or why
            # one rank named: the exit says which (several: the message names them)
            rank = stall.ranks[0] if len(stall.ranks) == 1 else None
            self._engine.restart_stalled(inst.name, why, rank)

    def _ended(self, inst: InstanceStatus, known: _Stall) -> None:
        del self._stalled[inst.name]
        if not inst.is_ready or inst.lifecycle.run != known.run:
            why = "not ready"
        elif inst.stall is None:
            why = "off"  # stall_after_s turned to 0 (`_unknown_meanwhile` keeps the rest)
        elif not inst.stall.stalled and not (
            inst.telemetry.requests_running
            or inst.telemetry.requests_waiting
            or inst.telemetry.requests_in_flight
        ):
            why = "idle"
        else:
            why = "progress"
        self._journal(
            StallClearedEvent(
                instance=inst.name,
                run=known.run,
                lasted_s=round(known.for_s, 1),
                state=inst.lifecycle.state,
                why=why,
            )
        )
        self._membership_changed()

    def _membership_changed(self) -> None:
        """A stalled instance leaves the router's workers (the daemon's `exclude` hook) now,
        and rejoins when it clears, not at the router's next periodic check."""
        router = self._engine.router
        if router is not None:
            router.wake()

    def _spec(self, name: str) -> InstanceSpec | None:
        inst = self._engine.instances.get(name)
        return inst.spec if inst is not None else None
