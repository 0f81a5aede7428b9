"""The comparisons benchmarks/gpu_check.py makes on a GPU node, on nvidia-smi's CSV shapes."""

from __future__ import annotations

from vsup.telemetry.gpu.base import GpuProcessSample as P
from vsup.telemetry.gpu.base import GpuSample

from benchmarks.gpu_check import (
    close_enough,
    compare_all_pids,
    compare_gpus,
    compare_processes,
    expected_source,
)

MiB, GiB = 2**20, 2**30
SMI_GPUS = [
    {
        "index": "0",
        "pci.bus_id": "00000000:17:00.0",
        "memory.used": "15000",
        "memory.total": "143771",
    },
    {
        "index": "1",
        "pci.bus_id": "00000000:2A:00.0",
        "memory.used": "6700",
        "memory.total": "143771",
    },
]


def samples(extra_pid_bytes: int = 0) -> list[GpuSample]:
    return [
        GpuSample(
            0,
            bdf="0000:17:00.0",
            hbm_total_bytes=143771 * MiB,
            hbm_used_bytes=15000 * MiB + 300_000,
            per_process_supported=True,
            processes=(P(11, 4 * GiB + 500 * MiB + 123), P(12, 10 * GiB + 500 * MiB)),
        ),
        GpuSample(
            1,
            bdf="0000:2a:00.0",
            hbm_total_bytes=143771 * MiB,
            hbm_used_bytes=6700 * MiB,
            per_process_supported=True,
            processes=(P(13, 6 * GiB + 500 * MiB + extra_pid_bytes),),
        ),
    ]


APPS = [
    {"pid": "11", "used_memory": "4596", "gpu_bus_id": "00000000:17:00.0"},
    {"pid": "12", "used_memory": "10740", "gpu_bus_id": "00000000:17:00.0"},
    {"pid": "13", "used_memory": "6644", "gpu_bus_id": "00000000:2A:00.0"},
]


def test_mib_rounding_is_not_a_mismatch() -> None:
    assert close_enough(4 * GiB + 500 * MiB + 123, 4596, 0.01)
    assert not close_enough(None, 4596, 0.01)
    assert not close_enough(4 * GiB, 4596, 0.01)  # 500 MiB off: more than 1%


def test_every_pid_is_matched_by_gpu_bus_id_in_both_directions() -> None:
    lines, failures = compare_all_pids(samples(), APPS, SMI_GPUS, 0.01)
    assert failures == [] and len(lines) == 3
    lines, failures = compare_all_pids(samples(), APPS[:2], SMI_GPUS, 0.01)
    assert failures == [f"GPU 1 pid 13: probe {6 * GiB + 500 * MiB} B, nvidia-smi absent MiB"]
    _l, failures = compare_all_pids(samples(extra_pid_bytes=2 * GiB), APPS, SMI_GPUS, 0.01)
    assert len(failures) == 1 and "pid 13" in failures[0]


def test_holders_hold_at_least_what_they_allocated() -> None:
    held = [(0, 11, 4 * GiB), (0, 12, 10 * GiB), (1, 13, 6 * GiB)]
    assert compare_processes(held, samples(), APPS, 0.01)[1] == []
    _l, failures = compare_processes([(1, 13, 7 * GiB)], samples(), APPS, 0.01)
    assert len(failures) == 1


def test_gpu_used_and_total_are_compared_and_reserved_memory_shows_as_a_mismatch() -> None:
    assert compare_gpus(samples(), SMI_GPUS, 0.01)[1] == []
    with_reserved = [dict(SMI_GPUS[0], **{"memory.used": str(15000 + 512)}), SMI_GPUS[1]]
    _l, failures = compare_gpus(samples(), with_reserved, 0.01)
    assert len(failures) == 1 and failures[0].startswith("GPU 0")
    _l, failures = compare_gpus(samples()[:1], SMI_GPUS, 0.01)
    assert failures == ["GPU 1 missing from the probe"]


def test_expected_attribution_in_and_out_of_the_host_pid_namespace() -> None:
    held = [(0, 11, 1), (0, 12, 1), (1, 13, 1)]
    assert expected_source(0, 11, held, visible=True) == "process"
    assert expected_source(0, 11, held, visible=False) == "unavailable"  # co-tenants
    assert expected_source(1, 13, held, visible=False) == "device"  # alone on GPU 1
