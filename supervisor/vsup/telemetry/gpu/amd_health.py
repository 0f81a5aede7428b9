"""GPU health from amdsmi (7.x): RAS error counts, bad pages, throttling, clocks, power cap.

Calls and shapes (amdsmi_interface.py of amdsmi 7.0):
- ECC: `amdsmi_get_gpu_total_ecc_count(h)` -> {"correctable_count", "uncorrectable_count",
  "deferred_count"}: the RAS counts since the driver loaded (reported as `ecc_volatile_*`;
  amdsmi has no lifetime count). `amdsmi_get_gpu_ecc_enabled(h)` -> bit mask of the blocks
  with ECC on (0: off).
- Bad pages: `amdsmi_get_gpu_bad_page_info(h)` -> [{"value", "page_address", "page_size",
  "status"}], status an `amdsmi_memory_page_status_t`: 0 reserved (retired), 1 pending (waits
  for a reset), 2 unreservable (could not be retired).
- Throttling: `amdsmi_get_violation_status(h)` (MI300 and newer drivers) -> "active_ppt_pwr"
  (power cap), "active_socket_thrm", "active_prochot_thrm", "active_vr_thrm",
  "active_hbm_thrm" as bools or "N/A"; older stacks: `amdsmi_get_gpu_metrics_info(h)`
  "throttle_status" / "indep_throttle_status", which amdsmi reduces to a bool (no reason).
- Clocks: `amdsmi_get_clock_info(h, AmdSmiClkType.GFX|MEM)` -> {"clk", "max_clk", ...} MHz.
- Power cap: `amdsmi_get_power_cap_info(h)["power_cap"]` in microwatts (Linux bare metal).
- XIDs are NVIDIA's: `xid_count` stays None.

Not supported, not implemented and no permission are remembered per GPU and not asked again;
other AmdSmiExceptions give None for that read.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from vsup.snapshot import GpuHealth
from vsup.telemetry.gpu.health import SLOW_EVERY_S, Refusals, SlowTimer

_VIOLATIONS = (
    ("active_ppt_pwr", "power_cap"),
    ("active_socket_thrm", "thermal"),
    ("active_prochot_thrm", "hw_thermal"),
    ("active_vr_thrm", "vr_thermal"),
    ("active_hbm_thrm", "hbm_thermal"),
)
_PAGE_RESERVED, _PAGE_PENDING, _PAGE_UNRESERVABLE = 0, 1, 2
_SENTINELS = (0xFFFF, 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF)


class AmdSmiHealth:
    """Reads the health of an AmdSmiProbe's GPUs (called with the probe's lock held)."""

    def __init__(
        self,
        smi: ModuleType,
        *,
        slow_every_s: float = SLOW_EVERY_S,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._smi = smi
        self._slow_every_s = slow_every_s
        self._monotonic = monotonic
        self._refusals = Refusals()
        self._timers: dict[int, SlowTimer] = {}
        self._slow: dict[int, dict[str, Any]] = {}
        wrapper = getattr(smi, "amdsmi_wrapper", None)
        self._permanent_codes = {
            int(getattr(wrapper, name, default))
            for name, default in (
                ("AMDSMI_STATUS_NOT_SUPPORTED", 2),
                ("AMDSMI_STATUS_NOT_YET_IMPLEMENTED", 3),
                ("AMDSMI_STATUS_NO_PERM", 10),
            )
        }

    def _call(self, gpu: int, key: str, fn_name: str, *args: Any) -> Any:
        smi = self._smi
        if self._refusals.refused(gpu, key):
            return None
        fn = getattr(smi, fn_name, None)
        if fn is None:  # an amdsmi without this call
            self._refusals.refuse(gpu, key)
            return None
        try:
            return fn(*args)
        except smi.AmdSmiLibraryException as exc:
            if exc.get_error_code() in self._permanent_codes:
                self._refusals.refuse(gpu, key)
            return None
        except smi.AmdSmiException:
            return None

    def read(self, gpu: int, handle: Any) -> GpuHealth:
        """The health of one GPU now. Never raises an AmdSmiException."""
        timer = self._timers.setdefault(gpu, SlowTimer(self._slow_every_s, self._monotonic))
        if timer.due():
            self._slow[gpu] = self._read_slow(gpu, handle)
        smi = self._smi
        gfx = self._call(gpu, "clock_gfx", "amdsmi_get_clock_info", handle, smi.AmdSmiClkType.GFX)
        mem = self._call(gpu, "clock_mem", "amdsmi_get_clock_info", handle, smi.AmdSmiClkType.MEM)
        return GpuHealth(
            **self._slow.get(gpu, {}),
            throttle_reasons=self._throttle(gpu, handle),
            sm_clock_mhz=_field(gfx, "clk"),
            sm_clock_max_mhz=_field(gfx, "max_clk"),
            mem_clock_mhz=_field(mem, "clk"),
            mem_clock_max_mhz=_field(mem, "max_clk"),
        )

    def _read_slow(self, gpu: int, handle: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        enabled = self._call(gpu, "ecc_enabled", "amdsmi_get_gpu_ecc_enabled", handle)
        if isinstance(enabled, int) and not isinstance(enabled, bool):
            out["ecc_enabled"] = enabled != 0
        counts = self._call(gpu, "ecc_total", "amdsmi_get_gpu_total_ecc_count", handle)
        if isinstance(counts, dict):
            out["ecc_volatile_corrected"] = _count(counts.get("correctable_count"))
            out["ecc_volatile_uncorrected"] = _count(counts.get("uncorrectable_count"))
            out["ecc_deferred"] = _count(counts.get("deferred_count"))
        pages = self._call(gpu, "bad_pages", "amdsmi_get_gpu_bad_page_info", handle)
        if isinstance(pages, list):
            status = [p.get("status") for p in pages if isinstance(p, dict)]
            out["retired_pages"] = sum(1 for s in status if s == _PAGE_RESERVED)
            out["retired_pages_pending"] = any(s == _PAGE_PENDING for s in status)
            out["bad_pages_unreservable"] = sum(1 for s in status if s == _PAGE_UNRESERVABLE)
        cap = self._call(gpu, "power_cap", "amdsmi_get_power_cap_info", handle)
        cap_uw = _count(cap.get("power_cap")) if isinstance(cap, dict) else None
        out["power_limit_w"] = cap_uw / 1e6 if cap_uw else None
        return out

    def _throttle(self, gpu: int, handle: Any) -> tuple[str, ...] | None:
        status = self._call(gpu, "violation", "amdsmi_get_violation_status", handle)
        if isinstance(status, dict):
            flags = [(status.get(key), name) for key, name in _VIOLATIONS]
            if any(isinstance(v, bool) for v, _ in flags):
                return tuple(name for v, name in flags if v is True)
        if not self._refusals.refused(gpu, "violation") and status is None:
            return None  # failed this time: say unknown rather than read something coarser
        metrics = self._call(gpu, "gpu_metrics", "amdsmi_get_gpu_metrics_info", handle)
        if not isinstance(metrics, dict):
            return None
        for key in ("throttle_status", "indep_throttle_status"):
            value = metrics.get(key)
            if isinstance(value, bool):
                return ("unspecified",) if value else ()
        return None


def _count(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return None if value in _SENTINELS else value


def _field(info: Any, key: str) -> float | None:
    if not isinstance(info, dict):
        return None
    value = _count(info.get(key))
    return None if value is None else float(value)
