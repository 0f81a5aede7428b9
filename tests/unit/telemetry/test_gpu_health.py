"""GPU health from NVML and amdsmi over the fakes (real constants, structures and exception
classes; scripted hardware state and failures): what each driver reports, what it refuses, and
that reading it stays cheap."""

from __future__ import annotations

import json

import pynvml
import pytest

from vsup.snapshot import GpuHealth, StatusSnapshot
from vsup.telemetry.gpu.amd import AmdSmiProbe
from vsup.telemetry.gpu.nvml import NvmlProbe

from tests.support.clock import FakeClock
from tests.unit.telemetry.gpu_fakes import AmdGpu, FakeAmdSmi, FakeNvml, NvGpu, real_amdsmi

CORR, UNC = pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
VOL, AGG = pynvml.NVML_VOLATILE_ECC, pynvml.NVML_AGGREGATE_ECC


def nvml_probe(*gpus: NvGpu, every_s: float = 10.0, **kw) -> tuple[FakeNvml, NvmlProbe, FakeClock]:
    fake = FakeNvml(list(gpus), **kw)
    clock = FakeClock()
    probe = NvmlProbe(
        fake.module, health_every_s=every_s, monotonic=clock.monotonic, wall=clock.wall
    )
    return fake, probe, clock


def health(probe) -> list[GpuHealth]:
    return [g.health for g in probe.snapshot()]


# ---------------------------------------------------------------------------------- NVML


def test_nvml_a_healthy_h200_reports_zero_errors_row_remapping_and_its_limits() -> None:
    _, probe, _ = nvml_probe(NvGpu())
    (h,) = health(probe)
    assert h.ecc_enabled is True
    assert (h.ecc_volatile_corrected, h.ecc_volatile_uncorrected) == (0, 0)
    assert (h.ecc_aggregate_corrected, h.ecc_aggregate_uncorrected) == (0, 0)
    # Hopper remaps rows; page retirement is not supported there, so it is unknown, not 0
    assert (h.rows_remapped_correctable, h.rows_remapped_uncorrectable) == (0, 0)
    assert (h.row_remap_pending, h.row_remap_failed) == (False, False)
    assert (h.retired_pages, h.retired_pages_pending) == (None, None)
    assert h.ecc_deferred is None and h.bad_pages_unreservable is None  # AMD-only figures
    assert h.throttle_reasons == ()
    assert (h.sm_clock_mhz, h.sm_clock_max_mhz) == (1980.0, 1980.0)
    assert (h.mem_clock_mhz, h.mem_clock_max_mhz) == (3201.0, 3201.0)
    assert h.power_limit_w == 700.0
    assert (h.xid_count, h.xid_recent) == (0, ())
    assert h.faults() == () and h.slowdowns() == ()


def test_nvml_ecc_counts_keep_volatile_and_aggregate_apart() -> None:
    gpu = NvGpu(ecc={(CORR, VOL): 12, (UNC, VOL): 2, (CORR, AGG): 340, (UNC, AGG): 5})
    _, probe, _ = nvml_probe(gpu)
    (h,) = health(probe)
    assert (h.ecc_volatile_corrected, h.ecc_volatile_uncorrected) == (12, 2)
    assert (h.ecc_aggregate_corrected, h.ecc_aggregate_uncorrected) == (340, 5)
    assert h.faults() == ("2 uncorrectable ECC",)


def test_nvml_with_ecc_off_the_counters_are_unknown() -> None:
    _, probe, _ = nvml_probe(NvGpu(ecc_mode=(0, 0)))
    (h,) = health(probe)
    assert h.ecc_enabled is False
    assert h.ecc_volatile_uncorrected is None and h.ecc_aggregate_corrected is None


def test_nvml_older_gpus_report_retired_pages_and_a_pending_retirement() -> None:
    gpu = NvGpu(
        remaps_rows=False,
        retired_pages={
            pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS: [0x1000],
            pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR: [0x2000, 0x3000],
        },
        retired_pending=pynvml.NVML_FEATURE_ENABLED,
    )
    _, probe, _ = nvml_probe(gpu)
    (h,) = health(probe)
    assert (h.retired_pages, h.retired_pages_pending) == (3, True)
    assert h.rows_remapped_correctable is None and h.row_remap_failed is None
    assert "page retirement pending" in h.faults()


