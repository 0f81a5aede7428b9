"""Time, injected: state machines take a clock so tests drive them without sleeping
(tests/support/clock.py has the clock that moves on command)."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float: ...

    def wall(self) -> float: ...


class SystemClock:
    """The real clock."""

    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()


def iso_utc(wall: float) -> str:
    """Wall-clock seconds as ISO 8601 UTC with a Z, to the millisecond."""
    return (
        datetime.fromtimestamp(wall, tz=UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )
