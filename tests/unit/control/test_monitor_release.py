"""The release check the engine awaits before a GPU may be used again."""

from __future__ import annotations

import asyncio

from vsup.control import monitor as monitor_mod
from vsup.control.monitor import Monitor
from vsup.telemetry.gpu.base import GpuProcessSample, GpuSample

from tests.support.clock import FakeClock


def sample(index: int, pids: dict[int, int], per_process: bool = True) -> GpuSample:
    return GpuSample(
        index=index,
        name="NVIDIA H200",
        uuid=f"GPU-{index}",
        bdf=None,
        hbm_total_bytes=150754820096,
        hbm_used_bytes=sum(pids.values()),
        util_pct=0.0,
        temp_c=30.0,
        power_w=100.0,
        processes=tuple(GpuProcessSample(pid, b) for pid, b in pids.items()),
        per_process_supported=per_process,
        error=None,
    )


class ScriptedProbe:
    """Answers one scripted snapshot per call, then repeats the last."""

    count = 2
    vendor = "nvidia"

    def __init__(self, *snapshots):
        self.snapshots = list(snapshots)
        self.calls = 0

    def close(self) -> None:
        pass

    def snapshot(self) -> tuple[GpuSample, ...]:
        self.calls += 1
        return self.snapshots.pop(0) if len(self.snapshots) > 1 else self.snapshots[0]


async def test_release_waits_until_the_gpu_no_longer_lists_the_pids(monkeypatch):
    monkeypatch.setattr(monitor_mod, "GPU_RELEASE_POLL_S", 0.01)
    held = (sample(0, {10: 5 << 30, 11: 2 << 30}), sample(1, {99: 1 << 30}))
    dying = (sample(0, {11: 2 << 30}), sample(1, {99: 1 << 30}))
    free = (sample(0, {}), sample(1, {99: 1 << 30}))
    probe = ScriptedProbe(held, held, dying, free)
    mon = Monitor(FakeClock(), probe=probe)
    assert await asyncio.wait_for(mon.gpu_released(frozenset({10, 11}), (0,)), 5) is True
    assert probe.calls == 4


async def test_memory_of_other_pids_and_other_gpus_does_not_hold_the_release():
    probe = ScriptedProbe((sample(0, {50: 1 << 30}), sample(1, {10: 1 << 30})))
    mon = Monitor(FakeClock(), probe=probe)
    assert await mon.gpu_released(frozenset({10}), (0,)) is True
    assert probe.calls == 1


async def test_without_per_process_figures_the_release_cannot_be_told_and_does_not_block():
    probe = ScriptedProbe((sample(0, {}, per_process=False), sample(1, {})))
    mon = Monitor(FakeClock(), probe=probe)
    assert await mon.gpu_released(frozenset({10}), (0,)) is True