def test_nvml_a_failed_row_remap_is_a_fault() -> None:
    _, probe, _ = nvml_probe(NvGpu(remapped_rows=(3, 1, 0, 1)))
    (h,) = health(probe)
    assert (h.rows_remapped_correctable, h.rows_remapped_uncorrectable) == (3, 1)
    assert h.row_remap_failed is True and h.faults() == ("row remap failed",)


def test_nvml_throttle_bits_become_named_reasons() -> None:
    mask = (
        pynvml.nvmlClocksEventReasonSwThermalSlowdown
        | pynvml.nvmlClocksEventReasonHwSlowdown
        | pynvml.nvmlClocksEventReasonGpuIdle
    )
    _, probe, _ = nvml_probe(NvGpu(clocks_event_mask=mask, sm_clock=1100))
    (h,) = health(probe)
    assert h.throttle_reasons is not None
    assert set(h.throttle_reasons) == {"thermal", "hw_slowdown", "idle"}
    assert set(h.slowdowns()) == {"thermal", "hw_slowdown"}  # idle costs nothing
    assert (h.sm_clock_mhz, h.sm_clock_max_mhz) == (1100.0, 1980.0)


def test_nvml_drivers_before_535_give_throttle_reasons_through_the_older_call() -> None:
    mask = pynvml.nvmlClocksThrottleReasonSwPowerCap
    fake, probe, _ = nvml_probe(NvGpu(clocks_event_mask=mask), old_driver=True)
    assert health(probe)[0].throttle_reasons == ("power_cap",)
    fake.calls.clear()
    assert health(probe)[0].throttle_reasons == ("power_cap",)
    # the missing call is not retried every poll
    assert "nvmlDeviceGetCurrentClocksEventReasons" not in fake.calls
    assert fake.calls.count("nvmlDeviceGetCurrentClocksThrottleReasons") == 1


def test_nvml_xid_events_are_drained_without_waiting_and_counted() -> None:
    fake, probe, clock = nvml_probe(NvGpu(), NvGpu())
    fake.gpus[1].xids = [45, 79]
    h0, h1 = health(probe)
    assert (h0.xid_count, h1.xid_count) == (0, 2)
    assert [(e.xid, e.hardware) for e in h1.xid_recent] == [(45, False), (79, True)]
    assert h1.xid_recent[1].what == "GPU has fallen off the bus"
    assert h1.xid_recent[1].at == "2027-01-15T08:00:00.000Z"
    assert h1.faults() == ("XID 79",)
    assert set(fake.wait_timeouts) == {0}  # never blocks the worker thread
    fake.gpus[1].xids = [48]
    assert health(probe)[1].xid_count == 3
    # the last hour is kept; the count stays
    clock.advance(3601)
    later = health(probe)[1]
    assert later.xid_count == 3 and later.xid_recent == ()


@pytest.mark.parametrize(
    "gpu",
    [
        NvGpu(supported_events=pynvml.nvmlEventTypeSingleBitEccError),
        NvGpu(fail={"nvmlDeviceRegisterEvents": pynvml.NVML_ERROR_NO_PERMISSION}),
        NvGpu(fail={"nvmlDeviceGetSupportedEventTypes": pynvml.NVML_ERROR_NOT_SUPPORTED}),
    ],
    ids=["no-xid-events", "no-permission", "not-supported"],
)
def test_nvml_without_xid_events_the_count_is_unknown_and_not_retried(gpu: NvGpu) -> None:
    fake, probe, _ = nvml_probe(gpu)
    assert health(probe)[0].xid_count is None
    fake.calls.clear()
    assert health(probe)[0].xid_count is None
    assert not {"nvmlDeviceGetSupportedEventTypes", "nvmlEventSetWait"} & set(fake.calls)
    assert not fake.event_sets  # a set that could not be registered was freed


