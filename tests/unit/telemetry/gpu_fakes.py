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
        self.old_driver = old_driver  # no nvmlDeviceGetMemoryInfo_v2, no ..._v3 process call
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
                name.startswith(("NVMLError", "NVML_", "nvmlMemory_", "nvmlTemperature_"))
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
)
