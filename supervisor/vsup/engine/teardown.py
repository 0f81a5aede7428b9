"""Everything that ends what is left of an instance's run, with the events it sends: the sweep
of a tree (stop.py's TERM/KILL/verify), the wait for its GPU memory to be released, the one
`gpu_memory_not_released` failure, the sweep of a run that died while no daemon watched, and
the resumption of an instance whose processes outlived SIGKILL once they are gone.

Used by the runner and the engine through the host interface (host.py), so each of these is
written once.
"""

from __future__ import annotations

import asyncio

from vsup.clock import iso_utc
from vsup.engine import stop
from vsup.engine.host import RunnerHost
from vsup.engine.instance import Instance
from vsup.engine.proc import ZOMBIE, RunningProcess, read_stat, same_process
from vsup.engine.states import State
from vsup.journalevents import FailedEvent, GpuReleaseEvent, StuckGoneEvent, SweepEvent

GPU_MEMORY_NOT_RELEASED = "gpu_memory_not_released"


def run_note(host: RunnerHost, inst: Instance, proc: RunningProcess) -> stop.Note:
    """Writes `[vsup] <time> <line>` to the run's log (what vsup did to it, and why)."""

    def note(line: str) -> None:
        inst.logs.note(proc.run, f"{iso_utc(host.clock.wall())} {line}")

    return note


async def end_tree(host: RunnerHost, inst: Instance, proc: RunningProcess) -> stop.Ended:
    """SIGKILL what is left of a run whose API server is gone (EngineCore, its workers, any
    child): it serves nobody and has nothing to finish, so no SIGTERM and no grace. Report
    what it took."""
    ended = await stop.end_tree(
        proc,
        inst.spec.stop_grace_s,
        host.settings.kill_wait_s,
        why=f"orphan sweep: the API server (pid {proc.pid}) is gone, what is left of its run "
        "has nothing to finish",
        note=run_note(host, inst, proc),
        kill_at_once=True,
    )
    if ended.signalled:
        host.emit(
            inst,
            SweepEvent(
                run=proc.run,
                pids=list(ended.signalled),
                kill=ended.kill_sent,
                waited_s=round(ended.waited_s, 3),
            ),
        )
    return ended


async def await_release(host: RunnerHost, inst: Instance, proc: RunningProcess) -> bool | None:
    """Wait (bounded) until the instance's GPUs no longer list memory of the run's
    processes; None when nothing can tell (no GPUs, no check)."""
    released, waited = await stop.await_gpu_release(
        host.gpu_release_check,
        proc.tracked.keys(),
        inst.spec.gpus,
        host.settings.gpu_release_timeout_s,
    )
    if released is not None or (host.gpu_release_check is not None and inst.spec.gpus):
        inst.gpu_released = released
        host.emit(
            inst,
            GpuReleaseEvent(
                run=proc.run,
                gpus=list(inst.spec.gpus),
                released=released,
                waited_s=round(waited, 3),
            ),
        )
    return released


def fail_unreleased(host: RunnerHost, inst: Instance, whose: str) -> None:
    """The GPU still lists memory of `whose` (the instance's ended processes) after the
    release timeout: starting there again (or letting a co-tenant start) would profile memory
    that is not free. The instance fails; a person looks."""
    inst.control.stop()
    gpus = ", ".join(str(g) for g in inst.spec.gpus)
    limit = host.settings.gpu_release_timeout_s
    why = (
        f"GPU {gpus} still lists memory of {whose} after {limit:.0f} s; "
        f"not starting it there again until a person does (vsup start {inst.name})"
    )
    host.emit(
        inst, FailedEvent(reason=GPU_MEMORY_NOT_RELEASED, failures=inst.lifecycle.failures, why=why)
    )
    inst.lifecycle.fail(why)
    host.notify()


async def sweep_stale(host: RunnerHost, inst: Instance, proc: RunningProcess) -> None:
    """What is left of a process that died while no daemon watched (EngineCore orphans);
    on GPUs the memory must be gone too before the instance starts there again."""
    await host.scheduler.acquire(inst.name, inst.spec.devices, "stop")
    try:
        await end_tree(host, inst, proc)
        await await_release(host, inst, proc)
    finally:
        host.scheduler.release(inst.name)


async def resume_when_gone(
    host: RunnerHost, inst: Instance, proc: RunningProcess, pids: tuple[int, ...], why: str
) -> None:
    """Processes of `inst` outlived SIGKILL (stuck in the kernel) while it was meant to
    run: once they are gone and the GPU no longer lists their memory, start it again (a
    restart: counted, the breaker not reset). A person who stopped, started or removed it
    meanwhile decides instead (its `failed_why` is no longer `why`)."""
    born = {p: info.create_time for p in pids if (info := read_stat(p)) is not None}

    def alive() -> list[int]:
        return [
            p
            for p, t in born.items()
            if (i := read_stat(p)) is not None
            and i.state != ZOMBIE
            and same_process(i.create_time, t)
        ]

    def untouched() -> bool:
        return (
            host.instances.get(inst.name) is inst
            and inst.state == State.FAILED
            and inst.failed_why == why
        )

    # the API server itself may be among them: wait for its exit to be seen too
    while (alive() or inst.process is proc) and untouched():
        await asyncio.sleep(host.settings.stuck_poll_s)
    if not untouched():
        return
    host.emit(inst, StuckGoneEvent(run=proc.run, pids=list(born)))
    released = await await_release(host, inst, proc)
    if not untouched():
        return
    if released is False:
        fail_unreleased(host, inst, f"{inst.name}'s stuck processes (gone now)")
        return
    await host.start(inst.name, automatic=True)