def test_nvml_slow_counters_are_read_every_interval_fast_ones_every_snapshot() -> None:
    fake, probe, clock = nvml_probe(NvGpu(), every_s=10.0)
    health(probe)
    assert fake.calls.count("nvmlDeviceGetTotalEccErrors") == 4
    fake.calls.clear()
    fake.gpus[0].ecc[(UNC, VOL)] = 1
    clock.advance(5)
    (h,) = health(probe)
    assert "nvmlDeviceGetTotalEccErrors" not in fake.calls
    assert "nvmlDeviceGetRemappedRows" not in fake.calls
    assert fake.calls.count("nvmlDeviceGetClockInfo") == 2
    assert fake.calls.count("nvmlDeviceGetCurrentClocksEventReasons") == 1
    assert h.ecc_volatile_uncorrected == 0  # the cached value until the next slow read
    clock.advance(5)
    assert health(probe)[0].ecc_volatile_uncorrected == 1


def test_nvml_refused_health_calls_are_not_made_again_and_read_none() -> None:
    gpu = NvGpu(
        fail={
            "nvmlDeviceGetTotalEccErrors": pynvml.NVML_ERROR_NO_PERMISSION,
            "nvmlDeviceGetRemappedRows": pynvml.NVML_ERROR_NOT_SUPPORTED,
            "nvmlDeviceGetEnforcedPowerLimit": pynvml.NVML_ERROR_NOT_SUPPORTED,
        }
    )
    fake, probe, _ = nvml_probe(gpu, every_s=0.0)
    health(probe)
    (h,) = health(probe)
    assert h.ecc_volatile_uncorrected is None and h.rows_remapped_correctable is None
    assert h.power_limit_w is None
    assert fake.calls.count("nvmlDeviceGetTotalEccErrors") == 4  # once per counter, not twice
    assert fake.calls.count("nvmlDeviceGetRemappedRows") == 1
    assert h.sm_clock_mhz == 1980.0  # the rest still reads


def test_nvml_a_transient_health_error_is_unknown_once_then_reads_again() -> None:
    gpu = NvGpu(fail={"nvmlDeviceGetClockInfo": pynvml.NVML_ERROR_UNKNOWN})
    fake, probe, _ = nvml_probe(gpu)
    assert health(probe)[0].sm_clock_mhz is None
    fake.gpus[0].fail.clear()
    assert health(probe)[0].sm_clock_mhz == 1980.0


def test_nvml_a_lost_gpu_has_no_health_and_the_others_keep_theirs() -> None:
    fake, probe, _ = nvml_probe(NvGpu(), NvGpu(xids=[79]))
    health(probe)
    fake.gpus[0].lost = True
    g0, g1 = probe.snapshot()
    assert g0.error and g0.health is None
    assert g1.health is not None and g1.health.xid_count == 1


def test_nvml_close_frees_the_event_sets_before_shutdown() -> None:
    fake, probe, _ = nvml_probe(NvGpu(), NvGpu())
    health(probe)
    assert len(fake.event_sets) == 2
    probe.close()
    assert fake.event_sets == {} and len(fake.freed_sets) == 2
    assert fake.calls.index("nvmlEventSetFree") < fake.calls.index("nvmlShutdown")


# ---------------------------------------------------------------------------------- amdsmi


def amd_probe(*gpus: AmdGpu, every_s: float = 10.0) -> tuple[FakeAmdSmi, AmdSmiProbe, FakeClock]:
    fake = FakeAmdSmi(list(gpus))
    clock = FakeClock()
    return fake, AmdSmiProbe(fake.module, health_every_s=every_s, monotonic=clock.monotonic), clock


def test_amdsmi_a_healthy_mi300x_reports_ras_counts_clocks_and_its_power_cap() -> None:
    _, probe, _ = amd_probe(AmdGpu())
    (h,) = health(probe)
    assert h.ecc_enabled is True
    assert (h.ecc_volatile_corrected, h.ecc_volatile_uncorrected, h.ecc_deferred) == (0, 0, 0)
    assert h.ecc_aggregate_corrected is None  # amdsmi keeps no lifetime count
    assert (h.retired_pages, h.retired_pages_pending, h.bad_pages_unreservable) == (0, False, 0)
    assert h.rows_remapped_correctable is None and h.xid_count is None  # NVIDIA-only figures
    assert h.throttle_reasons == ()
    assert (h.sm_clock_mhz, h.sm_clock_max_mhz) == (2100.0, 2100.0)
    assert h.power_limit_w == 750.0  # microwatts from the driver


