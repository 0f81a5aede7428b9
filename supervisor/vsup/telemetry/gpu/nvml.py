"""NVIDIA GPUs through NVML (`import pynvml`, from the nvidia-ml-py distribution).

The calls a poll makes are cheap enough to read every GPU each second; a probe snapshot's cost
on a real node is in docs/benchmarks.md (`benchmarks/gpu_check.py`).

- Memory: `nvmlDeviceGetMemoryInfo(h, version=nvmlMemory_v2)`, whose `used` excludes the
  driver's `reserved` memory (v1's `used` includes it); drivers without the v2 call get v1.
- Processes: `nvmlDeviceGetComputeRunningProcesses` (the v3 struct); drivers without it get
  `_v2`. pynvml turns "no such function" into `NVMLLibraryMismatchError` for the unversioned
  call and `NVMLError_FunctionNotFound` for the versioned ones; both mean "try the next".
  `usedGpuMemory` is None where NVML reports NVML_VALUE_NOT_AVAILABLE (pynvml maps it).
- Static facts (name, UUID, PCI bus id) are read once when the probe opens.
- Health (ECC, retired pages / row remaps, XID events, throttle reasons, clocks, power cap):
  `nvml_health.py`; fast figures each snapshot, slow counters every `health_every_s`.
- Errors degrade to None for that value; `NVMLError_GpuIsLost` marks the whole GPU failed for
  this poll. Nothing raises out of `snapshot()`.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from vsup.snapshot import GpuHealth
from vsup.telemetry.gpu.base import GpuProbeError, GpuProcessSample, GpuSample
from vsup.telemetry.gpu.health import SLOW_EVERY_S
from vsup.telemetry.gpu.nvml_health import NvmlHealth

log = logging.getLogger(__name__)

_PROCESS_CALLS = (
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetComputeRunningProcesses_v2",
)


def _load() -> ModuleType:
    try:
        import pynvml
    except ImportError as exc:
        raise GpuProbeError(f"NVML: the nvidia-ml-py package is not installed ({exc})") from exc
    return pynvml


class NvmlProbe:
    """GPU snapshots from NVML. `nvml` is the pynvml module (tests pass a fake of it);
    `health_every_s` is how often the slow health counters are read (nvml_health.py)."""

    vendor = "nvidia"

    def __init__(
        self,
        nvml: ModuleType | None = None,
        *,
        health_every_s: float = SLOW_EVERY_S,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._nv = nvml if nvml is not None else _load()
        nv = self._nv
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            raise GpuProbeError(f"NVML: cannot initialise ({exc})") from exc
        self._lock = threading.Lock()
        self._closed = False
        try:
            count = nv.nvmlDeviceGetCount()
        except nv.NVMLError as exc:
            nv.nvmlShutdown()
            raise GpuProbeError(f"NVML: cannot count GPUs ({exc})") from exc
        self._open_devices(count)
        self._find_calls()
        self._health = NvmlHealth(nv, slow_every_s=health_every_s, monotonic=monotonic, wall=wall)

    def _open_devices(self, count: int) -> None:
        """Each GPU's handle and static facts (name, UUID, PCI bus id); a GPU whose handle
        cannot be had, or that is lost, is failed (`_failed`: why)."""
        nv = self._nv
        self._handles: list[Any] = []
        self._static: list[dict[str, str | None]] = []
        self._failed: dict[int, str] = {}
        for i in range(count):
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(i)
            except nv.NVMLError as exc:
                handle = None
                self._failed[i] = str(exc)
            facts: dict[str, str | None] = {}
            if handle is not None:
                try:
                    facts = self._static_facts(handle)
                except nv.NVMLError_GpuIsLost as exc:
                    self._failed[i] = str(exc)
            self._handles.append(handle)
            self._static.append(facts)

    def _find_calls(self) -> None:
        """Which versions of the memory, process and temperature calls this pynvml has, and
        the errors that mean "the driver lacks this call: try the next"."""
        nv = self._nv
        self._memory_v2 = hasattr(nv, "nvmlMemory_v2")
        # Raised by a v2 call on a driver that predates it; older pynvml lacks some classes.
        self._v1_fallback_errors = tuple(
            getattr(nv, name)
            for name in ("NVMLError_FunctionNotFound", "NVMLError_ArgumentVersionMismatch")
            if hasattr(nv, name)
        )
        self._missing_errors = tuple(
            getattr(nv, name)
            for name in ("NVMLError_FunctionNotFound", "NVMLLibraryMismatchError")
            if hasattr(nv, name)
        )
        self._process_calls = [name for name in _PROCESS_CALLS if hasattr(nv, name)]
        self._temperature_calls = [
            name
            for name in ("nvmlDeviceGetTemperature", "nvmlDeviceGetTemperatureV")
            if hasattr(nv, name)
        ]

    @property
    def count(self) -> int:
        return len(self._handles)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._health.close()
            with contextlib.suppress(self._nv.NVMLError):
                self._nv.nvmlShutdown()

    def snapshot(self) -> tuple[GpuSample, ...]:
        """Every GPU once, in index order. Never raises."""
        with self._lock:
            if self._closed:
                return ()
            return tuple(self._guarded(i) for i in range(len(self._handles)))

    def _guarded(self, i: int) -> GpuSample:
        try:
            return self._sample(i)
        except Exception as exc:  # a library surprise must not take the daemon's poll down
            return GpuSample(index=i, error=f"NVML: {type(exc).__name__}: {exc}")

    def _static_facts(self, handle: Any) -> dict[str, str | None]:
        nv = self._nv
        facts: dict[str, str | None] = {}
        facts["name"] = _text(self._try(nv.nvmlDeviceGetName, handle))
        facts["uuid"] = _text(self._try(nv.nvmlDeviceGetUUID, handle))
        pci = self._try(nv.nvmlDeviceGetPciInfo, handle)
        facts["bdf"] = _bdf(_text(getattr(pci, "busId", None))) if pci is not None else None
        return facts

    def _try(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Call an NVML function; None when NVML says the value is unavailable."""
        try:
            return fn(*args, **kwargs)
        except self._nv.NVMLError_GpuIsLost:
            raise
        except self._nv.NVMLError:
            return None

    def _sample(self, i: int) -> GpuSample:
        nv = self._nv
        handle = self._handles[i]
        static = self._static[i]
        if handle is None:
            return GpuSample(index=i, error=f"no NVML handle ({self._failed.get(i)})")
        try:
            total, used = self._memory(handle)
            procs, supported = self._processes(handle)
            util = self._try(nv.nvmlDeviceGetUtilizationRates, handle)
            temp = self._temperature(handle)
            power_mw = self._try(nv.nvmlDeviceGetPowerUsage, handle)
            health = self._read_health(i, handle)
        except nv.NVMLError_GpuIsLost as exc:
            return GpuSample(
                index=i,
                name=static.get("name"),
                uuid=static.get("uuid"),
                bdf=static.get("bdf"),
                error=f"GPU is lost ({exc})",
            )
        return GpuSample(
            index=i,
            name=static.get("name"),
            uuid=static.get("uuid"),
            bdf=static.get("bdf"),
            hbm_total_bytes=total,
            hbm_used_bytes=used,
            util_pct=_float(getattr(util, "gpu", None)) if util is not None else None,
            temp_c=_float(temp),
            power_w=None if power_mw is None else float(power_mw) / 1000.0,
            processes=procs,
            per_process_supported=supported,
            health=health,
        )

    def _read_health(self, i: int, handle: Any) -> GpuHealth | None:
        try:
            return self._health.read(i, handle)
        except self._nv.NVMLError_GpuIsLost:
            raise
        except Exception:  # health is extra: a surprise there must not blank the sample
            log.exception("NVML health read failed for GPU %d", i)
            return None

    def _memory(self, handle: Any) -> tuple[int | None, int | None]:
        nv = self._nv
        if self._memory_v2:
            try:
                mem = nv.nvmlDeviceGetMemoryInfo(handle, version=nv.nvmlMemory_v2)
                return int(mem.total), int(mem.used)
            except nv.NVMLError_GpuIsLost:
                raise
            except self._v1_fallback_errors:
                self._memory_v2 = False  # an older driver: v1 from now on
            except nv.NVMLError:
                return None, None
        mem = self._try(nv.nvmlDeviceGetMemoryInfo, handle)
        if mem is None:
            return None, None
        return int(mem.total), int(mem.used)

    def _temperature(self, handle: Any) -> float | None:
        nv = self._nv
        while self._temperature_calls:
            fn = getattr(nv, self._temperature_calls[0])
            try:
                return _float(fn(handle, nv.NVML_TEMPERATURE_GPU))
            except nv.NVMLError_GpuIsLost:
                raise
            except self._missing_errors:
                self._temperature_calls.pop(0)
            except nv.NVMLError:
                return None
        return None

    def _processes(self, handle: Any) -> tuple[tuple[GpuProcessSample, ...], bool]:
        nv = self._nv
        while self._process_calls:
            fn = getattr(nv, self._process_calls[0])
            try:
                infos = fn(handle)
            except nv.NVMLError_GpuIsLost:
                raise
            except self._missing_errors:
                self._process_calls.pop(0)  # this driver lacks it; the next variant, for good
                continue
            except nv.NVMLError:
                return (), False
            out = []
            for info in infos:
                used = getattr(info, "usedGpuMemory", None)
                out.append(GpuProcessSample(int(info.pid), None if used is None else int(used)))
            return tuple(out), True
        return (), False


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    text = str(value).strip()
    return text or None


def _float(value: Any) -> float | None:
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _bdf(bus_id: str | None) -> str | None:
    """NVML writes `00000000:17:00.0` (32-bit domain); the usual form has a 16-bit domain."""
    if not bus_id:
        return None
    bus_id = bus_id.lower()
    domain, sep, rest = bus_id.partition(":")
    if sep and len(domain) == 8 and domain.startswith("0000"):
        return domain[4:] + ":" + rest
    return bus_id
