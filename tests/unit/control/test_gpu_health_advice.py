"""GPU health advice: what a sick or throttled GPU tells the operator to do."""

from __future__ import annotations

from vsup.control.advice import AdviceInputs, compute_advice, gpu_health
from vsup.snapshot import GpuHealth, GpuStatus, XidEvent, empty_instance

NONE = AdviceInputs(recent_failures={})
HEALTHY = GpuHealth(
    ecc_enabled=True,
    ecc_volatile_corrected=4,
    ecc_volatile_uncorrected=0,
    ecc_aggregate_uncorrected=3,  # old lifetime errors alone are not news
    rows_remapped_correctable=2,
    row_remap_pending=False,
    row_remap_failed=False,
    xid_count=1,
    xid_recent=(XidEvent(45, "2026-12-01T01:00:00.000Z", "preemptive cleanup", False),),
    throttle_reasons=("idle",),
    sm_clock_mhz=345.0,
    sm_clock_max_mhz=1980.0,
    power_limit_w=700.0,
)


def gpu(index: int = 3, temp: float | None = 62.0, power: float | None = 300.0, **health):
    h = GpuHealth(**{**HEALTHY.__dict__, **health})
    return GpuStatus(index, "NVIDIA H200", 150 * 2**30, 2**30, 50.0, temp, power, health=h)


def on(g: GpuStatus):
    return [empty_instance(f"gpu{g.index}", state="ready", gpus=(g.index,))]


def test_a_healthy_gpu_gives_no_advice() -> None:
    g = gpu()
    assert gpu_health(g, on(g)) == []


def test_a_gpu_without_health_figures_gives_no_advice() -> None:
    g = GpuStatus(0, "H200", 1, 1, None, None, None)
    assert gpu_health(g) == []


def test_uncorrectable_ecc_errors_say_drain_the_instance_and_check_the_node() -> None:
    g = gpu(ecc_volatile_uncorrected=2)
    (a,) = compute_advice(on(g), [g], NONE)
    assert (a.kind, a.severity, a.gpu) == ("gpu_ecc", "critical", 3)
    assert a.message.startswith(
        "GPU 3: 2 uncorrectable ECC errors since boot: drain gpu3 and have the node checked"
    )


def test_a_pending_row_remap_asks_for_a_reset_and_a_failed_one_for_service() -> None:
    pending = gpu(row_remap_pending=True)
    (a,) = gpu_health(pending, on(pending))
    assert (a.kind, a.severity) == ("gpu_memory", "warning")
    assert "waits for a GPU reset" in a.message and "drain gpu3" in a.message
    failed = gpu(row_remap_pending=True, row_remap_failed=True)
    (b,) = gpu_health(failed, on(failed))
    assert (b.kind, b.severity) == ("gpu_memory", "critical")
    assert "row remapping failed" in b.message and "RMA" in b.message


def test_amd_pending_and_unretirable_bad_pages_are_memory_advice() -> None:
    g = gpu(retired_pages_pending=True, row_remap_pending=None, row_remap_failed=None)
    assert [(a.kind, a.severity) for a in gpu_health(g)] == [("gpu_memory", "warning")]
    g = gpu(bad_pages_unreservable=2, row_remap_pending=None, row_remap_failed=None)
    (a,) = gpu_health(g)
    assert a.severity == "critical" and "2 bad memory pages could not be retired" in a.message


def test_hardware_xids_of_the_last_hour_are_critical_application_ones_are_not() -> None:
    xids = (
        XidEvent(45, "2026-12-01T01:00:00.000Z", "preemptive cleanup", False),
        XidEvent(79, "2026-12-01T01:05:00.000Z", "GPU has fallen off the bus", True),
    )
    g = gpu(xid_count=2, xid_recent=xids)
    (a,) = gpu_health(g, on(g))
    assert (a.kind, a.severity) == ("gpu_xid", "critical")
    assert "XID 79 (GPU has fallen off the bus) at 2026-12-01T01:05:00.000Z" in a.message
    assert "drain gpu3" in a.message


def test_xids_after_which_the_gpu_keeps_working_are_a_warning() -> None:
    remap = XidEvent(63, "2026-12-01T01:05:00.000Z", "ECC page retirement or row remap", True)
    (a,) = gpu_health(gpu(xid_count=1, xid_recent=(remap,)))
    assert (a.kind, a.severity) == ("gpu_xid", "warning")


def test_thermal_throttling_names_the_temperature_and_the_clock() -> None:
    g = gpu(temp=88.0, throttle_reasons=("thermal",), sm_clock_mhz=1410.0)
    (a,) = gpu_health(g)
    assert (a.kind, a.severity) == ("gpu_throttle", "warning")
    assert "thermal throttling" in a.message
    assert "88°C" in a.message and "SM clock 1410/1980 MHz" in a.message


def test_hardware_slowdown_is_critical() -> None:
    g = gpu(throttle_reasons=("hw_slowdown", "hw_power_brake"), sm_clock_mhz=990.0)
    (a,) = gpu_health(g, on(g))
    assert (a.kind, a.severity) == ("gpu_throttle", "critical")
    assert "hw power brake, hw slowdown" in a.message and "drain gpu3" in a.message


def test_the_power_cap_is_news_only_when_it_holds_the_clock_well_down() -> None:
    near_max = gpu(power=698.0, throttle_reasons=("power_cap",), sm_clock_mhz=1900.0)
    assert gpu_health(near_max) == []
    held = gpu(power=698.0, throttle_reasons=("power_cap",), sm_clock_mhz=1500.0)
    (a,) = gpu_health(held)
    assert (a.kind, a.severity) == ("gpu_throttle", "info")
    assert "698/700 W" in a.message and "SM clock 1500/1980 MHz" in a.message


def test_amd_throttling_without_a_reason_is_a_warning() -> None:
    g = gpu(throttle_reasons=("unspecified",))
    (a,) = gpu_health(g)
    assert (a.severity, a.kind) == ("warning", "gpu_throttle") and "no reason" in a.message


def test_health_advice_sorts_with_the_rest_by_severity() -> None:
    g = gpu(ecc_volatile_uncorrected=1, throttle_reasons=("thermal",))
    kv = empty_instance("gpu3", state="ready", gpus=(3,), preemptions_per_min=5.0)
    advice = compute_advice([kv], [g], NONE)
    assert [a.severity for a in advice] == ["critical", "warning", "warning"]
    assert advice[0].message.startswith("GPU 3: 1 uncorrectable ECC error since boot")
