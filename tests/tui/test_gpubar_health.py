"""The GPU line's health mark and note (pure text: no app needed)."""

from __future__ import annotations

from vsup.snapshot import GpuHealth, GpuStatus, XidEvent, empty_instance
from vsup.tui import gpubar

GiB = 2**30


def gpu(health: GpuHealth | None) -> GpuStatus:
    return GpuStatus(3, "NVIDIA H200", 100 * GiB, 50 * GiB, 90.0, 85.0, 650.0, health=health)


def line(g: GpuStatus, legend: bool = True) -> str:
    use = gpubar.gpu_use(g, [empty_instance("gpu3", gpus=(3,))])
    return gpubar.line(use, 10, with_legend=legend).plain


def test_a_healthy_gpu_line_is_unchanged_by_health() -> None:
    healthy = GpuHealth(ecc_volatile_uncorrected=0, throttle_reasons=("power_cap", "idle"))
    assert line(gpu(healthy)) == line(gpu(None))
    assert line(gpu(None)).startswith(" 3 H200")
    assert gpubar.health_mark(gpu(healthy)) is None


def test_a_fault_marks_the_index_and_the_legend_says_what() -> None:
    xid = XidEvent(79, "2026-12-01T01:05:00.000Z", "GPU has fallen off the bus", True)
    g = gpu(GpuHealth(ecc_volatile_uncorrected=2, xid_recent=(xid,)))
    assert gpubar.health_mark(g) == gpubar.FAULT_MARK
    wide = line(g)
    assert wide.startswith(" 3!H200")
    assert "!2 uncorrectable ECC, XID 79" in wide
    narrow = line(g, legend=False)
    assert narrow.startswith(" 3!") and len(narrow) == len(line(gpu(None), legend=False))


def test_thermal_throttling_marks_the_index_with_the_clock_in_the_legend() -> None:
    g = gpu(GpuHealth(throttle_reasons=("thermal",), sm_clock_mhz=1410.0, sm_clock_max_mhz=1980.0))
    assert gpubar.health_mark(g) == gpubar.SLOW_MARK
    assert line(g).startswith(" 3↓H200")
    assert "↓thermal 1410/1980MHz" in line(g)


def test_health_details_list_what_the_driver_gave() -> None:
    xid = XidEvent(79, "2026-12-01T01:05:00.000Z", "GPU has fallen off the bus", True)
    g = gpu(
        GpuHealth(
            ecc_enabled=True,
            ecc_volatile_corrected=5,
            ecc_volatile_uncorrected=2,
            ecc_aggregate_corrected=40,
            ecc_aggregate_uncorrected=2,
            rows_remapped_correctable=1,
            rows_remapped_uncorrectable=0,
            row_remap_pending=False,
            row_remap_failed=False,
            xid_count=3,
            xid_recent=(xid,),
            throttle_reasons=("power_cap",),
            sm_clock_mhz=1755.0,
            sm_clock_max_mhz=1980.0,
            power_limit_w=700.0,
        )
    )
    rows = dict(gpubar.health_details(g))
    assert rows["ECC errors since boot"] == "2 uncorrectable, 5 corrected"
    assert rows["ECC errors, lifetime"] == "2 uncorrectable, 40 corrected"
    assert rows["rows remapped"] == "0 uncorrectable, 1 correctable; pending no, failed no"
    assert "retired pages" not in rows  # Hopper remaps rows instead
    assert rows["XID errors since vsup started"] == (
        "3; last: XID 79 (GPU has fallen off the bus) at 2026-12-01T01:05:00.000Z"
    )
    assert rows["clocks held by"] == "power cap"
    assert rows["SM clock"] == "1755/1980 MHz" and rows["memory clock"] == "-/- MHz"
    assert rows["power"] == "650/700 W" and rows["temperature"] == "85°C"
    assert gpubar.health_details(gpu(None)) == [("health", "not reported by this driver")]
