"""GPU memory held by others: the start waits instead of burning restarts (engine/memory.py).

The GPU side is the faithful NVML fake (tests/unit/telemetry/gpu_fakes.py) read by the real
NvmlProbe and the daemon's Monitor (attribution against the real process table: the foreign
holder is a real process of this node); the instance is the vLLM emulator, which prints vLLM's
own refusal line (issue 14's) and exits like vLLM does when its memory check fails.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from vsup.control.monitor import Monitor, Target
from vsup.engine import Engine
from vsup.engine.memory import GpuMemory, Holder
from vsup.telemetry.gpu.nvml import NvmlProbe

from tests.support.clock import FakeClock
from tests.unit.telemetry.gpu_fakes import FakeNvml, NvGpu

pytestmark = pytest.mark.timeout(90)

GiB = 2**30
REFUSAL = (
    "ValueError: Free memory on device cuda:0 (38.77/139.8 GiB) on startup is less than desired "
    "GPU memory utilization (0.9, 125.82 GiB). Decrease GPU memory utilization or reduce GPU "
    "memory used by other processes."
)


@pytest.fixture
def foreign():
    """A real process of this node that is no instance's (it 'holds' the GPU memory)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield proc
    proc.kill()
    proc.wait()


class Telemetry:
    """The daemon's GPU side: a Monitor over NvmlProbe(FakeNvml), polled like the daemon does."""

    def __init__(self, gpu: NvGpu) -> None:
        self.gpu = gpu
        self.monitor = Monitor(FakeClock(), probe=NvmlProbe(FakeNvml([gpu]).module))
        self.engine: Engine | None = None
        self._task: asyncio.Task | None = None

    def hold(self, pid: int, nbytes: int) -> None:
        self.gpu.processes = [(pid, nbytes)]
        self.gpu.used = nbytes + 600 * 2**20

    def free(self) -> None:
        self.gpu.processes = []
        self.gpu.used = 600 * 2**20

    def targets(self) -> list[Target]:
        return [
            Target(i.name, i.spec.base_url, i.run, i.pid, i.pgid, i.spec.gpus, False, None)
            for i in self.engine.instances.values()
        ]

    async def _loop(self) -> None:
        while True:
            await self.monitor.poll(self.targets())
            await asyncio.sleep(0.05)

    def start(self, engine: Engine) -> None:
        self.engine = engine
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


async def until(pred, timeout=20.0):
    async def loop():
        while not pred():
            await asyncio.sleep(0.02)

    await asyncio.wait_for(loop(), timeout)


async def test_a_start_waits_while_a_foreign_process_holds_the_memory(
    engine, emulator_spec, events, foreign
):
    tel = Telemetry(NvGpu(total=int(139.8 * GiB)))
    tel.hold(foreign.pid, 100 * GiB)
    eng: Engine = engine(gpu_memory=tel.monitor.gpu_memory, memory_poll_s=0.05)
    tel.start(eng)
    try:
        await tel.monitor.poll([])
        spec = emulator_spec("g0", "--startup-s", "0.2", gpus=(0,), gpu_memory_utilization=0.9)
        await eng.apply([spec])
        inst = eng.instances["g0"]
        await until(lambda: inst.waiting_for is not None)
        assert inst.state == "starting"
        assert inst.waiting_for is not None
        assert f"pid {foreign.pid} holds 100.0 GiB (no instance's)" in inst.waiting_for
        assert "g0 needs 125.8 GiB free (0.9 of 139.8 GiB)" in inst.waiting_for
        assert inst.status_fields()["state"] == "starting"
        wait = inst.status_fields()["wait"]
        assert (wait.kind, wait.pids, wait.held_bytes, wait.gpus) == (
            "gpu_memory",
            (foreign.pid,),
            100 * GiB,
            (0,),
        )
        assert wait.message == inst.waiting_for
        await asyncio.sleep(0.5)
        assert inst.run == 0 and not events.of("spawn"), "nothing may start into the wall"
        tel.free()
        assert await eng.wait("g0", ("ready", "failed"), timeout=20) == "ready"
        assert inst.failures == 0 and inst.restarts == 0 and inst.waiting_for is None
        waits = events.of("memory_wait", "g0")
        assert [w["done"] for w in waits] == [False, True]
        assert waits[1]["waited_s"] >= 0.4
    finally:
        await tel.stop()


