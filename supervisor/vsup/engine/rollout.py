"""A rolling apply: serving instances whose process-defining fields changed restart in waves.

Restarting every changed replica at once takes a whole node's service down for the length of a
vLLM start (a minute or more on a GPU). A rollout instead takes at most `max_unavailable`
serving instances down at a time *because of the apply*: each one of a wave is drained (no
request running, at most `drain_timeout_s`), restarted with its new spec and must be ready
before the next wave begins. A wave that ends with an instance not ready (`failed`, or stopped
by a person meanwhile) stops the rollout: the instances of later waves keep their old spec and
keep serving, and the rollout says which one failed and why.

Waves follow the layout's order. Instances that are not serving when the layout is applied
(stopped, failed, starting, backing off) and new ones start at once, under the ordinary device
rules (scheduler.py); so do restarts with `--all-at-once`.

A rollout is kept in the daemon's state file (`to_record`): a daemon killed in the middle of
one leaves it `running` there, and the next daemon reports it `interrupted`
(`Rollout.interrupted`) with the instances it finds on their old spec; `vsup up` of the layout
restarts those (the plan's `restart`, in a new rollout).

With a canary (`[layout] canary_s`, docs/canary.md) the first wave is the `canary` first
instances; once they are ready the rollout watches them for `canary_s` seconds beside the
instances still on the old spec (`canary_state` "watching"), and the gate (canary.py) decides:
passed, the other waves follow; failed (or a canary that did not come back ready), the canary
is restarted drained on its old spec and the rollout ends `rolled_back` with the gate's words
in `failure`.

This module is the rollout's record (what the status JSON shows, `status()`) and the wave plan;
the engine drives it (Engine._roll).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from vsup.snapshot import RolloutStatus
from vsup.states import CanaryState, RolloutState

__all__ = ["Rollout", "RolloutState", "plan_waves"]


def plan_waves(
    names: tuple[str, ...], max_unavailable: int, canary: int = 0
) -> list[tuple[str, ...]]:
    """Split `names` (layout order) into waves of at most `max_unavailable`; with `canary`,
    the first wave is the first `canary` names (at least one name stays for later waves when
    there are two or more: the canary is compared with the instances still on the old spec)."""
    if max_unavailable < 1:
        raise ValueError(f"max_unavailable must be 1 or more (it is {max_unavailable})")
    first: list[tuple[str, ...]] = []
    if canary > 0 and names:
        n = min(canary, max(1, len(names) - 1))
        first, names = [names[:n]], names[n:]
    return first + [names[i : i + max_unavailable] for i in range(0, len(names), max_unavailable)]


@dataclass
class Rollout:
    """The progress of one rolling apply (`to_json()` is the status JSON's `rollout`)."""

    names: tuple[str, ...]
    max_unavailable: int = 1
    drain_timeout_s: float | None = None  # None: each instance's own drain_timeout_s
    started_at: str | None = None  # ISO-8601 UTC
    waves: list[tuple[str, ...]] = field(init=False)
    wave: int = 0  # 1-based number of the wave under way (or the last one); 0 before the first
    done: list[str] = field(default_factory=list)
    current: tuple[str, ...] = ()
    state: RolloutState = RolloutState.RUNNING
    failure: str | None = None
    ended_at: str | None = None
    interrupted_at: str | None = None  # when a later daemon found it unfinished
    canary: int = 0  # instances the layout asks for in the canary wave; 0: no canary
    canary_s: float = 0.0  # how long the canary is watched
    canary_state: CanaryState | None = None  # None: no canary, or not yet
    verdict: str | None = None  # the gate's words
    # an operator ended the watch early: "pass" (promote) or "fail" (abort); not kept
    watch_decided: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        self.waves = plan_waves(self.names, self.max_unavailable, self.canary)

    @property
    def canaries(self) -> tuple[str, ...]:
        """The canary wave's instances; () without a canary."""
        return self.waves[0] if self.canary and self.waves else ()

    @property
    def total(self) -> int:
        return len(self.names)

    @property
    def pending(self) -> tuple[str, ...]:
        """Instances not yet taken down by the rollout (they serve their old spec)."""
        return tuple(n for n in self.names if n not in self.done and n not in self.current)

    @property
    def active(self) -> bool:
        return self.state == RolloutState.RUNNING

    def begin_wave(self, number: int) -> tuple[str, ...]:
        self.wave = number
        self.current = self.waves[number - 1]
        return self.current

    def wave_ready(self) -> None:
        self.done.extend(self.current)
        self.current = ()

    def end(self, state: RolloutState, at: str, failure: str | None = None) -> None:
        self.state = state
        self.failure = failure
        self.ended_at = at
        if state != RolloutState.FAILED:
            self.current = ()

    def status(self, outdated: Collection[str] | None = None) -> RolloutStatus:
        """The status JSON's `rollout`. `outdated`: the instances that run another spec than
        the layout now (the daemon knows); without it, those not yet restarted."""
        if outdated is None:
            old = tuple(n for n in self.names if n not in self.done)
        else:
            old = tuple(n for n in self.names if n in outdated)
        return RolloutStatus(
            state=str(self.state),
            wave=self.wave,
            waves=len(self.waves),
            done=len(self.done),
            total=self.total,
            current=tuple(self.current),
            pending=self.pending,
            max_unavailable=self.max_unavailable,
            failure=self.failure,
            started_at=self.started_at,
            ended_at=self.ended_at,
            names=self.names,
            restarted=tuple(self.done),
            old_config=old,
            drain_timeout_s=self.drain_timeout_s,
            interrupted_at=self.interrupted_at,
            canary=self.canaries,
            canary_s=self.canary_s,
            canary_state=self.canary_state,
            verdict=self.verdict,
        )

    def to_json(self) -> dict[str, Any]:
        """`status()` as JSON data (the journal's `rollout` events)."""
        s = self.status()
        return {
            "state": s.state,
            "wave": s.wave,
            "waves": s.waves,
            "done": s.done,
            "total": s.total,
            "current": list(s.current),
            "pending": list(s.pending),
            "max_unavailable": s.max_unavailable,
            "failure": s.failure,
            "started_at": s.started_at,
            "ended_at": s.ended_at,
            "names": list(s.names),
            "restarted": list(s.restarted),
            "old_config": list(s.old_config),
            "drain_timeout_s": s.drain_timeout_s,
            "interrupted_at": s.interrupted_at,
            "canary": list(s.canary),
            "canary_s": s.canary_s,
            "canary_state": s.canary_state,
            "verdict": s.verdict,
        }

    def to_record(self) -> dict[str, Any]:
        """What the state file keeps: enough for `from_record` to rebuild it exactly."""
        return {
            "names": list(self.names),
            "max_unavailable": self.max_unavailable,
            "drain_timeout_s": self.drain_timeout_s,
            "started_at": self.started_at,
            "wave": self.wave,
            "done": list(self.done),
            "current": list(self.current),
            "state": str(self.state),
            "failure": self.failure,
            "ended_at": self.ended_at,
            "interrupted_at": self.interrupted_at,
            "canary": self.canary,
            "canary_s": self.canary_s,
            "canary_state": self.canary_state,
            "verdict": self.verdict,
        }

    @classmethod
    def from_record(cls, doc: Mapping[str, Any]) -> Rollout:
        """The inverse of `to_record`; raises ValueError naming what is wrong."""
        try:
            names = tuple(str(n) for n in doc["names"])
            drain = doc.get("drain_timeout_s")
            # the record keeps the count asked for; a journal event (`to_json`) the wave
            canary = doc.get("canary") or 0
            canary = len(canary) if isinstance(canary, list) else int(canary)
            r = cls(
                names,
                int(doc.get("max_unavailable", 1)),
                None if drain is None else float(drain),
                doc.get("started_at"),
                canary=canary,
                canary_s=float(doc.get("canary_s") or 0.0),
            )
            canary_state = doc.get("canary_state")
            r.canary_state = CanaryState(canary_state) if canary_state else None
            r.verdict = doc.get("verdict")
            r.wave = int(doc.get("wave", 0))
            r.done = [str(n) for n in doc.get("done") or () if n in names]
            r.current = tuple(str(n) for n in doc.get("current") or () if n in names)
            r.state = RolloutState(doc.get("state", "running"))
            r.failure = doc.get("failure")
            r.ended_at = doc.get("ended_at")
            r.interrupted_at = doc.get("interrupted_at")
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"rollout: {type(exc).__name__}: {exc}") from None
        if not 0 <= r.wave <= len(r.waves):
            raise ValueError(f"rollout: wave {r.wave} of {len(r.waves)}")
        return r

    def interrupted(self, at: str) -> None:
        """Its daemon ended before it did (a later daemon calls this when it finds it
        `running` in the state file, or `cancelled`: the engine shut down under it): nothing
        drives it any more."""
        if self.state in (RolloutState.RUNNING, RolloutState.CANCELLED):
            self.state = RolloutState.INTERRUPTED
            self.interrupted_at = at
