"""Fakes of `pynvml` and `amdsmi` for the GPU probes: the libraries' own function names,
signatures, return objects and exception classes, with hardware state and failures scripted.

What is real here: every exception class, constant, enum and ctypes structure comes from the
installed nvidia-ml-py and amdsmi packages (amdsmi is imported with a stand-in for ROCm's
libamd_smi.so, which this machine lacks, and then removed from `sys.modules` so product code
still sees the real import failure). Errors are raised the way the libraries raise them:
`pynvml.NVMLError(code)` (which becomes the matching `NVMLError_*` subclass),
`NVMLLibraryMismatchError` from the unversioned process call on an old driver,
`AmdSmiLibraryException(status)`, and "N/A" / all-ones values where amdsmi returns them.
test_gpu_probes.py checks that every fake function has the real one's signature.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import io
import sys
import types
from dataclasses import dataclass, field
from typing import Any

import pynvml as real_nvml

# ---------------------------------------------------------------------------------- NVML


@dataclass
class NvGpu:
    name: str = "NVIDIA H200"
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    bus_id: str = "00000000:17:00.0"
    total: int = 150_754_820_096
    used: int = 600 * 2**20
    reserved: int = 512 * 2**20
    util: int = 37
    temp: int = 41
    power_mw: int = 123_456
    processes: list[tuple[int, int | None]] = field(default_factory=list)
    # health (an H200's figures by default)
    ecc_mode: tuple[int, int] = (1, 1)  # (current, pending): NVML_FEATURE_ENABLED
    # (NVML_MEMORY_ERROR_TYPE_*, NVML_{VOLATILE,AGGREGATE}_ECC) -> count; missing ones are 0
    ecc: dict[tuple[int, int], int] = field(default_factory=dict)
    # Ampere and newer remap rows and answer NotSupported for page retirement; older GPUs
    # the other way round
    remaps_rows: bool = True
    remapped_rows: tuple[int, int, int, int] = (0, 0, 0, 0)  # corr, unc, pending, failure
    retired_pages: dict[int, list[int]] = field(default_factory=dict)  # cause -> addresses
    retired_pending: int = 0  # NVML_FEATURE_ENABLED when a retirement waits for a reset
    clocks_event_mask: int = 0  # nvmlClocksEventReason* bits
    sm_clock: int = 1980
    mem_clock: int = 3201
    sm_clock_max: int = 1980
    mem_clock_max: int = 3201
    power_limit_mw: int = 700_000
    supported_events: int = 0x7FF  # every nvmlEventType* bit, XID critical errors included
    xids: list[int] = field(default_factory=list)  # XID events queued for the event set
    # failure modes: NVML error codes raised by a call, by call name; "lost" fails them all
    fail: dict[str, int] = field(default_factory=dict)
    lost: bool = False


class FakeNvml:
    """State behind a fake `pynvml` module (see `module`)."""

    def __init__(
        self, gpus: list[NvGpu], *, init_error: int | None = None, old_driver: bool = False
    ) -> None:
        self.gpus = gpus
        self.init_error = init_error
        # no nvmlDeviceGetMemoryInfo_v2, no ..._v3 process call, no ClocksEventReasons (< 535)
        self.old_driver = old_driver
        self.event_sets: dict[int, list[int]] = {}  # event set id -> GPU indices registered
        self.freed_sets: list[int] = []
        self.wait_timeouts: list[int] = []
        self.initialised = False
        self.calls: list[str] = []
        self.module = self._build()

    def _check(self, call: str, handle: Any = None) -> NvGpu | None:
        nv = real_nvml
        self.calls.append(call)
        if not self.initialised:
            raise nv.NVMLError(nv.NVML_ERROR_UNINITIALIZED)
        if handle is None:
            return None
        gpu = self.gpus[handle.index]
        if gpu.lost:
            raise nv.NVMLError(nv.NVML_ERROR_GPU_IS_LOST)
        if call in gpu.fail:
            raise nv.NVMLError(gpu.fail[call])
        return gpu

    def _build(self) -> types.ModuleType:
        nv = real_nvml
        fake = self
        mod = types.ModuleType("pynvml")
        for name in dir(nv):
            if (
                name.startswith(
                    (
                        "NVMLError",
                        "NVML_",
                        "nvmlMemory_",
                        "nvmlTemperature_",
                        "nvmlEventType",
                        "nvmlClocksEventReason",
                        "nvmlClocksThrottleReason",
                    )
                )
                or name.startswith("c_nvml")
                or name in ("NVMLLibraryMismatchError", "nvmlPciInfo_t", "nvmlFriendlyObject")
            ):
                setattr(mod, name, getattr(nv, name))

        class Handle:  # stands for pynvml's opaque c_nvmlDevice_t
            def __init__(self, index: int) -> None:
                self.index = index

        def nvmlInit():
            fake.calls.append("nvmlInit")
            if fake.init_error is not None:
                raise nv.NVMLError(fake.init_error)
            fake.initialised = True
            return None

        def nvmlShutdown():
            fake._check("nvmlShutdown")
            fake.initialised = False
            return None

        def nvmlDeviceGetCount():
            fake._check("nvmlDeviceGetCount")
            return len(fake.gpus)

        def nvmlDeviceGetHandleByIndex(index):
            fake._check("nvmlDeviceGetHandleByIndex")
            if not 0 <= index < len(fake.gpus):
                raise nv.NVMLError(nv.NVML_ERROR_INVALID_ARGUMENT)
            return Handle(index)

        def nvmlDeviceGetName(handle):
            return fake._check("nvmlDeviceGetName", handle).name

        def nvmlDeviceGetUUID(handle):
            return fake._check("nvmlDeviceGetUUID", handle).uuid

        def nvmlDeviceGetPciInfo(handle):
            gpu = fake._check("nvmlDeviceGetPciInfo", handle)
            info = nv.nvmlPciInfo_t()
            info.busId = gpu.bus_id.encode()
            info.busIdLegacy = gpu.bus_id.encode()
            return info

        def nvmlDeviceGetMemoryInfo(handle, version=None):
            gpu = fake._check("nvmlDeviceGetMemoryInfo", handle)
            if not version:
                mem = nv.c_nvmlMemory_t()
                mem.total, mem.used = gpu.total, gpu.used + gpu.reserved
                mem.free = gpu.total - mem.used
                return mem
            if fake.old_driver:
                raise nv.NVMLError(nv.NVML_ERROR_FUNCTION_NOT_FOUND)
            mem = nv.c_nvmlMemory_v2_t()
            mem.version = version
            mem.total, mem.reserved, mem.used = gpu.total, gpu.reserved, gpu.used
            mem.free = gpu.total - gpu.used - gpu.reserved
            return mem

        def processes(call: str, handle: Any, exists: bool) -> list:
            gpu = fake._check(call, handle)
            if not exists:
                raise nv.NVMLError(nv.NVML_ERROR_FUNCTION_NOT_FOUND)
            out = []
            for pid, used in gpu.processes:
                info = nv.c_nvmlProcessInfo_v2_t()
                info.pid = pid
                info.usedGpuMemory = (
                    nv.NVML_VALUE_NOT_AVAILABLE_ulonglong.value if used is None else used
                )
                obj = nv.nvmlStructToFriendlyObject(info)
                if obj.usedGpuMemory == nv.NVML_VALUE_NOT_AVAILABLE_ulonglong.value:
                    obj.usedGpuMemory = None  # what pynvml does with "not available"
                out.append(obj)
            return out

        def nvmlDeviceGetComputeRunningProcesses_v2(handle):
            return processes("nvmlDeviceGetComputeRunningProcesses_v2", handle, True)

        def nvmlDeviceGetComputeRunningProcesses_v3(handle):
            return processes("nvmlDeviceGetComputeRunningProcesses_v3", handle, not fake.old_driver)

        def nvmlDeviceGetComputeRunningProcesses(handle):
            try:
                return processes(
                    "nvmlDeviceGetComputeRunningProcesses", handle, not fake.old_driver
                )
            except nv.NVMLError_FunctionNotFound:
                # pynvml's @throwOnVersionMismatch on the unversioned call
                raise nv.NVMLLibraryMismatchError(
                    "Unversioned function called and the pyNVML "
                    "version does not match the NVML lib version."
                ) from None

        def nvmlDeviceGetUtilizationRates(handle):
            gpu = fake._check("nvmlDeviceGetUtilizationRates", handle)
            util = nv.c_nvmlUtilization_t()
            util.gpu, util.memory = gpu.util, 5
            return util

        def nvmlDeviceGetTemperature(handle, sensor):
            gpu = fake._check("nvmlDeviceGetTemperature", handle)
            if sensor != nv.NVML_TEMPERATURE_GPU:
                raise nv.NVMLError(nv.NVML_ERROR_INVALID_ARGUMENT)
            return gpu.temp

        def nvmlDeviceGetTemperatureV(handle, sensor, version=nv.nvmlTemperature_v1):
            gpu = fake._check("nvmlDeviceGetTemperatureV", handle)
            return gpu.temp

        def nvmlDeviceGetPowerUsage(handle):
            return fake._check("nvmlDeviceGetPowerUsage", handle).power_mw

        def nvmlDeviceGetEccMode(handle):
            return list(fake._check("nvmlDeviceGetEccMode", handle).ecc_mode)

        def nvmlDeviceGetTotalEccErrors(handle, errorType, counterType):
            gpu = fake._check("nvmlDeviceGetTotalEccErrors", handle)
            if gpu.ecc_mode[0] != nv.NVML_FEATURE_ENABLED:
                raise nv.NVMLError(nv.NVML_ERROR_NOT_SUPPORTED)
            if errorType not in (0, 1) or counterType not in (0, 1):
                raise nv.NVMLError(nv.NVML_ERROR_INVALID_ARGUMENT)
            return gpu.ecc.get((errorType, counterType), 0)

        def nvmlDeviceGetRetiredPages(device, sourceFilter):
            gpu = fake._check("nvmlDeviceGetRetiredPages", device)
            if gpu.remaps_rows:
                raise nv.NVMLError(nv.NVML_ERROR_NOT_SUPPORTED)
            return list(gpu.retired_pages.get(sourceFilter, []))

        def nvmlDeviceGetRetiredPagesPendingStatus(device):
            gpu = fake._check("nvmlDeviceGetRetiredPagesPendingStatus", device)
            if gpu.remaps_rows:
                raise nv.NVMLError(nv.NVML_ERROR_NOT_SUPPORTED)
            return int(gpu.retired_pending)

        def nvmlDeviceGetRemappedRows(device):
            gpu = fake._check("nvmlDeviceGetRemappedRows", device)
            if not gpu.remaps_rows:
                raise nv.NVMLError(nv.NVML_ERROR_NOT_SUPPORTED)
            return tuple(gpu.remapped_rows)

        def nvmlDeviceGetCurrentClocksEventReasons(handle):
            gpu = fake._check("nvmlDeviceGetCurrentClocksEventReasons", handle)
            if fake.old_driver:  # pynvml's _nvmlGetFunctionPointer on a driver without it
                raise nv.NVMLError(nv.NVML_ERROR_FUNCTION_NOT_FOUND)
            return gpu.clocks_event_mask

        def nvmlDeviceGetCurrentClocksThrottleReasons(handle):
            return fake._check(
                "nvmlDeviceGetCurrentClocksThrottleReasons", handle
            ).clocks_event_mask

        def nvmlDeviceGetClockInfo(handle, type):
            gpu = fake._check("nvmlDeviceGetClockInfo", handle)
            clocks = {nv.NVML_CLOCK_SM: gpu.sm_clock, nv.NVML_CLOCK_MEM: gpu.mem_clock}
            if type not in clocks:
                raise nv.NVMLError(nv.NVML_ERROR_NOT_SUPPORTED)
            return clocks[type]

        def nvmlDeviceGetMaxClockInfo(handle, type):
            gpu = fake._check("nvmlDeviceGetMaxClockInfo", handle)
            clocks = {nv.NVML_CLOCK_SM: gpu.sm_clock_max, nv.NVML_CLOCK_MEM: gpu.mem_clock_max}
            if type not in clocks:
                raise nv.NVMLError(nv.NVML_ERROR_NOT_SUPPORTED)
            return clocks[type]

        def nvmlDeviceGetEnforcedPowerLimit(handle):
            return fake._check("nvmlDeviceGetEnforcedPowerLimit", handle).power_limit_mw

        class EventSet:  # stands for pynvml's opaque c_nvmlEventSet_t
            def __init__(self, ident: int) -> None:
                self.ident = ident

        def nvmlDeviceGetSupportedEventTypes(handle):
            return fake._check("nvmlDeviceGetSupportedEventTypes", handle).supported_events

        def nvmlEventSetCreate():
            fake._check("nvmlEventSetCreate")
            ident = len(fake.event_sets) + len(fake.freed_sets) + 1
            fake.event_sets[ident] = []
            return EventSet(ident)

        def nvmlDeviceRegisterEvents(handle, eventTypes, eventSet):
            gpu = fake._check("nvmlDeviceRegisterEvents", handle)
            if eventTypes & ~gpu.supported_events:
                raise nv.NVMLError(nv.NVML_ERROR_NOT_SUPPORTED)
            fake.event_sets[eventSet.ident].append(handle.index)
            return None

        def nvmlEventSetWait(eventSet, timeoutms):
            fake._check("nvmlEventSetWait")
            fake.wait_timeouts.append(timeoutms)
            for index in fake.event_sets[eventSet.ident]:
                gpu = fake.gpus[index]
                if gpu.xids:
                    data = nv.c_nvmlEventData_t()
                    data.eventType = nv.nvmlEventTypeXidCriticalError
                    data.eventData = gpu.xids.pop(0)
                    return data
            raise nv.NVMLError(nv.NVML_ERROR_TIMEOUT)  # what a zero timeout gives when idle

        def nvmlEventSetFree(eventSet):
            fake._check("nvmlEventSetFree")
            del fake.event_sets[eventSet.ident]
            fake.freed_sets.append(eventSet.ident)
            return None

        HEALTH_FNS = (
            nvmlDeviceGetEccMode,
            nvmlDeviceGetTotalEccErrors,
            nvmlDeviceGetRetiredPages,
            nvmlDeviceGetRetiredPagesPendingStatus,
            nvmlDeviceGetRemappedRows,
            nvmlDeviceGetCurrentClocksEventReasons,
            nvmlDeviceGetCurrentClocksThrottleReasons,
            nvmlDeviceGetClockInfo,
            nvmlDeviceGetMaxClockInfo,
            nvmlDeviceGetEnforcedPowerLimit,
            nvmlDeviceGetSupportedEventTypes,
            nvmlEventSetCreate,
            nvmlDeviceRegisterEvents,
            nvmlEventSetWait,
            nvmlEventSetFree,
        )
        for fn in (
            nvmlInit,
            nvmlShutdown,
            nvmlDeviceGetCount,
            nvmlDeviceGetHandleByIndex,
            nvmlDeviceGetName,
            nvmlDeviceGetUUID,
            nvmlDeviceGetPciInfo,
            nvmlDeviceGetMemoryInfo,
            nvmlDeviceGetComputeRunningProcesses,
            nvmlDeviceGetComputeRunningProcesses_v2,
            nvmlDeviceGetComputeRunningProcesses_v3,
            nvmlDeviceGetUtilizationRates,
            nvmlDeviceGetTemperature,
            nvmlDeviceGetTemperatureV,
            nvmlDeviceGetPowerUsage,
            *HEALTH_FNS,
        ):
            setattr(mod, fn.__name__, fn)
        return mod


NVML_FUNCTIONS = (
    "nvmlInit",
    "nvmlShutdown",
    "nvmlDeviceGetCount",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetName",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetPciInfo",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetTemperatureV",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetEccMode",
    "nvmlDeviceGetTotalEccErrors",
    "nvmlDeviceGetRetiredPages",
    "nvmlDeviceGetRetiredPagesPendingStatus",
    "nvmlDeviceGetRemappedRows",
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetCurrentClocksThrottleReasons",
    "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetMaxClockInfo",
    "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetSupportedEventTypes",
    "nvmlEventSetCreate",
    "nvmlDeviceRegisterEvents",
    "nvmlEventSetWait",
    "nvmlEventSetFree",
)

# ---------------------------------------------------------------------------------- amdsmi


def real_amdsmi() -> types.ModuleType:
    """The installed amdsmi package, imported with a stand-in for libamd_smi.so so that its
    exception classes, enums and structures are usable; product code keeps seeing the real
    import failure (the package is taken out of sys.modules again)."""
    cached = getattr(real_amdsmi, "_module", None)
    if cached is not None:
        return cached

    class _Symbol:
        def __call__(self, *args: Any) -> int:
            raise AssertionError("the stand-in libamd_smi.so must never be called")

    class _Lib:
        def __getattr__(self, name: str) -> _Symbol:
            symbol = _Symbol()
            object.__setattr__(self, name, symbol)
            return symbol

    saved = {k: v for k, v in sys.modules.items() if k == "amdsmi" or k.startswith("amdsmi.")}
    for k in saved:
        del sys.modules[k]
    real_cdll = ctypes.CDLL
    ctypes.CDLL = lambda *a, **k: _Lib()  # type: ignore[assignment,misc]
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            module = importlib.import_module("amdsmi")
    finally:
        ctypes.CDLL = real_cdll  # type: ignore[misc]
        for k in [k for k in sys.modules if k == "amdsmi" or k.startswith("amdsmi.")]:
            del sys.modules[k]
        sys.modules.update(saved)
    real_amdsmi._module = module  # type: ignore[attr-defined]
    return module


@dataclass
class AmdGpu:
    bdf: str = "0000:05:00.0"
    hip_id: int | str | None = 0  # None: the library has no enumeration info for it
    market_name: str = "AMD Instinct MI300X"
    uuid: str = "0aff74a1-0000-1000-8000-000000000000"
    vram_total: int = 206_141_652_992
    vram_used: int = 290_000_000
    gfx_activity: int | str = 12
    power: dict[str, Any] = field(
        default_factory=lambda: {
            "socket_power": 250,
            "current_socket_power": 250,
            "average_socket_power": "N/A",
            "gfx_voltage": "N/A",
            "soc_voltage": "N/A",
            "mem_voltage": "N/A",
            "power_limit": 750,
        }
    )
    temps: dict[str, int] = field(default_factory=lambda: {"HOTSPOT": 48, "EDGE": 40})
    processes: list[tuple[int, int]] = field(default_factory=list)
    # health (an MI300X's figures by default)
    ecc_enabled_blocks: int = 0x3FFF  # blocks with ECC on (0: off)
    ecc_counts: tuple[int, int, int] = (0, 0, 0)  # correctable, uncorrectable, deferred
    bad_pages: list[tuple[int, int]] = field(default_factory=list)  # (address, status)
    # amdsmi_get_violation_status active_* flags; None: the call is not supported here
    violations: dict[str, bool] | None = field(default_factory=dict)
    throttle_status: bool | str = "N/A"  # gpu_metrics; MI300 gives N/A, older GPUs a bool
    gfx_clock: tuple[int, int] = (2100, 2100)  # (clk, max_clk) MHz
    mem_clock: tuple[int, int] = (1300, 1300)
    power_cap_uw: int = 750_000_000
    # amdsmi status codes raised by a call, by call name
    fail: dict[str, int] = field(default_factory=dict)


class FakeAmdSmi:
    """State behind a fake `amdsmi` module (see `module`)."""

    def __init__(
        self,
        gpus: list[AmdGpu],
        *,
        init_error: int | None = None,
        has_enumeration_info: bool = True,
    ) -> None:
        self.real = real_amdsmi()
        self.gpus = gpus
        self.init_error = init_error
        self.has_enumeration_info = has_enumeration_info
        self.initialised = False
        self.module = self._build()

    def _gpu(self, call: str, handle: Any) -> AmdGpu:
        smi = self.real
        if not self.initialised:
            raise smi.AmdSmiLibraryException(smi.amdsmi_wrapper.AMDSMI_STATUS_NOT_INIT)
        if not isinstance(handle, smi.amdsmi_wrapper.amdsmi_processor_handle):
            raise smi.AmdSmiParameterException(handle, smi.amdsmi_wrapper.amdsmi_processor_handle)
        gpu = self.gpus[handle.value - 1]
        if call in gpu.fail:
            raise smi.AmdSmiLibraryException(gpu.fail[call])
        return gpu

    def _build(self) -> types.ModuleType:
        smi = self.real
        w = smi.amdsmi_wrapper
        fake = self
        mod = types.ModuleType("amdsmi")
        for name in dir(smi):
            if name.startswith("AmdSmi") or name == "amdsmi_wrapper":
                setattr(mod, name, getattr(smi, name))
        max32 = 0xFFFFFFFF

        def amdsmi_init(flag=smi.AmdSmiInitFlags.INIT_AMD_GPUS):
            if not isinstance(flag, smi.AmdSmiInitFlags):
                raise smi.AmdSmiParameterException(flag, smi.AmdSmiInitFlags)
            if fake.init_error is not None:
                raise smi.AmdSmiLibraryException(fake.init_error)
            fake.initialised = True

        def amdsmi_shut_down():
            fake.initialised = False

        def amdsmi_get_processor_handles():
            if not fake.initialised:
                raise smi.AmdSmiLibraryException(w.AMDSMI_STATUS_NOT_INIT)
            return [w.amdsmi_processor_handle(i + 1) for i in range(len(fake.gpus))]

        def amdsmi_get_gpu_device_bdf(processor_handle):
            return fake._gpu("amdsmi_get_gpu_device_bdf", processor_handle).bdf

        def amdsmi_get_gpu_device_uuid(processor_handle):
            return fake._gpu("amdsmi_get_gpu_device_uuid", processor_handle).uuid

        def amdsmi_get_gpu_enumeration_info(processor_handle):
            gpu = fake._gpu("amdsmi_get_gpu_enumeration_info", processor_handle)
            hip = gpu.hip_id
            return {
                "drm_render": 128,
                "drm_card": 0,
                "hsa_id": 1,
                # the real call maps UINT32_MAX to "N/A" through _validate_if_max_uint
                "hip_id": "N/A" if hip is None or hip == max32 else hip,
                "hip_uuid": "GPU-0000",
            }

        def amdsmi_get_gpu_asic_info(processor_handle):
            gpu = fake._gpu("amdsmi_get_gpu_asic_info", processor_handle)
            return {
                "market_name": gpu.market_name or "N/A",
                "vendor_id": "0x1002",
                "vendor_name": "Advanced Micro Devices Inc. [AMD/ATI]",
                "subvendor_id": "0x1002",
                "device_id": "0x74a1",
                "rev_id": "0x00",
                "asic_serial": "0x0000000000000000",
                "oam_id": 0,
                "num_compute_units": 304,
                "target_graphics_version": "gfx942",
                "subsystem_id": "0x74a1",
            }

        def _memory_type(mem_type):
            if not isinstance(mem_type, smi.AmdSmiMemoryType):
                raise smi.AmdSmiParameterException(mem_type, smi.AmdSmiMemoryType)

        def amdsmi_get_gpu_memory_total(processor_handle, mem_type):
            gpu = fake._gpu("amdsmi_get_gpu_memory_total", processor_handle)
            _memory_type(mem_type)
            return gpu.vram_total

        def amdsmi_get_gpu_memory_usage(processor_handle, mem_type):
            gpu = fake._gpu("amdsmi_get_gpu_memory_usage", processor_handle)
            _memory_type(mem_type)
            return gpu.vram_used

        def amdsmi_get_gpu_vram_usage(processor_handle):
            gpu = fake._gpu("amdsmi_get_gpu_vram_usage", processor_handle)
            return {"vram_total": gpu.vram_total // 2**20, "vram_used": gpu.vram_used // 2**20}

        def amdsmi_get_gpu_activity(processor_handle):
            gpu = fake._gpu("amdsmi_get_gpu_activity", processor_handle)
            return {"gfx_activity": gpu.gfx_activity, "umc_activity": "N/A", "mm_activity": "N/A"}

        def amdsmi_get_temp_metric(processor_handle, sensor_type, metric):
            gpu = fake._gpu("amdsmi_get_temp_metric", processor_handle)
            if not isinstance(sensor_type, smi.AmdSmiTemperatureType):
                raise smi.AmdSmiParameterException(sensor_type, smi.AmdSmiTemperatureType)
            if not isinstance(metric, smi.AmdSmiTemperatureMetric):
                raise smi.AmdSmiParameterException(metric, smi.AmdSmiTemperatureMetric)
            if sensor_type.name not in gpu.temps:
                raise smi.AmdSmiLibraryException(w.AMDSMI_STATUS_NOT_SUPPORTED)
            return gpu.temps[sensor_type.name]

        def amdsmi_get_power_info(processor_handle):
            return dict(fake._gpu("amdsmi_get_power_info", processor_handle).power)

        def amdsmi_get_gpu_ecc_enabled(processor_handle):
            return fake._gpu("amdsmi_get_gpu_ecc_enabled", processor_handle).ecc_enabled_blocks

        def amdsmi_get_gpu_total_ecc_count(processor_handle):
            gpu = fake._gpu("amdsmi_get_gpu_total_ecc_count", processor_handle)
            corr, unc, deferred = gpu.ecc_counts
            return {
                "correctable_count": corr,
                "uncorrectable_count": unc,
                "deferred_count": deferred,
            }

        def amdsmi_get_gpu_bad_page_info(processor_handle):
            gpu = fake._gpu("amdsmi_get_gpu_bad_page_info", processor_handle)
            return [
                {"value": i, "page_address": addr, "page_size": 4096, "status": status}
                for i, (addr, status) in enumerate(gpu.bad_pages)
            ]

        def amdsmi_get_violation_status(processor_handle):
            gpu = fake._gpu("amdsmi_get_violation_status", processor_handle)
            if gpu.violations is None:
                raise smi.AmdSmiLibraryException(w.AMDSMI_STATUS_NOT_SUPPORTED)
            out: dict[str, Any] = {
                key: "N/A"
                for key in (
                    "reference_timestamp",
                    "violation_timestamp",
                    "acc_counter",
                    "acc_prochot_thrm",
                    "acc_ppt_pwr",
                    "acc_socket_thrm",
                    "acc_vr_thrm",
                    "acc_hbm_thrm",
                    "per_prochot_thrm",
                    "per_ppt_pwr",
                    "per_socket_thrm",
                    "per_vr_thrm",
                    "per_hbm_thrm",
                )
            }
            for key in (
                "active_prochot_thrm",
                "active_ppt_pwr",
                "active_socket_thrm",
                "active_vr_thrm",
                "active_hbm_thrm",
            ):
                out[key] = bool(gpu.violations.get(key, False))
            return out

        def amdsmi_get_gpu_metrics_info(processor_handle):
            gpu = fake._gpu("amdsmi_get_gpu_metrics_info", processor_handle)
            # every key the real call returns, "N/A" where the GPU does not fill it
            metrics = smi.amdsmi_interface._NA_amdsmi_get_gpu_metrics_info()
            metrics["throttle_status"] = gpu.throttle_status
            metrics["temperature_hotspot"] = gpu.temps.get("HOTSPOT", "N/A")
            metrics["current_gfxclk"] = gpu.gfx_clock[0]
            return metrics

        def amdsmi_get_clock_info(processor_handle, clock_type):
            gpu = fake._gpu("amdsmi_get_clock_info", processor_handle)
            if not isinstance(clock_type, smi.AmdSmiClkType):
                raise smi.AmdSmiParameterException(clock_type, smi.AmdSmiClkType)
            clocks = {smi.AmdSmiClkType.GFX: gpu.gfx_clock, smi.AmdSmiClkType.MEM: gpu.mem_clock}
            if clock_type not in clocks:
                raise smi.AmdSmiLibraryException(w.AMDSMI_STATUS_NOT_SUPPORTED)
            clk, max_clk = clocks[clock_type]
            return {
                "clk": clk,
                "min_clk": 500,
                "max_clk": max_clk,
                "clk_locked": False,
                "clk_deep_sleep": 0,
            }

        def amdsmi_get_power_cap_info(processor_handle):
            gpu = fake._gpu("amdsmi_get_power_cap_info", processor_handle)
            return {
                "power_cap": gpu.power_cap_uw,
                "default_power_cap": gpu.power_cap_uw,
                "dpm_cap": 2100,
                "min_power_cap": 0,
                "max_power_cap": gpu.power_cap_uw,
            }

        def amdsmi_get_gpu_process_list(processor_handle):
            gpu = fake._gpu("amdsmi_get_gpu_process_list", processor_handle)
            return [
                {
                    "name": "python3",
                    "pid": pid,
                    "mem": vram,
                    "engine_usage": {"gfx": 0, "enc": 0},
                    "memory_usage": {"gtt_mem": 2 * 2**20, "cpu_mem": 0, "vram_mem": vram},
                    "cu_occupancy": "N/A",
                }
                for pid, vram in gpu.processes
            ]

        fns = [
            amdsmi_init,
            amdsmi_shut_down,
            amdsmi_get_processor_handles,
            amdsmi_get_gpu_device_bdf,
            amdsmi_get_gpu_device_uuid,
            amdsmi_get_gpu_asic_info,
            amdsmi_get_gpu_memory_total,
            amdsmi_get_gpu_memory_usage,
            amdsmi_get_gpu_vram_usage,
            amdsmi_get_gpu_activity,
            amdsmi_get_temp_metric,
            amdsmi_get_power_info,
            amdsmi_get_gpu_process_list,
            amdsmi_get_gpu_ecc_enabled,
            amdsmi_get_gpu_total_ecc_count,
            amdsmi_get_gpu_bad_page_info,
            amdsmi_get_violation_status,
            amdsmi_get_gpu_metrics_info,
            amdsmi_get_clock_info,
            amdsmi_get_power_cap_info,
        ]
        if self.has_enumeration_info:
            fns.append(amdsmi_get_gpu_enumeration_info)
        for fn in fns:
            setattr(mod, fn.__name__, fn)
        return mod


AMDSMI_FUNCTIONS = (
    "amdsmi_init",
    "amdsmi_shut_down",
    "amdsmi_get_processor_handles",
    "amdsmi_get_gpu_device_bdf",
    "amdsmi_get_gpu_device_uuid",
    "amdsmi_get_gpu_enumeration_info",
    "amdsmi_get_gpu_asic_info",
    "amdsmi_get_gpu_memory_total",
    "amdsmi_get_gpu_memory_usage",
    "amdsmi_get_gpu_vram_usage",
    "amdsmi_get_gpu_activity",
    "amdsmi_get_temp_metric",
    "amdsmi_get_power_info",
    "amdsmi_get_gpu_process_list",
    "amdsmi_get_gpu_ecc_enabled",
    "amdsmi_get_gpu_total_ecc_count",
    "amdsmi_get_gpu_bad_page_info",
    "amdsmi_get_violation_status",
    "amdsmi_get_gpu_metrics_info",
    "amdsmi_get_clock_info",
    "amdsmi_get_power_cap_info",
)
