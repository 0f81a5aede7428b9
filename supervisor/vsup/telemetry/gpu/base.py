"""The probe interface and the frozen samples every probe returns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Protocol

from vsup.snapshot import GpuHealth


class GpuProbeError(Exception):
    """A GPU library could not be opened (missing, no driver, no device)."""


class GpuProcessSample(NamedTuple):
    pid: int  # as the driver reports it: a host pid when vsup runs in another pid namespace
    hbm_bytes: int | None  # None when the driver does not say


@dataclass(frozen=True)
class GpuSample:
    index: int
    name: str | None = None
    uuid: str | None = None
    bdf: str | None = None  # PCI domain:bus:device.function
    hbm_total_bytes: int | None = None
    hbm_used_bytes: int | None = None
    util_pct: float | None = None
    temp_c: float | None = None
    power_w: float | None = None
    processes: tuple[GpuProcessSample, ...] = ()
    # False when the driver gave no per-process list (not supported, no permission, failed):
    # then an empty `processes` means "unknown", not "no process".
    per_process_supported: bool = False
    error: str | None = None  # the GPU failed this poll (e.g. "GPU is lost")
    health: GpuHealth | None = None  # None: this driver gives no health figures


class GpuProbe(Protocol):
    vendor: str  # nvidia | amd | none

    @property
    def count(self) -> int: ...

    def snapshot(self) -> tuple[GpuSample, ...]: ...

    def close(self) -> None: ...


class NoneProbe:
    """The probe of a node without GPUs (or whose GPU library is missing)."""

    vendor = "none"

    def __init__(self, reason: str | None = None) -> None:
        self.reason = reason

    @property
    def count(self) -> int:
        return 0

    def snapshot(self) -> tuple[GpuSample, ...]:
        return ()

    def close(self) -> None:
        return None
