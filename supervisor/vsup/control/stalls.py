"""What the daemon does when an instance stalls: journal the stall's start and end, and restart
the instance when its layout says `restart.on_stall = true`.

The verdict itself is telemetry's (telemetry/stall.py) and reaches the snapshot as the
`stalled`, `stalled_since`, `stalled_for_s` keys; the advice (`stalled`) and the alert follow
from the snapshot. This module only acts on changes of that flag, once per poll.

Journal events (`/v1/events`; the daemon's, not the engine's: the engine does not scrape):
- `stalled`: `run`, `requests_running`, `requests_waiting`, `stalled_since`, `stalled_for_s`,
  `stall_after_s`, `on_stall`;
- `stall_cleared`: `run`, `lasted_s`, `state` (its state now), `why` (`progress`, `idle` or
  `not ready`).
With `on_stall` the engine adds `stall_restart` (`run`, `pid`, `why`), then the usual `exit`
(reason `stalled`) and `restart_scheduled`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from vsup.snapshot import InstanceStatus
from vsup.states import State


@dataclass
class _Stall:
    run: int | None
    for_s: float


class StallActions:
    """Fed each snapshot's instances; `journal(kind, instance, **keys)` records events and
    `engine.restart_stalled(name, why)` restarts (the engine's normal restart path)."""

    def __init__(self, journal: Callable[..., Any], engine: Any) -> None:
        self._journal = journal
        self._engine = engine
        self._stalled: dict[str, _Stall] = {}

    def observe(self, instances: Iterable[InstanceStatus]) -> None:
        seen = set()
        for inst in instances:
            seen.add(inst.name)
            known = self._stalled.get(inst.name)
            if inst.stalled and known is None:
                self._began(inst)
            elif inst.stalled and known is not None:
                known.for_s = inst.stalled_for_s or known.for_s
            elif known is not None:
                self._ended(inst, known)
        for name in [n for n in self._stalled if n not in seen]:
            del self._stalled[name]  # removed from the layout

    def _began(self, inst: InstanceStatus) -> None:
        self._stalled[inst.name] = _Stall(inst.run, inst.stalled_for_s or 0.0)
        spec = self._spec(inst.name)
        on_stall = bool(spec is not None and spec.restart.on_stall)
        after = spec.stall_after_s if spec is not None else None
        self._journal(
            "stalled",
            inst.name,
            run=inst.run,
            requests_running=inst.requests_running,
            requests_waiting=inst.requests_waiting,
            stalled_since=inst.stalled_since,
            stalled_for_s=inst.stalled_for_s,
            stall_after_s=after,
            on_stall=on_stall,
        )
        self._membership_changed()
        if on_stall:
            why = (
                f"{int(inst.requests_running or 0)} running, {int(inst.requests_waiting or 0)} "
                f"waiting and no token processed for {inst.stalled_for_s or 0:.0f} s "
                f"(stall_after_s = {after:g})"
            )
            self._engine.restart_stalled(inst.name, why)

    def _ended(self, inst: InstanceStatus, known: _Stall) -> None:
        del self._stalled[inst.name]
        if inst.state != State.READY or inst.run != known.run:
            why = "not ready"
        elif inst.stalled is False and not (inst.requests_running or inst.requests_waiting):
            why = "idle"
        else:
            why = "progress"
        self._journal(
            "stall_cleared",
            inst.name,
            run=known.run,
            lasted_s=round(known.for_s, 1),
            state=inst.state,
            why=why,
        )
        self._membership_changed()

    def _membership_changed(self) -> None:
        """A stalled instance leaves the router's workers (the daemon's `exclude` hook) now,
        and rejoins when it clears, not at the router's next periodic check."""
        router = getattr(self._engine, "router", None)
        if router is not None:
            router.wake()

    def _spec(self, name: str) -> Any:
        inst = self._engine.instances.get(name)
        return inst.spec if inst is not None else None
