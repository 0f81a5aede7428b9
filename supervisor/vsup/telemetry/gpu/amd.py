"""AMD GPUs through amdsmi (the `amdsmi` Python package, 7.x API; needs ROCm's libamd_smi.so).

- Without ROCm's library `import amdsmi` raises KeyError (its wrapper indexes a dict of loaded
  libraries) and prints to stdout; both are contained here.
- Order: amdsmi's handle order is not HIP's. `amdsmi_get_gpu_enumeration_info(h)["hip_id"]`
  gives the HIP ordinal (what `CUDA_VISIBLE_DEVICES` means to vLLM on ROCm) where the library
  and driver have it; otherwise GPUs are numbered in PCI bus order (`amdsmi_get_gpu_device_bdf`),
  which is how HIP enumerates them by default.
- Memory: `amdsmi_get_gpu_memory_total/_usage(h, AmdSmiMemoryType.VRAM)` in bytes; else
  `amdsmi_get_gpu_vram_usage(h)` in MB (MiB).
- Processes: `amdsmi_get_gpu_process_list(h)` -> dicts with `pid` and
  `memory_usage["vram_mem"]` in bytes.
- Utilisation `amdsmi_get_gpu_activity(h)["gfx_activity"]`; temperature
  `amdsmi_get_temp_metric(h, HOTSPOT, CURRENT)` (MI300-class GPUs have no EDGE sensor), EDGE
  otherwise; power from `amdsmi_get_power_info(h)` in W.
- Health (RAS/ECC counts, bad pages, throttling, clocks, power cap): `amd_health.py`.
- "N/A", and all-ones integers (UINT16/32/64_MAX) that some calls pass through, are unknown.
- Every AmdSmiException degrades to None for that value; nothing raises out of `snapshot()`.
"""

from __future__ import annotations

import contextlib
import io
import logging
import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from vsup.snapshot import GpuHealth
from vsup.telemetry.gpu.amd_health import AmdSmiHealth
from vsup.telemetry.gpu.base import GpuProbeError, GpuProcessSample, GpuSample
from vsup.telemetry.gpu.health import SLOW_EVERY_S

log = logging.getLogger(__name__)

_SENTINELS = (0xFFFF, 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF)
_MIB = 1024 * 1024


def _load() -> ModuleType:
    sink = io.StringIO()
    try:
        with contextlib.redirect_stdout(sink):
            import amdsmi
    except (ImportError, KeyError, OSError) as exc:
        hint = sink.getvalue().strip().splitlines()
        detail = hint[0] if hint else f"{type(exc).__name__}: {exc}"
        raise GpuProbeError(f"amdsmi: ROCm's libamd_smi.so is not loadable ({detail})") from exc
    return amdsmi


def known(value: Any, *, percent: bool = False) -> float | int | None:
    """amdsmi's value, or None for "N/A", all-ones sentinels and (for percentages) > 100."""
    if value is None or isinstance(value, str):
        return None
    if isinstance(value, bool):
        return None
    if not isinstance(value, (int, float)):
        return None
    if value in _SENTINELS or value < 0:
        return None
    if percent and value > 100:
        return None
    return value


