"""Who holds a GPU's memory decides what a memory refusal means (engine/memory.py)."""

from vsup.engine.memory import Fit, GpuMemory, Holder, judge

GiB = 2**30
TOTAL = int(139.8 * GiB)


def gpu(used_gib: float, *holders: Holder, index: int = 1) -> GpuMemory:
    return GpuMemory(index, TOTAL, int(used_gib * GiB), tuple(holders))


def test_enough_free_memory_is_ok():
    v = judge("b1", 0.45, [gpu(60, Holder(7, 60 * GiB, "b0"))])
    assert v.fit == Fit.OK and v.message is None


def test_a_foreign_process_holding_the_memory_means_wait_and_says_who_and_how_much():
    # issue 14's H200: another process held 100 GiB of GPU 1; b1 asked 0.9 of 139.8 GiB
    v = judge("b1", 0.9, [gpu(101, Holder(4242, 100 * GiB, None))])
    assert v.fit == Fit.WAIT
    assert v.message is not None
    assert "GPU 1: pid 4242 holds 100.0 GiB (no instance's)" in v.message
    assert "b1 needs 125.8 GiB free (0.9 of 139.8 GiB), 38.8 GiB is" in v.message


def test_the_layouts_own_instances_holding_it_is_short_and_says_what_to_change():
    v = judge("b1", 0.9, [gpu(70, Holder(7, 69 * GiB, "b0"))])
    assert v.fit == Fit.SHORT
    assert v.message is not None
    assert "instances b0 hold the rest" in v.message
    assert "Lower gpu_memory_utilization" in v.message


def test_the_instances_own_ending_processes_count_as_free():
    ending = Holder(99, 120 * GiB, None)  # its EngineCore, not yet gone
    assert judge("b1", 0.9, [gpu(121, ending)], own_pids={99}).fit == Fit.OK
    assert judge("b1", 0.9, [gpu(121, Holder(99, 120 * GiB, "b1"))]).fit == Fit.OK


def test_memory_nobody_is_listed_for_cannot_be_told():
    # no per-process figures (a container without the host's pids): the policy decides
    assert judge("b1", 0.9, [gpu(100)]) is None
    assert judge("b1", 0.9, None) is None and judge("b1", 0.9, []) is None


def test_an_unset_utilization_is_vllms_default():
    assert judge("b1", None, [gpu(20, Holder(5, 20 * GiB, None))]).fit == Fit.WAIT
    assert judge("b1", None, [gpu(10, Holder(5, 10 * GiB, None))]).fit == Fit.OK


def test_foreign_holders_win_over_co_tenants_on_any_gpu():
    a = gpu(80, Holder(7, 79 * GiB, "t0"), index=0)
    b = gpu(80, Holder(8, 79 * GiB, None), index=1)
    v = judge("tp2", 0.9, [a, b])
    assert v.fit == Fit.WAIT and "GPU 1: pid 8" in (v.message or "")


def test_pids_of_another_pid_namespace_cannot_be_told_apart():
    # NVML lists host pids inside a container: neither foreign nor the layout's, so no verdict
    unknown = Holder(31337, 100 * GiB, None, known=False)
    assert judge("b1", 0.9, [gpu(101, unknown)]) is None


def test_a_wait_names_the_foreign_pids_what_they_hold_and_the_gpus_short_of_memory():
    a = gpu(101, Holder(4242, 60 * GiB, None), Holder(4243, 40 * GiB, None), index=0)
    b = gpu(101, Holder(4242, 100 * GiB, None), index=3)
    v = judge("b1", 0.9, [a, b])
    assert v.fit == Fit.WAIT
    assert (v.pids, v.held_bytes, v.gpus) == ((4242, 4243), 200 * GiB, (0, 3))
    assert judge("b1", 0.9, [gpu(70, Holder(7, 69 * GiB, "b0"))]).pids == ()  # short: no wait
