"""Per-instance HBM attribution: process figures, the honest device fallback, foreign pids."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from vsup.telemetry.gpu.base import GpuProcessSample as P
from vsup.telemetry.gpu.base import GpuSample
from vsup.telemetry.hbm import (
    DEVICE,
    PROCESS,
    UNAVAILABLE,
    HbmFigure,
    InstanceRef,
    ProcessTable,
    attribute,
    gpu_statuses,
)

GiB = 2**30


def gpu(
    index: int,
    *procs: P,
    used: int | None = 50 * GiB,
    supported: bool = True,
    error: str | None = None,
) -> GpuSample:
    return GpuSample(
        index=index,
        name="H200",
        hbm_total_bytes=141 * GiB,
        hbm_used_bytes=used,
        processes=tuple(procs),
        per_process_supported=supported,
        error=error,
    )


# Two instances as vLLM runs them: API server -> EngineCore (-> workers), one group each.
TABLE = ProcessTable(
    {
        100: (1, 100),
        101: (100, 100),
        102: (101, 100),  # instance a: api, engine, worker
        200: (1, 200),
        201: (200, 200),  # instance b: api, engine
        300: (1, 300),
        301: (300, 300),
        302: (301, 300),
        303: (301, 300),  # c, TP2 workers
        900: (1, 900),  # someone else's job on this node
    }
)


def test_per_process_figures_are_summed_over_the_process_tree() -> None:
    att = attribute(
        [InstanceRef("a", 100, (0,), 100), InstanceRef("b", 200, (1,), 200)],
        [gpu(0, P(101, 10 * GiB), P(102, 2 * GiB)), gpu(1, P(201, 30 * GiB))],
        TABLE,
    )
    assert att.instances == {"a": HbmFigure(12 * GiB, PROCESS), "b": HbmFigure(30 * GiB, PROCESS)}
    assert att.owners == {(0, 101): "a", (0, 102): "a", (1, 201): "b"}
    assert att.foreign == () and att.unresolved == ()


def test_a_tensor_parallel_instance_sums_its_gpus() -> None:
    att = attribute(
        [InstanceRef("c", 300, (2, 3), 300)],
        [gpu(2, P(302, 60 * GiB)), gpu(3, P(303, 61 * GiB))],
        TABLE,
    )
    assert att.instances["c"] == HbmFigure(121 * GiB, PROCESS)


def test_co_tenants_each_get_their_own_processes_figure() -> None:
    att = attribute(
        [InstanceRef("a", 100, (0,), 100), InstanceRef("b", 200, (0,), 200)],
        [gpu(0, P(101, 40 * GiB), P(201, 60 * GiB), used=101 * GiB)],
        TABLE,
    )
    assert att.instances == {"a": HbmFigure(40 * GiB, PROCESS), "b": HbmFigure(60 * GiB, PROCESS)}


def test_host_pids_in_a_container_fall_back_to_the_device_when_alone() -> None:
    # NVML lists host pids: none of them exists in this pid namespace
    att = attribute(
        [InstanceRef("a", 100, (0,), 100)], [gpu(0, P(4_123_456, 40 * GiB), used=41 * GiB)], TABLE
    )
    assert att.instances["a"] == HbmFigure(41 * GiB, DEVICE)
    assert att.foreign == () and [u.pid for u in att.unresolved] == [4_123_456]


def test_host_pids_with_a_co_tenant_are_unavailable_not_guessed() -> None:
    att = attribute(
        [InstanceRef("a", 100, (0,), 100), InstanceRef("b", 200, (0,), 200)],
        [gpu(0, P(4_123_456, 40 * GiB), P(4_123_457, 50 * GiB), used=91 * GiB)],
        TABLE,
    )
    assert att.instances == {"a": HbmFigure(None, UNAVAILABLE), "b": HbmFigure(None, UNAVAILABLE)}


@pytest.mark.parametrize(
    "sample",
    [
        gpu(0, used=41 * GiB, supported=False),  # the driver gave no process list
        gpu(0, P(101, None), used=41 * GiB),  # our process listed without a figure
        gpu(0, used=41 * GiB),  # an empty list while the instance runs
    ],
)
def test_no_usable_process_figure_falls_back_to_the_device_when_alone(sample: GpuSample) -> None:
    att = attribute([InstanceRef("a", 100, (0,), 100)], [sample], TABLE)
    assert att.instances["a"] == HbmFigure(41 * GiB, DEVICE)


def test_a_visible_foreign_process_is_reported_and_blocks_the_device_fallback() -> None:
    att = attribute(
        [InstanceRef("a", 100, (0,), 100), InstanceRef("b", 200, (1,), 200)],
        [gpu(0, P(101, 10 * GiB), P(900, 5 * GiB)), gpu(1, P(900, 1 * GiB), supported=True)],
        TABLE,
    )
    assert att.instances["a"] == HbmFigure(10 * GiB, PROCESS)
    assert att.instances["b"] == HbmFigure(None, UNAVAILABLE)  # GPU 1: only a stranger listed
    assert sorted((f.gpu, f.pid, f.hbm_bytes) for f in att.foreign) == [
        (0, 900, 5 * GiB),
        (1, 900, 1 * GiB),
    ]


def test_a_failed_gpu_or_unknown_used_memory_is_unavailable() -> None:
    att = attribute(
        [InstanceRef("a", 100, (0,), 100), InstanceRef("b", 200, (1,), 200)],
        [gpu(0, error="GPU is lost", used=None), gpu(1, used=None, supported=False)],
        TABLE,
    )
    assert att.instances == {"a": HbmFigure(None, UNAVAILABLE), "b": HbmFigure(None, UNAVAILABLE)}


def test_cpu_and_stopped_instances_have_no_hbm_and_are_no_co_tenants() -> None:
    att = attribute(
        [
            InstanceRef("cpu", 100, ()),
            InstanceRef("stopped", None, (0,)),
            InstanceRef("b", 200, (0,), 200),
        ],
        [gpu(0, P(7_000_000, 3 * GiB), used=3 * GiB)],
        TABLE,
    )
    assert att.instances["cpu"] == HbmFigure(None, UNAVAILABLE)
    assert att.instances["stopped"] == HbmFigure(None, UNAVAILABLE)
    assert att.instances["b"] == HbmFigure(3 * GiB, DEVICE)


def test_an_orphaned_engine_core_still_belongs_to_its_instance_through_the_group() -> None:
    # The API server was SIGKILLed: its EngineCore was re-parented to pid 1 and keeps its HBM.
    table = ProcessTable({101: (1, 100), 102: (101, 100)})
    att = attribute([InstanceRef("a", 100, (0,), 100)], [gpu(0, P(101, 20 * GiB))], table)
    assert att.instances["a"] == HbmFigure(20 * GiB, PROCESS)
    assert att.owners == {(0, 101): "a"}


def test_gpu_statuses_carry_owners_and_foreign_processes() -> None:
    samples = [gpu(0, P(101, 10 * GiB), P(900, GiB))]
    att = attribute([InstanceRef("a", 100, (0,), 100)], samples, TABLE)
    (status,) = gpu_statuses(samples, att)
    assert status.index == 0 and status.hbm_used_bytes == 50 * GiB
    assert [(p.pid, p.hbm_bytes, p.instance) for p in status.processes] == [
        (101, 10 * GiB, "a"),
        (900, GiB, None),
    ]


def test_a_real_process_tree_and_its_group_are_found() -> None:
    code = (
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(120)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        child = int(parent.stdout.readline())  # the grandchild exists once this line arrives
        table = ProcessTable.scan()
        assert table.tree(parent.pid) == {parent.pid, child}
        assert table.tree(None, os.getpgid(parent.pid)) == {parent.pid, child}
        assert table.tree(os.getpid()) >= {os.getpid(), parent.pid, child}
        assert table.tree(2**22 + 12345) == frozenset()  # no such process: empty, no error
    finally:
        os.killpg(parent.pid, signal.SIGKILL)
        parent.wait()
        parent.stdout.close()