class AmdSmiProbe:
    """GPU snapshots from amdsmi. `amdsmi` is the module (tests pass a fake of it);
    `health_every_s` is how often the slow health counters are read (amd_health.py)."""

    vendor = "amd"

    def __init__(
        self,
        amdsmi: ModuleType | None = None,
        *,
        health_every_s: float = SLOW_EVERY_S,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._smi = amdsmi if amdsmi is not None else _load()
        smi = self._smi
        try:
            smi.amdsmi_init(smi.AmdSmiInitFlags.INIT_AMD_GPUS)
        except smi.AmdSmiException as exc:
            raise GpuProbeError(f"amdsmi: cannot initialise ({exc})") from exc
        self._lock = threading.Lock()
        self._closed = False
        try:
            handles = list(smi.amdsmi_get_processor_handles())
        except smi.AmdSmiException as exc:
            self._shut_down()
            raise GpuProbeError(f"amdsmi: cannot list GPUs ({exc})") from exc
        self._devices = self._order(handles)
        self._temp_sensors = [smi.AmdSmiTemperatureType.HOTSPOT, smi.AmdSmiTemperatureType.EDGE]
        self._memory_bytes_api = True
        self._health = AmdSmiHealth(smi, slow_every_s=health_every_s, monotonic=monotonic)

    @property
    def count(self) -> int:
        return len(self._devices)

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._shut_down()

    def _shut_down(self) -> None:
        with contextlib.suppress(self._smi.AmdSmiException):
            self._smi.amdsmi_shut_down()

    def _try(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except self._smi.AmdSmiException:
            return None

    def _order(self, handles: list[Any]) -> list[tuple[int, Any, dict[str, str | None]]]:
        """(index, handle, static facts) in HIP order."""
        smi = self._smi
        rows = []
        for handle in handles:
            bdf = self._try(smi.amdsmi_get_gpu_device_bdf, handle)
            hip_id = None
            if hasattr(smi, "amdsmi_get_gpu_enumeration_info"):
                info = self._try(smi.amdsmi_get_gpu_enumeration_info, handle)
                if isinstance(info, dict):
                    hip_id = known(info.get("hip_id"))
            asic = self._try(smi.amdsmi_get_gpu_asic_info, handle)
            name = asic.get("market_name") if isinstance(asic, dict) else None
            uuid = self._try(smi.amdsmi_get_gpu_device_uuid, handle)
            facts = {
                "bdf": bdf if isinstance(bdf, str) and bdf != "N/A" else None,
                "name": name if isinstance(name, str) and name not in ("", "N/A") else None,
                "uuid": uuid if isinstance(uuid, str) and uuid not in ("", "N/A") else None,
            }
            rows.append((hip_id, handle, facts))
        hip_ids = [r[0] for r in rows]
        if rows and all(isinstance(h, int) for h in hip_ids) and len(set(hip_ids)) == len(rows):
            rows.sort(key=lambda r: r[0])
            return [(int(r[0]), r[1], r[2]) for r in rows]
        rows.sort(key=lambda r: r[2]["bdf"] or "~")
        return [(i, r[1], r[2]) for i, r in enumerate(rows)]

    def snapshot(self) -> tuple[GpuSample, ...]:
        """Every GPU once, in HIP order. Never raises."""
        with self._lock:
            if self._closed:
                return ()
            return tuple(self._guarded(index, h, facts) for index, h, facts in self._devices)

    def _guarded(self, index: int, handle: Any, facts: dict[str, str | None]) -> GpuSample:
        try:
            return self._sample(index, handle, facts)
        except Exception as exc:  # a library surprise must not take the daemon's poll down
            return GpuSample(
                index=index,
                name=facts.get("name"),
                uuid=facts.get("uuid"),
                bdf=facts.get("bdf"),
                error=f"amdsmi: {type(exc).__name__}: {exc}",
            )

    def _sample(self, index: int, handle: Any, facts: dict[str, str | None]) -> GpuSample:
        smi = self._smi
        total, used, mem_error = self._memory(handle)
        activity = self._try(smi.amdsmi_get_gpu_activity, handle)
        util = None
        if isinstance(activity, dict):
            util = known(activity.get("gfx_activity"), percent=True)
        procs, supported = self._processes(handle)
        return GpuSample(
            index=index,
            name=facts.get("name"),
            uuid=facts.get("uuid"),
            bdf=facts.get("bdf"),
            hbm_total_bytes=total,
            hbm_used_bytes=used,
            util_pct=None if util is None else float(util),
            temp_c=self._temperature(handle),
            power_w=self._power(handle),
            processes=procs,
            per_process_supported=supported,
            error=mem_error if total is None and used is None and activity is None else None,
            health=self._read_health(index, handle),
        )

    def _read_health(self, index: int, handle: Any) -> GpuHealth | None:
        try:
            return self._health.read(index, handle)
        except Exception:  # health is extra: a surprise there must not blank the sample
            log.exception("amdsmi health read failed for GPU %d", index)
            return None

    def _memory(self, handle: Any) -> tuple[int | None, int | None, str | None]:
        smi = self._smi
        vram = smi.AmdSmiMemoryType.VRAM
        error = None
        if self._memory_bytes_api:
            try:
                total = known(smi.amdsmi_get_gpu_memory_total(handle, vram))
                used = known(smi.amdsmi_get_gpu_memory_usage(handle, vram))
                return _int(total), _int(used), None
            except smi.AmdSmiException as exc:
                error = f"amdsmi: {exc}".replace("\n", " ").replace("\t", "")
        usage = self._try(smi.amdsmi_get_gpu_vram_usage, handle)
        if isinstance(usage, dict):
            total_mb = known(usage.get("vram_total"))
            used_mb = known(usage.get("vram_used"))
            if total_mb is not None or used_mb is not None:
                # The byte-exact calls failed where this one works: use it from now on.
                self._memory_bytes_api = False
                return (
                    None if total_mb is None else int(total_mb) * _MIB,
                    None if used_mb is None else int(used_mb) * _MIB,
                    None,
                )
        return None, None, error

    def _temperature(self, handle: Any) -> float | None:
        smi = self._smi
        current = smi.AmdSmiTemperatureMetric.CURRENT
        for sensor in list(self._temp_sensors):
            try:
                value = known(smi.amdsmi_get_temp_metric(handle, sensor, current))
            except smi.AmdSmiLibraryException as exc:
                if exc.get_error_code() == _not_supported(smi) and len(self._temp_sensors) > 1:
                    self._temp_sensors.remove(sensor)  # this GPU has no such sensor
                    continue
                return None
            except smi.AmdSmiException:
                return None
            return None if value is None else float(value)
        return None

    def _power(self, handle: Any) -> float | None:
        info = self._try(self._smi.amdsmi_get_power_info, handle)
        if not isinstance(info, dict):
            return None
        # MI300-class GPUs report current_socket_power; older ones average_socket_power.
        for key in ("current_socket_power", "average_socket_power", "socket_power"):
            value = known(info.get(key))
            if value is not None and value > 0:
                return float(value)
        return None

    def _processes(self, handle: Any) -> tuple[tuple[GpuProcessSample, ...], bool]:
        smi = self._smi
        try:
            listing = smi.amdsmi_get_gpu_process_list(handle)
        except smi.AmdSmiException:
            return (), False
        out = []
        for proc in listing or ():
            if not isinstance(proc, dict):
                continue
            pid = known(proc.get("pid"))
            if pid is None:
                continue
            usage = proc.get("memory_usage")
            vram = known(usage.get("vram_mem")) if isinstance(usage, dict) else None
            out.append(GpuProcessSample(int(pid), _int(vram)))
        return tuple(out), True


def _int(value: float | int | None) -> int | None:
    return None if value is None else int(value)


def _not_supported(smi: ModuleType) -> int:
    wrapper = getattr(smi, "amdsmi_wrapper", None)
    return int(getattr(wrapper, "AMDSMI_STATUS_NOT_SUPPORTED", 2))
