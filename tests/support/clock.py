"""A clock that moves only when a test says so (satisfies `vsup.clock.Clock`)."""

from __future__ import annotations


class FakeClock:
    """A clock that moves only when a test says so."""

    def __init__(self, start: float = 1000.0, wall_start: float = 1_800_000_000.0) -> None:
        self._mono = start
        self._wall = wall_start

    def monotonic(self) -> float:
        return self._mono

    def wall(self) -> float:
        return self._wall

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("time does not go backwards")
        self._mono += seconds
        self._wall += seconds
