"""Taking over a process an earlier daemon started: the one adoption path, for instances
(Engine.adopt) and the router (RouterSupervisor.adopt).

The pid must still name that process - same start time (within 1 s: the boot time moves when the
clock is stepped) and same process group - so a reused pid is never adopted. When the process is
gone the instance stays `stopped`, its last exit classified from its run log, and what is left
of its tree (EngineCore orphans) is swept before it may start again.
"""

from __future__ import annotations

from vsup.clock import iso_utc
from vsup.engine import teardown
from vsup.engine.exitreason import classify
from vsup.engine.host import RunnerHost
from vsup.engine.instance import AdoptRecord, Instance
from vsup.engine.proc import ZOMBIE, RunningProcess, read_stat, same_process
from vsup.journalevents import AdoptEvent, ExitEvent
from vsup.snapshot import LastExit


def not_adoptable(record: AdoptRecord) -> str | None:
    """Why `record`'s pid is not the process it records (None: it is)."""
    info = read_stat(record.pid)
    if info is None or info.state == ZOMBIE:
        return f"pid {record.pid} is gone"
    if not same_process(info.create_time, record.create_time):
        return f"pid {record.pid} is now another process (started at {info.create_time:.2f})"
    if info.pgid != record.pgid:
        return f"pid {record.pid} is in process group {info.pgid}, not {record.pgid}"
    return None


def take_over(host: RunnerHost, inst: Instance, record: AdoptRecord) -> bool:
    """Make `record`'s process `inst`'s (a fresh instance with no runner yet). True when it was
    adopted: it runs, wanted, watched by pidfd; the caller starts its runner. False when it is
    gone: `inst` is stopped with its exit classified, and the sweep of its tree is under way
    (`control.stale_sweep`, awaited by the next start)."""
    lc = inst.lifecycle
    lc.run = record.run
    lc.restarts = record.restarts
    proc = RunningProcess(
        record.pid, record.pgid, record.create_time, record.run, None, dict(record.descendants)
    )
    why = not_adoptable(record)
    if why is None:
        try:
            proc.watch()
        except ProcessLookupError:
            why = f"pid {record.pid} ended while being adopted"
    if why is not None:
        c = classify(None, None, inst.logs.tail(record.run), model=inst.spec.model)
        lc.last_exit = LastExit(None, None, c.reason, iso_utc(host.clock.wall()), c.excerpt)
        host.emit(inst, AdoptEvent(adopted=False, pid=record.pid, run=record.run, why=why))
        host.emit(
            inst,
            ExitEvent(
                run=record.run,
                pid=record.pid,
                code=None,
                signal=None,
                reason=c.reason,
                log_excerpt=c.excerpt,
            ),
        )
        inst.control.stale_sweep = host.spawn_background(teardown.sweep_stale(host, inst, proc))
        return False
    inst.adopted = True
    inst.process = proc
    inst.control.start()
    lc.spawned(record.run, started_ago_s=host.clock.wall() - record.create_time)
    lc.restarts = record.restarts
    host.emit(inst, AdoptEvent(adopted=True, pid=record.pid, pgid=record.pgid, run=record.run))
    return True
