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

This module is the rollout's record (what the status JSON shows) and the wave plan; the engine
drives it (Engine._roll).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vsup.states import RolloutState

__all__ = ["Rollout", "RolloutState", "plan_waves"]


def plan_waves(names: tuple[str, ...], max_unavailable: int) -> list[tuple[str, ...]]:
    """Split `names` (layout order) into waves of at most `max_unavailable`."""
    if max_unavailable < 1:
        raise ValueError(f"max_unavailable must be 1 or more (it is {max_unavailable})")
    return [names[i : i + max_unavailable] for i in range(0, len(names), max_unavailable)]


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

    def __post_init__(self) -> None:
        self.waves = plan_waves(self.names, self.max_unavailable)

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

    def to_json(self) -> dict[str, Any]:
        return {
            "state": str(self.state),
            "wave": self.wave,
            "waves": len(self.waves),
            "done": len(self.done),
            "total": self.total,
            "current": list(self.current),
            "pending": list(self.pending),
            "max_unavailable": self.max_unavailable,
            "failure": self.failure,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
        }