def test_amdsmi_bad_pages_by_status_and_uncorrectable_errors() -> None:
    gpu = AmdGpu(
        ecc_counts=(40, 2, 1),
        bad_pages=[(0x10, 0), (0x20, 0), (0x30, 1), (0x40, 2)],
    )
    _, probe, _ = amd_probe(gpu)
    (h,) = health(probe)
    assert (h.ecc_volatile_corrected, h.ecc_volatile_uncorrected, h.ecc_deferred) == (40, 2, 1)
    assert (h.retired_pages, h.retired_pages_pending, h.bad_pages_unreservable) == (2, True, 1)
    assert h.faults() == (
        "2 uncorrectable ECC",
        "page retirement pending",
        "1 unretirable bad pages",
    )


def test_amdsmi_violation_flags_become_throttle_reasons() -> None:
    gpu = AmdGpu(
        violations={"active_ppt_pwr": True, "active_hbm_thrm": True}, gfx_clock=(1400, 2100)
    )
    _, probe, _ = amd_probe(gpu)
    (h,) = health(probe)
    assert h.throttle_reasons == ("power_cap", "hbm_thermal")
    assert (h.sm_clock_mhz, h.sm_clock_max_mhz) == (1400.0, 2100.0)


@pytest.mark.parametrize(
    ("status", "reasons"), [(True, ("unspecified",)), (False, ()), ("N/A", None)]
)
def test_amdsmi_without_violation_status_gpu_metrics_says_throttled_or_not(status, reasons) -> None:
    fake, probe, _ = amd_probe(AmdGpu(violations=None, throttle_status=status))
    assert health(probe)[0].throttle_reasons == reasons


def test_amdsmi_refused_calls_are_unknown_and_not_retried() -> None:
    w = real_amdsmi().amdsmi_wrapper
    gpu = AmdGpu(
        fail={
            "amdsmi_get_gpu_total_ecc_count": w.AMDSMI_STATUS_NO_PERM,
            "amdsmi_get_gpu_bad_page_info": w.AMDSMI_STATUS_NOT_SUPPORTED,
            "amdsmi_get_violation_status": w.AMDSMI_STATUS_NOT_SUPPORTED,
            "amdsmi_get_gpu_metrics_info": w.AMDSMI_STATUS_NOT_SUPPORTED,
        }
    )
    fake, probe, _ = amd_probe(gpu, every_s=0.0)
    for _ in range(2):
        (h,) = health(probe)
    assert h.ecc_volatile_uncorrected is None and h.retired_pages is None
    assert h.throttle_reasons is None
    assert h.power_limit_w == 750.0 and h.sm_clock_mhz == 2100.0
    # a failing transient call (not a refusal) is asked again at the next slow read
    fake.gpus[0].fail = {"amdsmi_get_power_cap_info": w.AMDSMI_STATUS_BUSY}
    assert health(probe)[0].power_limit_w is None
    fake.gpus[0].fail = {}
    assert health(probe)[0].power_limit_w == 750.0
    assert health(probe)[0].ecc_volatile_uncorrected is None  # still refused


# ---------------------------------------------------------------------------------- snapshot


def test_health_survives_the_status_json_round_trip() -> None:
    from vsup.snapshot import GpuStatus, NodeInfo, SupervisorInfo

    _, probe, _ = nvml_probe(
        NvGpu(xids=[79], clocks_event_mask=pynvml.nvmlClocksEventReasonSwPowerCap)
    )
    (h,) = health(probe)
    snap = StatusSnapshot(
        supervisor=SupervisorInfo(pid=1, version="x", uptime_s=1.0),
        node=NodeInfo(hostname="n", gpu_vendor="nvidia", gpu_count=1),
        gpus=(
            GpuStatus(0, "H200", 1, 1, 1.0, 1.0, 1.0, health=h),
            GpuStatus(1, "H200", 1, 1, 1.0, 1.0, 1.0),
        ),
        instances=(),
    )
    doc = json.loads(json.dumps(snap.to_json()))
    assert doc["gpus"][0]["health"]["xid_recent"][0]["xid"] == 79
    assert doc["gpus"][0]["health"]["throttle_reasons"] == ["power_cap"]
    assert doc["gpus"][1]["health"] is None
    assert StatusSnapshot.from_json(doc) == snap