async def test_a_refusal_while_a_foreign_process_holds_memory_burns_no_restart(
    engine, emulator_spec, events, foreign
):
    tel = Telemetry(NvGpu(total=int(139.8 * GiB)))
    eng: Engine = engine(gpu_memory=tel.monitor.gpu_memory, memory_poll_s=0.05)
    tel.start(eng)
    try:
        await tel.monitor.poll([])
        spec = emulator_spec(
            "g0",
            "--startup-s", "5", "--say", REFUSAL, "--exit-after", "2",
            gpus=(0,),
            gpu_memory_utilization=0.9,
        )  # fmt: skip
        await eng.apply([spec])
        await events.wait(lambda e: e["kind"] == "spawn")
        tel.hold(foreign.pid, 100 * GiB)  # someone took the GPU while it was starting
        # the telemetry sees it before the start gives up (its poll, beside the emulator's
        # scrape, took longer than the 0.4 s this start once lasted on a loaded machine)
        await until(
            lambda: any(
                h.pid == foreign.pid
                for g in (tel.monitor.gpu_memory((0,)) or ())
                for h in g.holders
            )
        )
        await events.wait(lambda e: e["kind"] == "exit")
        inst = eng.instances["g0"]
        exit_ = events.of("exit", "g0")[0]
        assert exit_["reason"] == "gpu_memory_insufficient" and exit_["log_excerpt"] == REFUSAL
        assert inst.last_exit.log_excerpt == REFUSAL
        await until(lambda: inst.waiting_for is not None)
        assert inst.failures == 0 and inst.state == "starting" and inst.run == 1
        assert inst.waiting_for is not None
        assert f"pid {foreign.pid} holds 100.0 GiB" in inst.waiting_for
        sched = events.of("restart_scheduled", "g0")[0]
        assert sched["failures"] == 0 and "memory held by other processes" in sched["why"]
        # Once the memory is back it starts again; this one refuses again with the GPU free,
        # which the policy counts like any failure.
        tel.free()
        await events.wait(lambda e: e["kind"] == "exit", count=2)
        await until(lambda: inst.failures == 1)
        await eng.stop("g0")
    finally:
        await tel.stop()


async def test_a_refusal_caused_by_the_layouts_own_instances_fails_fast(
    engine, emulator_spec, events
):
    def co_tenant_holds_it(gpus):
        return [
            GpuMemory(g, int(139.8 * GiB), 70 * GiB, (Holder(7, 69 * GiB, "g1"),)) for g in gpus
        ]

    eng: Engine = engine(gpu_memory=co_tenant_holds_it, memory_poll_s=0.05)
    spec = emulator_spec(
        "g0", "--startup-s", "5", "--say", REFUSAL, "--exit-after", "0.3",
        gpus=(0,), gpu_memory_utilization=0.9,
    )  # fmt: skip
    await eng.apply([spec])
    assert await eng.wait("g0", ("failed",), timeout=20) == "failed"
    inst = eng.instances["g0"]
    assert inst.run == 1 and inst.failures == 1, "no restart into the same wall"
    why = inst.failed_why
    assert why is not None
    assert "the layout asks for more GPU memory than there is" in why
    assert "instances g1 hold the rest" in why and "Lower gpu_memory_utilization" in why
    assert why.endswith(f"(vLLM: {REFUSAL})")
    failed = events.of("failed", "g0")[0]
    assert failed["reason"] == "gpu_memory_insufficient" and failed["why"] == why
