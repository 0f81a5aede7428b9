"""GPU probes over fakes of pynvml and amdsmi (real exception classes, structures and return
shapes; scripted failures), and the real libraries on this GPU-less machine."""

from __future__ import annotations

import inspect
import sys

import pynvml
import pytest

from vsup.telemetry.gpu import GpuProbeError, NoneProbe, open_probe
from vsup.telemetry.gpu.amd import AmdSmiProbe
from vsup.telemetry.gpu.nvml import NvmlProbe

from tests.unit.telemetry.gpu_fakes import (
    AMDSMI_FUNCTIONS,
    NVML_FUNCTIONS,
    AmdGpu,
    FakeAmdSmi,
    FakeNvml,
    NvGpu,
    real_amdsmi,
)

GiB = 2**30
UINT64_MAX = 0xFFFFFFFFFFFFFFFF


def _params(fn) -> list[tuple[str, object]]:
    return [(p.name, p.default) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize("name", NVML_FUNCTIONS)
def test_nvml_fake_has_the_real_signatures(name: str) -> None:
    fake = FakeNvml([NvGpu()]).module
    assert _params(getattr(fake, name)) == _params(getattr(pynvml, name))


@pytest.mark.parametrize("name", AMDSMI_FUNCTIONS)
def test_amdsmi_fake_has_the_real_signatures(name: str) -> None:
    fake = FakeAmdSmi([AmdGpu()]).module
    assert _params(getattr(fake, name)) == _params(getattr(real_amdsmi(), name))


# ---------------------------------------------------------------------------------- NVML


def test_nvml_reads_every_gpu_in_one_pass() -> None:
    fake = FakeNvml(
        [
            NvGpu(processes=[(4242, 10 * GiB), (4243, 512 * 2**20)], used=11 * GiB),
            NvGpu(name="NVIDIA H200", bus_id="00000000:2A:00.0", uuid="GPU-1", processes=[]),
        ]
    )
    probe = NvmlProbe(fake.module)
    g0, g1 = probe.snapshot()
    assert (g0.index, g0.name, g0.bdf) == (0, "NVIDIA H200", "0000:17:00.0")
    assert g0.hbm_total_bytes == 150_754_820_096
    assert g0.hbm_used_bytes == 11 * GiB  # memory v2: without the driver's reserved memory
    assert (g0.util_pct, g0.temp_c, g0.power_w) == (37.0, 41.0, 123.456)
    assert g0.processes == ((4242, 10 * GiB), (4243, 512 * 2**20))
    assert g0.per_process_supported and g0.error is None
    assert (g1.index, g1.bdf, g1.uuid, g1.processes) == (1, "0000:2a:00.0", "GPU-1", ())
    assert g1.per_process_supported  # an empty list that NVML gave: really no process
    assert "nvmlDeviceGetMemoryInfo_v1" not in fake.calls


def test_nvml_old_driver_falls_back_to_memory_v1_and_the_v2_process_call() -> None:
    fake = FakeNvml([NvGpu(processes=[(7, GiB)])], old_driver=True)
    probe = NvmlProbe(fake.module)
    (g,) = probe.snapshot()
    assert g.hbm_used_bytes == 600 * 2**20 + 512 * 2**20  # v1 `used` includes `reserved`
    assert g.processes == ((7, GiB),) and g.per_process_supported
    fake.calls.clear()
    probe.snapshot()
    # the fallbacks are remembered: no failing call is retried every poll
    assert fake.calls.count("nvmlDeviceGetComputeRunningProcesses") == 0
    assert fake.calls.count("nvmlDeviceGetComputeRunningProcesses_v3") == 0
    assert fake.calls.count("nvmlDeviceGetComputeRunningProcesses_v2") == 1
    assert fake.calls.count("nvmlDeviceGetMemoryInfo") == 1


def test_nvml_process_memory_not_available_is_none() -> None:
    fake = FakeNvml([NvGpu(processes=[(7, None), (8, GiB)])])
    (g,) = NvmlProbe(fake.module).snapshot()
    assert g.processes == ((7, None), (8, GiB))


def test_nvml_process_list_not_supported_means_unknown_not_empty() -> None:
    gpu = NvGpu(fail={"nvmlDeviceGetComputeRunningProcesses": pynvml.NVML_ERROR_NOT_SUPPORTED})
    (g,) = NvmlProbe(FakeNvml([gpu]).module).snapshot()
    assert g.processes == () and not g.per_process_supported
    assert g.hbm_used_bytes is not None


def test_nvml_unsupported_sensors_are_none() -> None:
    gpu = NvGpu(
        fail={
            "nvmlDeviceGetPowerUsage": pynvml.NVML_ERROR_NOT_SUPPORTED,
            "nvmlDeviceGetTemperature": pynvml.NVML_ERROR_NOT_SUPPORTED,
            "nvmlDeviceGetUtilizationRates": pynvml.NVML_ERROR_NO_PERMISSION,
            "nvmlDeviceGetMemoryInfo": pynvml.NVML_ERROR_UNKNOWN,
        }
    )
    (g,) = NvmlProbe(FakeNvml([gpu]).module).snapshot()
    assert (g.power_w, g.temp_c, g.util_pct) == (None, None, None)
    assert (g.hbm_total_bytes, g.hbm_used_bytes) == (None, None)
    assert g.error is None and g.name == "NVIDIA H200"


def test_nvml_a_lost_gpu_degrades_to_none_and_the_others_still_report() -> None:
    fake = FakeNvml([NvGpu(processes=[(1, GiB)]), NvGpu(processes=[(2, GiB)])])
    probe = NvmlProbe(fake.module)
    fake.gpus[0].lost = True
    g0, g1 = probe.snapshot()
    assert g0.error is not None and "lost" in g0.error
    assert (g0.hbm_used_bytes, g0.processes, g0.name) == (None, (), "NVIDIA H200")
    assert g1.error is None and g1.processes == ((2, GiB),)


def test_nvml_a_gpu_lost_before_the_probe_opened_does_not_stop_it() -> None:
    probe = NvmlProbe(FakeNvml([NvGpu(lost=True), NvGpu()]).module)
    g0, g1 = probe.snapshot()
    assert g0.error and g0.name is None and g1.error is None


@pytest.mark.parametrize(
    "code",
    [
        pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
        pynvml.NVML_ERROR_LIBRARY_NOT_FOUND,
        pynvml.NVML_ERROR_NO_PERMISSION,
    ],
)
def test_nvml_that_cannot_start_is_a_probe_error(code: int) -> None:
    with pytest.raises(GpuProbeError, match="NVML"):
        NvmlProbe(FakeNvml([], init_error=code).module)


def test_nvml_close_shuts_down_once_and_later_snapshots_are_empty() -> None:
    fake = FakeNvml([NvGpu()])
    probe = NvmlProbe(fake.module)
    probe.close()
    probe.close()
    assert fake.calls.count("nvmlShutdown") == 1
    assert probe.snapshot() == ()


# ---------------------------------------------------------------------------------- amdsmi


def test_amdsmi_orders_by_hip_id_and_reads_every_value() -> None:
    fake = FakeAmdSmi(
        [
            AmdGpu(bdf="0000:75:00.0", hip_id=1, processes=[(900, 20 * GiB)]),
            AmdGpu(bdf="0000:05:00.0", hip_id=0, processes=[(901, 30 * GiB), (902, 64 * 2**20)]),
        ]
    )
    probe = AmdSmiProbe(fake.module)
    g0, g1 = probe.snapshot()
    assert (g0.index, g0.bdf, g1.index, g1.bdf) == (0, "0000:05:00.0", 1, "0000:75:00.0")
    assert g0.name == "AMD Instinct MI300X" and g0.uuid
    assert (g0.hbm_total_bytes, g0.hbm_used_bytes) == (206_141_652_992, 290_000_000)
    assert (g0.util_pct, g0.temp_c, g0.power_w) == (12.0, 48.0, 250.0)
    assert g0.processes == ((901, 30 * GiB), (902, 64 * 2**20)) and g0.per_process_supported
    assert g1.processes == ((900, 20 * GiB),)


@pytest.mark.parametrize("enumeration", ["missing", "N/A"])
def test_amdsmi_without_hip_ids_numbers_gpus_in_pci_order(enumeration: str) -> None:
    gpus = [AmdGpu(bdf="0000:75:00.0", hip_id=None), AmdGpu(bdf="0000:05:00.0", hip_id=None)]
    fake = FakeAmdSmi(gpus, has_enumeration_info=enumeration == "N/A")
    assert [(g.index, g.bdf) for g in AmdSmiProbe(fake.module).snapshot()] == [
        (0, "0000:05:00.0"),
        (1, "0000:75:00.0"),
    ]


def test_amdsmi_memory_falls_back_to_vram_usage_in_mib() -> None:
    w = real_amdsmi().amdsmi_wrapper
    gpu = AmdGpu(
        vram_used=3 * GiB, fail={"amdsmi_get_gpu_memory_usage": w.AMDSMI_STATUS_NOT_SUPPORTED}
    )
    probe = AmdSmiProbe(FakeAmdSmi([gpu]).module)
    (g,) = probe.snapshot()
    assert g.hbm_used_bytes == 3 * GiB
    assert g.hbm_total_bytes == (206_141_652_992 // 2**20) * 2**20
    assert g.error is None


def test_amdsmi_na_and_all_ones_values_are_unknown() -> None:
    gpu = AmdGpu(
        gfx_activity="N/A",
        power={
            "socket_power": "N/A",
            "current_socket_power": 0xFFFF,
            "average_socket_power": "N/A",
            "power_limit": "N/A",
        },
        processes=[(77, UINT64_MAX), (78, GiB)],
    )
    (g,) = AmdSmiProbe(FakeAmdSmi([gpu]).module).snapshot()
    assert (g.util_pct, g.power_w) == (None, None)
    assert g.processes == ((77, None), (78, GiB))


def test_amdsmi_without_a_hotspot_sensor_reads_the_edge_sensor() -> None:
    gpu = AmdGpu(temps={"EDGE": 39})
    probe = AmdSmiProbe(FakeAmdSmi([gpu]).module)
    assert probe.snapshot()[0].temp_c == 39.0
    assert probe.snapshot()[0].temp_c == 39.0


def test_amdsmi_older_gpus_report_average_socket_power() -> None:
    gpu = AmdGpu(
        power={"socket_power": "N/A", "current_socket_power": "N/A", "average_socket_power": 300}
    )
    assert AmdSmiProbe(FakeAmdSmi([gpu]).module).snapshot()[0].power_w == 300.0


def test_amdsmi_process_list_refused_means_unknown() -> None:
    w = real_amdsmi().amdsmi_wrapper
    gpu = AmdGpu(
        processes=[(1, GiB)], fail={"amdsmi_get_gpu_process_list": w.AMDSMI_STATUS_NO_PERM}
    )
    (g,) = AmdSmiProbe(FakeAmdSmi([gpu]).module).snapshot()
    assert g.processes == () and not g.per_process_supported


def test_amdsmi_a_failing_gpu_is_marked_and_the_others_still_report() -> None:
    w = real_amdsmi().amdsmi_wrapper
    fake = FakeAmdSmi([AmdGpu(hip_id=0), AmdGpu(hip_id=1, bdf="0000:06:00.0")])
    probe = AmdSmiProbe(fake.module)
    # the first GPU's driver goes away after the probe opened
    fake.gpus[0].fail = {name: w.AMDSMI_STATUS_DRIVER_NOT_LOADED for name in AMDSMI_FUNCTIONS}
    g0, g1 = probe.snapshot()
    assert g0.error is not None and "DRIVER_NOT_LOADED" in g0.error
    assert (g0.hbm_used_bytes, g0.util_pct, g0.temp_c, g0.processes) == (None, None, None, ())
    assert g0.bdf == "0000:05:00.0"  # read when the probe opened
    assert g1.error is None and g1.hbm_used_bytes == 290_000_000


def test_amdsmi_that_cannot_start_is_a_probe_error() -> None:
    w = real_amdsmi().amdsmi_wrapper
    with pytest.raises(GpuProbeError, match="amdsmi"):
        AmdSmiProbe(FakeAmdSmi([], init_error=w.AMDSMI_STATUS_DRIVER_NOT_LOADED).module)


# ---------------------------------------------------------------------------------- open_probe


def test_this_machine_has_no_gpu_library_and_gets_the_none_probe(capsys) -> None:
    probe = open_probe("auto")
    assert isinstance(probe, NoneProbe) and probe.snapshot() == () and probe.count == 0
    assert probe.reason is not None
    assert "libamd_smi.so" in probe.reason and "NVML" in probe.reason
    assert capsys.readouterr().out == ""  # amdsmi's import-time print is contained
    with pytest.raises(GpuProbeError, match="libamd_smi.so"):
        open_probe("amd")
    with pytest.raises(GpuProbeError, match="NVML"):
        open_probe("nvidia")
    with pytest.raises(GpuProbeError, match="unknown GPU vendor"):
        open_probe("intel")


def test_auto_prefers_nvml_then_amdsmi(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([NvGpu()]).module)
    monkeypatch.setitem(sys.modules, "amdsmi", FakeAmdSmi([AmdGpu()]).module)
    assert open_probe("auto").vendor == "nvidia"
    assert open_probe("amd").vendor == "amd"
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([]).module)  # NVML without a GPU
    assert open_probe("auto").vendor == "amd"
    monkeypatch.setitem(sys.modules, "amdsmi", FakeAmdSmi([]).module)
    assert open_probe("auto").vendor == "none"
    assert open_probe("none").vendor == "none"
