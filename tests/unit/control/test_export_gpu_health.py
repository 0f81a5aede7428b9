"""Prometheus series of GPU health: what a healthy, a sick and an unknown GPU export."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from vsup.control.export import render
from vsup.snapshot import (
    THROTTLE_REASONS,
    GpuHealth,
    GpuStatus,
    NodeInfo,
    StatusSnapshot,
    SupervisorInfo,
)


def snap(*gpus: GpuStatus) -> StatusSnapshot:
    return StatusSnapshot(
        supervisor=SupervisorInfo(pid=1, version="0.1.0", uptime_s=1.0),
        node=NodeInfo(hostname="n", gpu_vendor="nvidia", gpu_count=len(gpus)),
        gpus=gpus,
        instances=(),
    )


def samples(text: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def lbl(gpu: int, **extra: str) -> tuple:
    return tuple(sorted({"gpu": str(gpu), "gpu_name": "NVIDIA H200", **extra}.items()))


def test_health_series_per_gpu_with_unknowns_left_out() -> None:
    sick = GpuHealth(
        ecc_enabled=True,
        ecc_volatile_corrected=12,
        ecc_volatile_uncorrected=2,
        ecc_aggregate_corrected=340,
        ecc_aggregate_uncorrected=None,
        rows_remapped_correctable=3,
        rows_remapped_uncorrectable=1,
        row_remap_pending=True,
        row_remap_failed=False,
        xid_count=4,
        throttle_reasons=("thermal", "idle"),
        sm_clock_mhz=1410.0,
        sm_clock_max_mhz=1980.0,
        power_limit_w=700.0,
    )
    got = samples(
        render(
            snap(
                GpuStatus(0, "NVIDIA H200", 1, 1, 1.0, 80.0, 1.0, health=sick),
                GpuStatus(1, "NVIDIA H200", 1, 1, 1.0, 40.0, 1.0, health=GpuHealth()),
                GpuStatus(2, "NVIDIA H200", 1, 1, 1.0, 40.0, 1.0),
            )
        ).decode()
    )
    ecc = "vsup_gpu_ecc_errors_total"
    assert got[(ecc, lbl(0, kind="uncorrected", scope="volatile"))] == 2
    assert got[(ecc, lbl(0, kind="corrected", scope="volatile"))] == 12
    assert got[(ecc, lbl(0, kind="corrected", scope="aggregate"))] == 340
    assert (ecc, lbl(0, kind="uncorrected", scope="aggregate")) not in got  # unknown: absent
    assert got[("vsup_gpu_xid_errors_total", lbl(0))] == 4
    assert got[("vsup_gpu_throttle_active", lbl(0, reason="thermal"))] == 1
    assert got[("vsup_gpu_throttle_active", lbl(0, reason="hw_slowdown"))] == 0
    assert sum(1 for k in got if k[0] == "vsup_gpu_throttle_active") == len(THROTTLE_REASONS)
    assert got[("vsup_gpu_remapped_rows", lbl(0, kind="uncorrectable"))] == 1
    assert got[("vsup_gpu_row_remap_pending", lbl(0))] == 1
    assert got[("vsup_gpu_row_remap_failed", lbl(0))] == 0
    assert got[("vsup_gpu_clock_megahertz", lbl(0, clock="sm"))] == 1410
    assert got[("vsup_gpu_clock_max_megahertz", lbl(0, clock="sm"))] == 1980
    assert got[("vsup_gpu_power_limit_watts", lbl(0))] == 700
    assert got[("vsup_gpu_ecc_enabled", lbl(0))] == 1
    # a GPU whose driver gave nothing, and one without health at all, export no health series
    health_series = [k for k in got if k[0].startswith("vsup_gpu_") and dict(k[1])["gpu"] != "0"]
    assert {k[0] for k in health_series} <= {
        "vsup_gpu_hbm_used_bytes",
        "vsup_gpu_hbm_total_bytes",
        "vsup_gpu_utilization_percent",
        "vsup_gpu_temperature_celsius",
        "vsup_gpu_power_watts",
        "vsup_gpu_foreign_processes",
    }
