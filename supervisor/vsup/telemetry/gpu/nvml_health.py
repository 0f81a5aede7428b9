"""GPU health from NVML: ECC, retired pages / row remaps, XID events, throttle reasons, clocks
against their maximum, the enforced power cap.

Calls (pynvml, nvidia-ml-py 12/13):
- ECC: `nvmlDeviceGetEccMode(h)` -> [current, pending]; `nvmlDeviceGetTotalEccErrors(h,
  NVML_MEMORY_ERROR_TYPE_{CORRECTED,UNCORRECTED}, NVML_{VOLATILE,AGGREGATE}_ECC)` -> int.
  Volatile counts start at the driver's load; aggregate ones are the GPU's lifetime (InfoROM).
- Retired pages (Volta and older): `nvmlDeviceGetRetiredPages(h, cause)` -> [addresses] per
  cause, `nvmlDeviceGetRetiredPagesPendingStatus(h)` -> NVML_FEATURE_ENABLED when a retirement
  waits for a reset. Ampere and newer answer NotSupported and remap rows instead:
  `nvmlDeviceGetRemappedRows(h)` -> (correctable, uncorrectable, pending, failure).
- XID errors: an event set per GPU (`nvmlEventSetCreate`, `nvmlDeviceRegisterEvents(h,
  nvmlEventTypeXidCriticalError, set)`), drained each snapshot with `nvmlEventSetWait(set, 0)`:
  a zero timeout returns at once (NVMLError_Timeout when nothing is queued), so the worker
  thread never waits. NVML keeps no history: only XIDs after the probe opened are seen. On
  Linux each XID is its own event; in MIG mode an unprivileged caller sees only those that
  affect the whole GPU.
- Throttle: `nvmlDeviceGetCurrentClocksEventReasons(h)` (drivers >= 535), else the older
  `nvmlDeviceGetCurrentClocksThrottleReasons(h)`: a bit mask.
- Clocks: `nvmlDeviceGetClockInfo(h, NVML_CLOCK_SM|NVML_CLOCK_MEM)` and
  `nvmlDeviceGetMaxClockInfo(...)` in MHz; `nvmlDeviceGetEnforcedPowerLimit(h)` in mW.

NotSupported, NoPermission and "missing from this driver" are remembered per GPU and the call
not made again; other errors give None for that read; NVMLError_GpuIsLost goes up to the probe.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from vsup.snapshot import GpuHealth
from vsup.telemetry.gpu.health import SLOW_EVERY_S, XID_DRAIN_MAX, Refusals, SlowTimer, XidLog

# (mask attribute in pynvml, vsup's name). The ThrottleReason spellings are the older
# pynvml's; both carry the same bits.
_REASON_BITS = (
    ("SwPowerCap", "power_cap"),
    ("SwThermalSlowdown", "thermal"),
    ("HwThermalSlowdown", "hw_thermal"),
    ("HwSlowdown", "hw_slowdown"),
    ("HwPowerBrakeSlowdown", "hw_power_brake"),
    ("SyncBoost", "sync_boost"),
    ("ApplicationsClocksSetting", "app_clocks"),
    ("DisplayClockSetting", "display_clocks"),
    ("GpuIdle", "idle"),
)
_THROTTLE_CALLS = (
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetCurrentClocksThrottleReasons",
)


class NvmlHealth:
    """Reads the health of an NvmlProbe's GPUs (called with the probe's lock held)."""

    def __init__(
        self,
        nv: ModuleType,
        *,
        slow_every_s: float = SLOW_EVERY_S,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._nv = nv
        self._slow_every_s = slow_every_s
        self._monotonic = monotonic
        self._wall = wall
        self._refusals = Refusals()
        self._timers: dict[int, SlowTimer] = {}
        self._slow: dict[int, dict[str, Any]] = {}
        self._xids: dict[int, XidLog] = {}
        self._event_sets: dict[int, Any] = {}  # gpu -> event set, None when XIDs are unavailable
        # "Not available here, for good": pynvml raises FunctionNotFound for a symbol the driver
        # lacks, and LibraryMismatch for an unversioned call it cannot map.
        self._permanent = tuple(
            getattr(nv, name)
            for name in (
                "NVMLError_NotSupported",
                "NVMLError_NoPermission",
                "NVMLError_FunctionNotFound",
                "NVMLLibraryMismatchError",
            )
            if hasattr(nv, name)
        )
        # (bit, reason) for the reasons this pynvml names; older bindings lack some
        self._reason_masks = [
            (bit, name) for attr, name in _REASON_BITS if (bit := self._mask(attr)) is not None
        ]

    def _mask(self, attr: str) -> int | None:
        for prefix in ("nvmlClocksEventReason", "nvmlClocksThrottleReason"):
            value = getattr(self._nv, prefix + attr, None)
            if isinstance(value, int):
                return value
        return None

    def close(self) -> None:
        """Free the event sets (before nvmlShutdown)."""
        for event_set in self._event_sets.values():
            if event_set is not None:
                with contextlib.suppress(self._nv.NVMLError):
                    self._nv.nvmlEventSetFree(event_set)
        self._event_sets.clear()

    def _call(self, gpu: int, key: str, fn_name: str, *args: Any) -> Any:
        """One NVML call; None when refused or failing. GpuIsLost propagates."""
        nv = self._nv
        if self._refusals.refused(gpu, key):
            return None
        fn = getattr(nv, fn_name, None)
        if fn is None:  # an older pynvml without this function
            self._refusals.refuse(gpu, key)
            return None
        try:
            return fn(*args)
        except nv.NVMLError_GpuIsLost:
            raise
        except self._permanent:
            self._refusals.refuse(gpu, key)
            return None
        except nv.NVMLError:
            return None

    def read(self, gpu: int, handle: Any) -> GpuHealth:
        """The health of one GPU now. Raises NVMLError_GpuIsLost for a lost GPU."""
        timer = self._timers.setdefault(gpu, SlowTimer(self._slow_every_s, self._monotonic))
        if timer.due():
            self._slow[gpu] = self._read_slow(gpu, handle)
        nv = self._nv
        sm = self._call(gpu, "clock_sm", "nvmlDeviceGetClockInfo", handle, nv.NVML_CLOCK_SM)
        mem = self._call(gpu, "clock_mem", "nvmlDeviceGetClockInfo", handle, nv.NVML_CLOCK_MEM)
        xids = self._read_xids(gpu, handle)
        return GpuHealth(
            **self._slow.get(gpu, {}),
            xid_count=None if xids is None else xids.count,
            xid_recent=() if xids is None else xids.recent(),
            throttle_reasons=self._throttle(gpu, handle),
            sm_clock_mhz=_num(sm),
            mem_clock_mhz=_num(mem),
        )

    def _read_slow(self, gpu: int, handle: Any) -> dict[str, Any]:
        """The slow counters (GpuHealth keys): ECC, retired pages, remapped rows, the
        maximum clocks and the power cap. A key is left out or None when NVML does not say."""
        return {
            **self._read_ecc(gpu, handle),
            **self._read_retired(gpu, handle),
            **self._read_remapped(gpu, handle),
            **self._read_limits(gpu, handle),
        }

    def _read_ecc(self, gpu: int, handle: Any) -> dict[str, Any]:
        nv = self._nv
        out: dict[str, Any] = {}
        mode = self._call(gpu, "ecc_mode", "nvmlDeviceGetEccMode", handle)
        if isinstance(mode, (list, tuple)) and mode:
            out["ecc_enabled"] = mode[0] == nv.NVML_FEATURE_ENABLED
        counters = {
            "ecc_volatile_corrected": (nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_VOLATILE_ECC),
            "ecc_volatile_uncorrected": (
                nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                nv.NVML_VOLATILE_ECC,
            ),
            "ecc_aggregate_corrected": (nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_AGGREGATE_ECC),
            "ecc_aggregate_uncorrected": (
                nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                nv.NVML_AGGREGATE_ECC,
            ),
        }
        if out.get("ecc_enabled") is not False:  # with ECC off the counters mean nothing
            for key, (kind, scope) in counters.items():
                out[key] = _int(
                    self._call(gpu, key, "nvmlDeviceGetTotalEccErrors", handle, kind, scope)
                )
        return out

    def _read_retired(self, gpu: int, handle: Any) -> dict[str, Any]:
        """Retired pages (pre-Ampere), counted over both causes, and whether one is pending."""
        nv = self._nv
        pages = [
            self._call(gpu, "retired_pages", "nvmlDeviceGetRetiredPages", handle, cause)
            for cause in (
                nv.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
                nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
            )
        ]
        if not all(isinstance(p, list) for p in pages):
            return {}
        out: dict[str, Any] = {"retired_pages": sum(len(p) for p in pages)}
        pending = self._call(
            gpu, "retired_pending", "nvmlDeviceGetRetiredPagesPendingStatus", handle
        )
        if pending is not None:
            out["retired_pages_pending"] = pending == nv.NVML_FEATURE_ENABLED
        return out

    def _read_remapped(self, gpu: int, handle: Any) -> dict[str, Any]:
        """Row remapping (Ampere and newer): correctable, uncorrectable, pending, failed."""
        rows = self._call(gpu, "remapped_rows", "nvmlDeviceGetRemappedRows", handle)
        if not (isinstance(rows, tuple) and len(rows) == 4):
            return {}
        corr, unc, pending, failed = rows
        return {
            "rows_remapped_correctable": int(corr),
            "rows_remapped_uncorrectable": int(unc),
            "row_remap_pending": bool(pending),
            "row_remap_failed": bool(failed),
        }

    def _read_limits(self, gpu: int, handle: Any) -> dict[str, Any]:
        """The maximum SM and memory clocks, and the enforced power cap in watts."""
        nv = self._nv
        sm_max = self._call(gpu, "max_sm", "nvmlDeviceGetMaxClockInfo", handle, nv.NVML_CLOCK_SM)
        mem_max = self._call(gpu, "max_mem", "nvmlDeviceGetMaxClockInfo", handle, nv.NVML_CLOCK_MEM)
        limit_mw = _num(self._call(gpu, "power_limit", "nvmlDeviceGetEnforcedPowerLimit", handle))
        return {
            "sm_clock_max_mhz": _num(sm_max),
            "mem_clock_max_mhz": _num(mem_max),
            "power_limit_w": None if limit_mw is None else limit_mw / 1000.0,
        }

    def _throttle(self, gpu: int, handle: Any) -> tuple[str, ...] | None:
        for fn_name in _THROTTLE_CALLS:
            if self._refusals.refused(gpu, fn_name):
                continue
            mask = self._call(gpu, fn_name, fn_name, handle)
            if mask is None:
                if self._refusals.refused(gpu, fn_name):
                    continue  # this driver lacks it: the older spelling
                return None
            return tuple(name for bit, name in self._reason_masks if int(mask) & bit)
        return None

    def _read_xids(self, gpu: int, handle: Any) -> XidLog | None:
        """Drain the GPU's XID events; None when this GPU or driver gives none."""
        nv = self._nv
        if gpu not in self._event_sets:
            self._event_sets[gpu] = self._register(handle)
            if self._event_sets[gpu] is not None:
                self._xids[gpu] = XidLog(self._monotonic, self._wall)
        event_set = self._event_sets[gpu]
        if event_set is None:
            return None
        log = self._xids[gpu]
        for _ in range(XID_DRAIN_MAX):
            try:
                data = nv.nvmlEventSetWait(event_set, 0)
            except nv.NVMLError:  # Timeout: nothing queued; anything else: try next poll
                break
            if int(data.eventType) & nv.nvmlEventTypeXidCriticalError:
                log.add(int(data.eventData))
        return log

    def _register(self, handle: Any) -> Any:
        nv = self._nv
        xid_type = getattr(nv, "nvmlEventTypeXidCriticalError", None)
        if xid_type is None or not hasattr(nv, "nvmlEventSetCreate"):
            return None
        try:
            supported = nv.nvmlDeviceGetSupportedEventTypes(handle)
        except nv.NVMLError_GpuIsLost:
            raise
        except nv.NVMLError:
            return None
        if not int(supported) & xid_type:
            return None
        try:
            event_set = nv.nvmlEventSetCreate()
        except nv.NVMLError:
            return None
        try:
            nv.nvmlDeviceRegisterEvents(handle, xid_type, event_set)
        except nv.NVMLError:
            with contextlib.suppress(nv.NVMLError):
                nv.nvmlEventSetFree(event_set)
            return None
        return event_set


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value
