"""What the NVML and amdsmi health readers share: the XID catalogue, the XID log, and the
bookkeeping that keeps health reads cheap (slow counters on a timer, refused calls not retried).

Health is read inside `probe.snapshot()`, which the daemon runs in a worker thread each poll:
fast figures (throttle reasons, clocks, XID events) every snapshot, slow counters (ECC, retired
pages, row remaps, maximum clocks, power cap) every `slow_every_s`, since they change rarely and
some calls walk driver tables.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from vsup.clock import iso_utc
from vsup.snapshot import XidEvent

SLOW_EVERY_S = 10.0
XID_RECENT_S = 3600.0  # `xid_recent` keeps the last hour's events
XID_RECENT_MAX = 16
XID_DRAIN_MAX = 64  # events read per GPU per snapshot; more wait for the next one

# NVIDIA's XID catalogue (docs.nvidia.com/deploy/xid-errors), the codes seen on data-centre
# GPUs: (what, hardware). "hardware": NVIDIA's resolution points at the GPU, its memory, its
# links or its firmware rather than at the application; 13/31/43/45 follow a crashed or killed
# process and recur with the program, not the GPU.
XIDS: dict[int, tuple[str, bool]] = {
    13: ("graphics engine exception (usually the application)", False),
    31: ("GPU memory page fault (usually the application)", False),
    43: ("GPU stopped processing (usually the application)", False),
    45: ("preemptive cleanup after a process ended or a previous error", False),
    48: ("double-bit ECC error", True),
    61: ("internal micro-controller breakpoint", True),
    62: ("internal micro-controller halt", True),
    63: ("ECC page retirement or row remap recorded", True),
    64: ("ECC page retirement or row remap failed", True),
    68: ("video processor exception", False),
    69: ("graphics engine class error", False),
    74: ("NVLink error", True),
    79: ("GPU has fallen off the bus", True),
    92: ("high single-bit ECC error rate", True),
    94: ("contained uncorrectable ECC error", True),
    95: ("uncontained uncorrectable ECC error", True),
    119: ("GSP RPC timeout", True),
    120: ("GSP error", True),
    121: ("C2C link error", True),
    140: ("unrecovered ECC error", True),
    154: ("GPU recovery action changed (reset or reboot needed)", True),
}


def xid_event(xid: int, wall: float) -> XidEvent:
    """An XidEvent with NVIDIA's description where vsup knows the code."""
    what, hardware = XIDS.get(xid, (None, False))
    return XidEvent(xid=xid, at=iso_utc(wall), what=what, hardware=hardware)


class XidLog:
    """The XID errors of one GPU: a count since watching began and the last hour's events."""

    def __init__(self, monotonic: Callable[[], float], wall: Callable[[], float]) -> None:
        self._monotonic = monotonic
        self._wall = wall
        self.count = 0
        self._recent: deque[tuple[float, XidEvent]] = deque(maxlen=XID_RECENT_MAX)

    def add(self, xid: int) -> None:
        self.count += 1
        self._recent.append((self._monotonic(), xid_event(xid, self._wall())))

    def recent(self) -> tuple[XidEvent, ...]:
        cutoff = self._monotonic() - XID_RECENT_S
        while self._recent and self._recent[0][0] < cutoff:
            self._recent.popleft()
        return tuple(e for _, e in self._recent)


class SlowTimer:
    """Says when one GPU's slow counters are due again."""

    def __init__(self, every_s: float, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.every_s = every_s
        self._monotonic = monotonic
        self._last: float | None = None

    def due(self) -> bool:
        now = self._monotonic()
        if self._last is None or now - self._last >= self.every_s:
            self._last = now
            return True
        return False


class Refusals:
    """Calls a GPU refused for good (not supported, no permission, missing from the driver):
    they are not made again, so an unsupported figure costs nothing per poll."""

    def __init__(self) -> None:
        self._refused: set[tuple[int, str]] = set()

    def refused(self, gpu: int, key: str) -> bool:
        return (gpu, key) in self._refused

    def refuse(self, gpu: int, key: str) -> None:
        self._refused.add((gpu, key))
