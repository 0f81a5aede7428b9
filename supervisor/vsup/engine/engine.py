"""The engine: the API the daemon hosts on its asyncio loop (docs/ARCHITECTURE.md, "Engine API").

    engine = Engine(clock, logs_dir, on_event, settings=EngineSettings(), gpu_release_check=None,
                    requests_running=None, gpu_memory=None)
    plan = engine.diff(specs)                  # ApplyPlan, nothing changes
    plan = await engine.apply(specs)           # start new, restart changed, stop removed
    await engine.start(name); await engine.stop(name, drain=False); await engine.restart(name)
    engine.adopt(spec, AdoptRecord(...))       # after a daemon restart
    engine.instances[name]                     # Instance: spec, state, pid, ... (read only)
    await engine.wait(name, {State.READY})     # until a state is reached
    await engine.shutdown(stop_instances)

Events go to `on_event` as typed journal events (vsup.journalevents: one frozen dataclass per
kind, stamped with `t` and `instance`); the kinds and their keys are listed in ARCHITECTURE.md.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from vsup.clock import Clock, iso_utc
from vsup.engine import canarywatch, health
from vsup.engine.adoption import take_over
from vsup.engine.canary import Decision, Verdict
from vsup.engine.instance import AdoptRecord, Instance
from vsup.engine.intent import Restart, Run
from vsup.engine.memory import GpuMemoryView
from vsup.engine.proc import ProcInfo, process_table
from vsup.engine.rollout import Rollout, RolloutState
from vsup.engine.routing import RouterSupervisor
from vsup.engine.runlog import RunLogs
from vsup.engine.runner import Runner
from vsup.engine.scheduler import DeviceScheduler
from vsup.engine.settings import EngineSettings
from vsup.engine.sleep import Sleeper
from vsup.engine.states import DONE_STARTING, IDLE, RUNNING, State
from vsup.engine.stop import GpuReleaseCheck, RequestsRunning
from vsup.journalevents import (
    ActionEvent,
    CanaryEvent,
    JournalEvent,
    RemovedEvent,
    RolloutEvent,
    StallRestartEvent,
    StateEvent,
)
from vsup.layout.spec import CanarySettings, InstanceSpec
from vsup.snapshot import LastExit
from vsup.states import CanaryState

log = logging.getLogger("vsup.engine")

# Spec fields that need no new process when they change: the runner reads them as it goes.
LIVE_FIELDS = frozenset(
    {
        "restart",
        "start_timeout_s",
        "stop_grace_s",
        "drain_timeout_s",
        "health_interval_s",
        "unhealthy_after",
        "unhealthy_grace_s",
        "stall_after_s",
        "canary_interval_s",
        "rest_interval_s",
        "profiles",
    }
)


class UnknownInstance(KeyError):
    """No instance of that name (the control API answers 404)."""

    def __str__(self) -> str:
        return f"no instance named {self.args[0]!r}"


@dataclass(frozen=True)
class ApplyPlan:
    """What `apply(specs)` does, by instance name, in layout order.

    start: new instances, and existing ones that are stopped or failed (applying a layout
    means "run all of it"); restart: running instances whose process-defining fields changed
    (model, command, host, port, gpus, utilization, args, env, api_key_env); update: instances
    whose other fields changed (restart policy, timeouts): taken without a restart; stop:
    instances the layout no longer has (they are removed once stopped); unchanged: the rest.
    rolling: the part of `restart` that is serving (ready) and restarts in waves (rollout.py);
    the rest of `restart` restarts at once.
    """

    start: tuple[str, ...] = ()
    restart: tuple[str, ...] = ()
    stop: tuple[str, ...] = ()
    unchanged: tuple[str, ...] = ()
    update: tuple[str, ...] = ()
    rolling: tuple[str, ...] = ()

    def to_json(self) -> dict[str, list[str]]:
        keys = ("start", "restart", "stop", "unchanged", "update", "rolling")
        return {k: list(getattr(self, k)) for k in keys}

    @property
    def empty(self) -> bool:
        return not (self.start or self.restart or self.stop or self.update)


class Engine:
    """Supervises instances (see the module doc)."""

    def __init__(
        self,
        clock: Clock,
        logs_dir: Path,
        on_event: Callable[[JournalEvent], None] | None = None,
        *,
        settings: EngineSettings | None = None,
        gpu_release_check: GpuReleaseCheck | None = None,
        requests_running: RequestsRunning | None = None,
        gpu_memory: GpuMemoryView | None = None,
    ) -> None:
        """`settings`: timeouts, log caps and the children's base environment (settings.py).
        The engine asks the daemon through the rest, each optional:
        `gpu_release_check(pids, gpus)` answers whether those GPUs no longer hold memory of
        those pids (the telemetry's; awaited at most `settings.gpu_release_timeout_s` after
        every exit of a GPU instance). `requests_running(name)` gives the latest
        `vllm:num_requests_running` of an instance (None if unknown), for drains.
        `gpu_memory(gpus)` gives the GPUs' memory and who holds it (the telemetry's latest
        figures, memory.GpuMemory; None when unknown): with it a start waits while processes
        that are no instance's hold the memory it needs (re-read every
        `settings.memory_poll_s`), and a `gpu_memory_insufficient` exit fails fast when the
        layout's own instances hold it."""
        self.clock = clock
        self.logs_dir = Path(logs_dir)
        self.on_event = on_event
        self.settings = settings if settings is not None else EngineSettings()
        self.gpu_release_check = gpu_release_check
        self.requests_running = requests_running
        self.gpu_memory = gpu_memory
        self._instances: dict[str, Instance] = {}
        self.scheduler = DeviceScheduler(on_change=self._kick_waiting)
        self._http: health.HttpGetter | None = None
        self._waiters: list[asyncio.Future] = []
        self._background: set[asyncio.Task] = set()
        self.detached = False
        self._closed = False
        self._table: dict[int, ProcInfo] | None = None
        self._table_at = 0.0
        self._table_scan: asyncio.Future | None = None
        self.rollout: Rollout | None = None  # the latest rolling apply (status JSON `rollout`)
        self._rollout_task: asyncio.Task | None = None
        # the layout's vllm-router (engine/routing.py); its membership follows the instances
        self.router = RouterSupervisor(self)
        # vLLM's sleep mode: sleep, wake, swap and the swap groups' start gate (sleep.py)
        self.sleeper = Sleeper(self)

    # -- reading --------------------------------------------------------------------------

    @property
    def instances(self) -> Mapping[str, Instance]:
        """name -> Instance, in the order they were added (a read-only view)."""
        return MappingProxyType(self._instances)

    def diff(self, specs: Iterable[InstanceSpec], rolling: bool = True) -> ApplyPlan:
        """What `apply(specs, rolling=...)` would do; changes nothing."""
        new = _by_name(specs)
        start: list[str] = []
        restart: list[str] = []
        update: list[str] = []
        unchanged: list[str] = []
        for name, spec in new.items():
            inst = self._instances.get(name)
            if inst is None:
                start.append(name)
                continue
            current = inst.control.pending_spec or inst.spec
            changed = _changed_fields(current, spec)
            idle = inst.state in IDLE and not inst.supervised
            if changed - LIVE_FIELDS:
                (start if idle else restart).append(name)
            elif idle:
                start.append(name)
            elif changed:
                update.append(name)
            else:
                unchanged.append(name)
        gone = [n for n in self._instances if n not in new]
        waves = [n for n in restart if self._instances[n].state == State.READY] if rolling else []
        return ApplyPlan(
            tuple(start), tuple(restart), tuple(gone), tuple(unchanged), tuple(update), tuple(waves)
        )

    # -- acting -----------------------------------------------------------------------------

    async def apply(
        self,
        specs: Iterable[InstanceSpec],
        wait: bool = False,
        *,
        rolling: bool = True,
        max_unavailable: int = 1,
        drain_timeout_s: float | None = None,
        canary: CanarySettings | None = None,
    ) -> ApplyPlan:
        """Make the running set match `specs` (see ApplyPlan) and return the plan at once;
        with `wait`, return when every stop has finished, every start is ready or failed and
        the rollout has ended.

        With `rolling` (the default) serving instances that must restart do so in waves of at
        most `max_unavailable`, each drained (at most `drain_timeout_s`, default each
        instance's own) and ready before the next (rollout.py; `self.rollout` shows its
        progress); the other changes happen at once. A rollout still under way is superseded:
        its wave in flight finishes before the new one takes anything down. With `canary`
        (enabled) the first wave is watched and gated before the rest (docs/canary.md).

        A new instance on a device that a removed one used starts only after that one has
        stopped (its memory is free), whatever the order of the layout."""
        specs = list(specs)
        if max_unavailable < 1:
            raise ValueError(f"max_unavailable must be 1 or more (it is {max_unavailable})")
        plan = self.diff(specs, rolling=rolling)
        new = _by_name(specs)
        # what the rolling instances run now: a canary that fails goes back to it
        old = {n: self._instances[n].spec for n in plan.rolling}
        self.emit(None, ActionEvent(action="apply", plan=plan.to_json()))
        in_flight = self._supersede_rollout()
        removals = self._begin_removals(plan.stop)
        for name in plan.update:
            self._instances[name].set_spec(new[name])
        waits: list[asyncio.Task] = list(removals)
        for name in (n for n in plan.restart if n not in plan.rolling):
            await self.restart(name, spec=new[name])
        for name in plan.start:
            devices = set(new[name].devices)
            blocking = [task for task, gone in removals.items() if devices & gone]
            started = await self._start_new(new[name], blocking)
            if started is not None:
                waits.append(started)
        if plan.rolling:
            gate = canary if canary is not None and canary.enabled else None
            rollout = Rollout(
                plan.rolling,
                max_unavailable,
                drain_timeout_s,
                iso_utc(self.clock.wall()),
                canary=gate.instances if gate else 0,
                canary_s=gate.watch_s if gate else 0.0,
            )
            waits.append(self._begin_rollout(rollout, new, in_flight, gate, old))
        if wait:
            await self._settle(plan, waits)
        return plan

    def _begin_rollout(
        self,
        rollout: Rollout,
        new: Mapping[str, InstanceSpec],
        in_flight: tuple[str, ...],
        gate: CanarySettings | None = None,
        old: Mapping[str, InstanceSpec] | None = None,
    ) -> asyncio.Task:
        self.rollout = rollout
        self._rollout_task = self.spawn_background(
            self._roll(rollout, new, in_flight, gate, old or {})
        )
        return self._rollout_task

    def end_canary_watch(self, promote: bool) -> bool:
        """End the watch of the running rollout's canary now: `promote` goes on as if it
        passed, else it is rolled back (`vsup rollout promote|abort`). False when no canary is
        being watched."""
        r = self.rollout
        if r is None or not r.active or r.canary_state != CanaryState.WATCHING:
            return False
        r.watch_decided = "pass" if promote else "fail"
        self.notify()
        return True

    async def _settle(self, plan: ApplyPlan, waits: list[asyncio.Task]) -> None:
        """Until every stop, delayed start and the rollout of `plan` have ended and every
        start is ready or failed (`apply(wait=True)`)."""
        await asyncio.gather(*waits, return_exceptions=True)
        for name in (*plan.start, *plan.restart):
            if name in self._instances:
                await self.wait(name, DONE_STARTING)

    def _begin_removals(self, names: Iterable[str]) -> dict[asyncio.Task, set[str]]:
        """Stop and forget the instances the layout no longer has, in the background: each
        removal's task and the devices it frees."""
        return {
            self.spawn_background(self._remove(name)): set(self._instances[name].spec.devices)
            for name in names
        }

    def _supersede_rollout(self) -> tuple[str, ...]:
        """End a rollout still under way (superseded); returns the instances its wave in
        flight has down, which the next rollout waits for."""
        previous = self.rollout
        if previous is None or not previous.active:
            return ()
        in_flight = previous.current  # before the end clears it
        if self._rollout_task is not None:
            self._rollout_task.cancel()
        previous.end(RolloutState.SUPERSEDED, iso_utc(self.clock.wall()))
        self.emit(None, RolloutEvent.of(previous.to_json()))
        return in_flight

    async def _start_new(
        self, spec: InstanceSpec, blocking: list[asyncio.Task]
    ) -> asyncio.Task | None:
        """Start an instance of the plan (known or new) now, or once the removals it shares a
        device with (`blocking`) have ended: then the task that waits for them."""
        known = self._instances.get(spec.name)
        if known is None:
            self._instances[spec.name] = self._new_instance(spec)
        else:
            known.set_spec(spec)
        if blocking:
            return self.spawn_background(self._start_after(spec.name, blocking))
        await self.start(spec.name)
        return None

    async def _roll(
        self,
        rollout: Rollout,
        new: Mapping[str, InstanceSpec],
        after: tuple[str, ...] = (),
        gate: CanarySettings | None = None,
        old: Mapping[str, InstanceSpec] | None = None,
    ) -> None:
        """Drive `rollout` wave by wave (see rollout.py). `after`: instances a superseded
        rollout has down; they count against `max_unavailable` until they are back. `gate`:
        the canary's settings (the first wave is watched); `old`: the specs the rolling
        instances ran before, for a canary's rollback."""
        try:
            for name in after:
                if name in self._instances:
                    await self._restarted(self._instances[name])
            self.emit(None, RolloutEvent.of(rollout.to_json()))
            for number in range(1, len(rollout.waves) + 1):
                bad = await self._roll_wave(rollout, number, new)
                if number == 1 and gate is not None and rollout.canaries:
                    if not await self._gate(rollout, gate, bad, old or {}):
                        return
                    bad = []
                if bad:
                    rollout.end(
                        RolloutState.FAILED,
                        iso_utc(self.clock.wall()),
                        _wave_failure(number, rollout, bad),
                    )
                    self.emit(None, RolloutEvent.of(rollout.to_json()))
                    return
                rollout.wave_ready()
            rollout.end(RolloutState.DONE, iso_utc(self.clock.wall()))
            self.emit(None, RolloutEvent.of(rollout.to_json()))
        except asyncio.CancelledError:
            if rollout.active:
                rollout.end(RolloutState.CANCELLED, iso_utc(self.clock.wall()))
            raise
        finally:
            self.notify()

    async def _gate(
        self,
        rollout: Rollout,
        gate: CanarySettings,
        bad: Sequence[tuple[Instance, State]],
        old: Mapping[str, InstanceSpec],
    ) -> bool:
        """Watch the canary wave (just restarted; `bad`: those not ready) and act on the
        gate's verdict: True to go on with the next waves; False once the canary has been
        rolled back (the rollout ended `rolled_back`)."""
        if bad:
            seconds = 0.0
            reason = "; ".join(
                f"canary {inst.name}: {state} on the new spec (did not come back ready)"
                for inst, state in bad
            )
            verdict = Verdict(Decision.FAIL, reason, {})
        else:
            rollout.watch_decided = None
            rollout.canary_state = CanaryState.WATCHING
            self.emit(None, RolloutEvent.of(rollout.to_json()))
            started = self.clock.monotonic()
            verdict = await canarywatch.watch(self, rollout, gate)
            seconds = self.clock.monotonic() - started
        failed = verdict.decision == Decision.FAIL
        rollout.canary_state = CanaryState.FAILED if failed else CanaryState.PASSED
        rollout.verdict = verdict.reason
        self.emit(
            None,
            CanaryEvent(
                instances=list(rollout.canaries),
                decision=str(verdict.decision),
                reason=verdict.reason,
                action="roll_back" if failed else "continue",
                watched_s=round(seconds, 3),
                figures=dict(verdict.figures),
            ),
        )
        if not failed:
            return True
        await self._roll_back(rollout, old)
        rollout.end(
            RolloutState.ROLLED_BACK, iso_utc(self.clock.wall()), f"{verdict.reason}; rolled back"
        )
        self.emit(None, RolloutEvent.of(rollout.to_json()))
        return False

    async def _roll_back(self, rollout: Rollout, old: Mapping[str, InstanceSpec]) -> None:
        """Put the canary wave back on the specs it ran before, drained like a wave (the
        router takes it out first); returns once each is ready again (or not)."""
        back = [
            self._instances[n]
            for n in rollout.canaries
            if n in self._instances
            and n in old
            # the breaker tripped on the new spec, or it runs it: not one a person stopped
            and (self._instances[n].state == State.FAILED or self._instances[n].control.wants_run)
        ]
        for inst in back:
            limit = rollout.drain_timeout_s
            await self.restart(
                inst.name,
                drain=True,
                drain_timeout_s=limit if limit is not None else old[inst.name].drain_timeout_s,
                spec=old[inst.name],
            )
        for inst in back:
            if await self._restarted(inst) == State.READY:
                await self.router.joined(inst.name)
        rollout.done = [n for n in rollout.done if n not in rollout.canaries]
        rollout.current = ()

    async def _roll_wave(
        self, rollout: Rollout, number: int, new: Mapping[str, InstanceSpec]
    ) -> list[tuple[Instance, State]]:
        """Restart wave `number` drained, wait for it and for the router to route to it again;
        returns the instances that did not come back ready (with their state)."""
        wave = []
        for name in rollout.begin_wave(number):
            inst = self._instances.get(name)
            if inst is None:
                continue  # removed by a later apply
            if inst.control.wants_run:
                wave.append(inst)
            elif not inst.supervised:
                # a person stopped it meanwhile: it stays stopped, with the layout's
                # spec for whenever it starts again
                inst.set_spec(new[name])
        self.emit(None, RolloutEvent.of(rollout.to_json()))
        for inst in wave:
            # the layout being applied says how long a drain may take, not the old spec
            limit = rollout.drain_timeout_s
            await self.restart(
                inst.name,
                drain=True,
                drain_timeout_s=limit if limit is not None else new[inst.name].drain_timeout_s,
                spec=new[inst.name],
            )
        outcomes = [(inst, await self._restarted(inst)) for inst in wave]
        # ready is not serving until the router routes to it again: the next wave's
        # removal must not leave the router with fewer workers than max_unavailable
        # allows
        for inst, state in outcomes:
            if state == State.READY:
                await self.router.joined(inst.name)
        return [(inst, state) for inst, state in outcomes if state != State.READY]

    async def _restarted(self, inst: Instance) -> State:
        """Wait until a restart of `inst` has come to an end: ready, failed or stopped."""
        await self.until(lambda: not self._restarting(inst))
        await self.until(lambda: inst.state in DONE_STARTING)
        return inst.state

    @staticmethod
    def _restarting(inst: Instance) -> bool:
        """A restart of `inst` is asked for and not yet taken, or its stop is under way."""
        return isinstance(inst.control.intent, Restart) or inst.state == State.STOPPING

    async def start(self, name: str, wait: bool = False, automatic: bool = False) -> None:
        """Run the instance (a failed one too: the breaker resets); with `wait`, return once it
        is ready, failed or stopped. `automatic`: the supervisor's own restart of an instance
        that exited unwatched - counted in `restarts`, the breaker not reset."""
        inst = self._get(name)
        self.emit(inst, ActionEvent(action="start", automatic=automatic))
        inst.control.start()
        inst.lifecycle.request_start(automatic=automatic)
        self._ensure_runner(inst)
        if wait:
            await self.wait(name, DONE_STARTING)

    async def stop(self, name: str, drain: bool = False) -> None:
        """Stop the instance and return when nothing of it is left running. With `drain`,
        first wait (at most `drain_timeout_s`) until it runs no request."""
        inst = self._get(name)
        # no new request from the router before anything else (and, for a drain, the ones
        # already sent counted)
        await self.router.leave(name, settle=drain)
        self.emit(inst, ActionEvent(action="stop", drain=drain))
        await self.halt(inst, drain)

    @staticmethod
    def relaunch(
        inst: Instance,
        drain: bool = False,
        drain_timeout_s: float | None = None,
        spec: InstanceSpec | None = None,
    ) -> None:
        """Want `inst` running again with a fresh breaker (and `spec`, when given): a live
        process is stopped (its runner then starts the next), an idle instance is started. The
        one restart path for instances and the router.

        The restart is the intent until the runner takes it at its next start, so it cannot be
        lost: asked for while a spawn is still under way (no process yet), the runner ends that
        process as soon as it exists and starts again."""
        inst.control.restart(drain, drain_timeout_s, spec)
        inst.lifecycle.tracker.reset()
        if inst.process is not None:
            inst.lifecycle.begin_stop()
        else:
            inst.lifecycle.request_start()

    async def halt(self, inst: Instance, drain: bool = False) -> None:
        """Have `inst`'s runner stop its process and return once it has (or someone wants it
        running again meanwhile); an instance with no runner is marked stopped at once. The
        one stop path for instances and the router (routing.py)."""
        inst.control.stop(drain)
        if inst.control.task is None:
            if inst.state != State.STOPPED:
                inst.lifecycle.begin_stop()
                inst.lifecycle.finish_stop()
            return
        if inst.state in RUNNING or inst.state == State.BACKOFF:
            inst.lifecycle.begin_stop()
        inst.control.kick.set()
        await self.until(lambda: inst.control.task is None or inst.control.wants_run)

    async def restart(
        self,
        name: str,
        drain: bool = False,
        wait: bool = False,
        *,
        drain_timeout_s: float | None = None,
        spec: InstanceSpec | None = None,
    ) -> None:
        """Stop the running process (if any) and start again; the breaker resets. `spec`: the
        spec to start with (an apply's change); `drain_timeout_s`: the drain's limit (a
        rollout's), else the instance's own."""
        inst = self._get(name)
        await self.router.leave(name, settle=drain)
        self.emit(inst, ActionEvent(action="restart", drain=drain))
        self.relaunch(inst, drain, drain_timeout_s, spec)
        self._ensure_runner(inst)
        inst.control.kick.set()
        if wait:
            await self.until(lambda: not self._restarting(inst))
            await self.wait(name, DONE_STARTING)

    def restart_stalled(self, name: str, why: str, rank: int | None = None) -> bool:
        """End a stalled run and let the restart policy bring it back (`restart.on_stall`):
        like a crash, the exit (reason `stalled`) counts as a failure, so restarts back off and
        the breaker trips on a server that stalls again and again. `rank`: the data-parallel
        rank that stalled (the exit names it). False when there is nothing to do: not `ready`,
        no process, or a stall restart already under way."""
        inst = self._get(name)
        if (
            inst.state != State.READY
            or inst.process is None
            or inst.control.task is None
            or not isinstance(inst.control.intent, Run)
        ):
            return False
        inst.control.stall_restart(why, rank)
        self.emit(inst, StallRestartEvent(run=inst.run, pid=inst.pid, why=why, rank=rank))
        inst.control.kick.set()
        return True

    def adopt(self, spec: InstanceSpec, record: AdoptRecord) -> Instance | None:
        """Take over a process an earlier daemon started. `spec` is the spec it was started
        with (from the state file); apply the current layout afterwards to restart what changed.

        The pid must still name that process (same start time, same group): a reused pid is
        never adopted. When the process is gone, the instance is registered `stopped` with the
        exit classified from its log, what is left of its tree (EngineCore orphans) is swept
        now, and None is returned: start it (or apply) to run it again.
        """
        if spec.name in self._instances:
            raise ValueError(f"instance {spec.name!r} exists already")
        if record.port != spec.port:
            spec = replace(spec, port=record.port)  # where it really listens
        inst = self._instances[spec.name] = self._new_instance(spec)
        if not take_over(self, inst, record):
            return None
        self.sleeper.adopting(inst)  # its sleep state is unknown until its server says
        self._ensure_runner(inst)
        return inst

    def restore(
        self,
        spec: InstanceSpec,
        state: State = State.STOPPED,
        run: int = 0,
        restarts: int = 0,
        last_exit: LastExit | None = None,
        failed_why: str | None = None,
    ) -> Instance:
        """Register an instance without a process as a state file remembers it (`stopped` or
        `failed`, and why), keeping its run number, restarts and last exit; nothing starts."""
        if spec.name in self._instances:
            raise ValueError(f"instance {spec.name!r} exists already")
        if state not in IDLE:
            raise ValueError(f"an instance without a process is stopped or failed, not {state!r}")
        inst = self._instances[spec.name] = self._new_instance(spec)
        lc = inst.lifecycle
        lc.run = run
        lc.restarts = restarts
        lc.last_exit = last_exit
        if state == State.FAILED:
            lc.fail(failed_why or "it was failed when the previous daemon stopped")
        return inst

    async def wait(
        self, name: str, states: Iterable[str] = (State.READY,), timeout: float | None = None
    ) -> State:
        """Wait until the instance is in one of `states`; returns the state."""
        inst = self._get(name)
        wanted = frozenset(states)
        await asyncio.wait_for(self.until(lambda: inst.state in wanted), timeout)
        return inst.state

    async def settle(self, name: str, timeout: float | None = None) -> State:
        """Wait until no runner works on the instance (after `failed` or a clean exit the
        sweep of its tree still runs); returns the state."""
        inst = self._get(name)
        await asyncio.wait_for(self.until(lambda: inst.control.task is None), timeout)
        return inst.state

    async def shutdown(self, stop_instances: bool) -> None:
        """Stop every instance (`stop_instances`) or leave them running for the next daemon to
        adopt (write the state file first: `Instance.adopt_record()`); then release the engine's
        resources. A spawn in flight while detaching is killed: nothing would know it."""
        if stop_instances:
            await self.router.stop()
            await asyncio.gather(*(self.stop(n) for n in list(self._instances)))
        else:
            self.detached = True
        await self.router.shutdown(stop_router=False)
        tasks = [i.control.task for i in self._instances.values() if i.control.task is not None]
        tasks += list(self._background)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for inst in self._instances.values():
            if inst.process is not None:
                inst.process.close()
        if self._http is not None:
            await self._http.aclose()
            self._http = None
        self._closed = True

    # -- internals ----------------------------------------------------------------------------

    def _new_instance(self, spec: InstanceSpec) -> Instance:
        st = self.settings
        logs = RunLogs(self.logs_dir, spec.name, st.log_keep_runs, st.log_max_bytes)
        return Instance(spec, self.clock, logs, self._on_state, st.deterministic_spawns)

    def _get(self, name: str) -> Instance:
        try:
            return self._instances[name]
        except KeyError:
            raise UnknownInstance(name) from None

    def _ensure_runner(self, inst: Instance) -> None:
        if self._closed:
            raise RuntimeError("the engine is shut down")
        if inst.control.task is None:
            inst.control.task = asyncio.get_running_loop().create_task(
                Runner(self, inst).run(), name=f"vsup-runner-{inst.name}"
            )
        inst.control.kick.set()

    def _kick_waiting(self, names: list[str]) -> None:
        for name in names:
            inst = self._instances.get(name)
            if inst is not None:
                inst.control.kick.set()

    def spawn_background(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task:
        """Run `coro` as a task that shutdown() cancels."""
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def _remove(self, name: str) -> None:
        inst = self._instances[name]
        await self.stop(name)
        if self._instances.get(name) is inst and not inst.control.wants_run:
            del self._instances[name]
            self.emit(inst, RemovedEvent())
            self.notify()

    async def _start_after(self, name: str, removals: list[asyncio.Task]) -> None:
        await asyncio.gather(*removals, return_exceptions=True)
        await self.start(name)

    async def until(self, predicate: Callable[[], bool]) -> None:
        """Return once `predicate()` holds; it is re-checked at every `notify()`."""
        loop = asyncio.get_running_loop()
        while not predicate():
            fut = loop.create_future()
            self._waiters.append(fut)
            await fut

    def notify(self) -> None:
        """Wake everything waiting in `until` to re-check its condition."""
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    def _on_state(self, inst: Instance, old: State, new: State) -> None:
        self.emit(inst, StateEvent(from_=old, to=new))
        self.router.instance_state(inst.name, new)
        self.notify()

    def emit(self, inst: Instance | None, event: JournalEvent) -> None:
        """Send an event (vsup.journalevents) to `on_event`, stamped with the time and the
        instance's name (never raises: a failing handler is logged)."""
        name = inst.name if inst is not None else event.instance
        event = replace(event, t=iso_utc(self.clock.wall()), instance=name)
        if self.on_event is None:
            return
        try:
            self.on_event(event)
        except Exception:
            log.exception("on_event failed for %s", event)

    async def scan_processes(self) -> dict[int, ProcInfo]:
        """The node's process table, scanned at most once per half chores interval for all
        runners together (one scan reads every /proc entry, a cost that grows with the node's
        process count: docs/benchmarks.md)."""
        loop = asyncio.get_running_loop()
        half = self.settings.chores_interval_s / 2
        if self._table is not None and loop.time() - self._table_at < half:
            return self._table
        if self._table_scan is None:
            self._table_scan = asyncio.ensure_future(asyncio.to_thread(process_table))
        scan = self._table_scan
        try:
            table = await asyncio.shield(scan)
        finally:
            if self._table_scan is scan and scan.done():
                self._table_scan = None
        self._table, self._table_at = table, loop.time()
        return table

    def health_answered(self, name: str, run: int, status: int | None) -> None:
        """A `/health` answer someone else got from run `run` of `name` (the telemetry scrape
        asks it with /metrics on one connection): the health loop takes it instead of asking
        again (runner.py); None: the scrape that asked got no answer."""
        inst = self._instances.get(name)
        if inst is not None and inst.run == run and inst.pid is not None:
            inst.lifecycle.health_answered(status)

    def health_resting(self, name: str, run: int, window_s: float) -> None:
        """Run `run` of `name` is at rest (control/monitor.py) and scraped, /health with it,
        only every so often: a good answer up to `window_s` old stands for the health loop's
        check (runner.py); 0 ends the rest."""
        inst = self._instances.get(name)
        if inst is not None and inst.run == run:
            inst.lifecycle.rest_window_s = window_s

    def http_client(self) -> health.HttpGetter:
        """The keep-alive client of /health checks, made on first use."""
        if self._http is None:
            self._http = health.make_client()
        return self._http


def _by_name(specs: Iterable[InstanceSpec]) -> dict[str, InstanceSpec]:
    out: dict[str, InstanceSpec] = {}
    for spec in specs:
        if spec.name in out:
            raise ValueError(f"two instances are named {spec.name!r}")
        out[spec.name] = spec
    return out


def _changed_fields(a: InstanceSpec, b: InstanceSpec) -> set[str]:
    return {f.name for f in fields(InstanceSpec) if getattr(a, f.name) != getattr(b, f.name)}


def _wave_failure(number: int, rollout: Rollout, bad: Sequence[tuple[Instance, State]]) -> str:
    """One line: which instance of the wave did not come back, why, and what keeps serving."""
    parts = []
    for inst, state in bad:
        why = inst.failed_why or (inst.last_exit.reason if inst.last_exit else None)
        parts.append(f"{inst.name} is {state}" + (f" ({why})" if why else ""))
    rest = rollout.pending
    keep = (
        f"; {', '.join(rest)} keep their old config and keep serving"
        if rest
        else "; no instance was left to change"
    )
    return f"wave {number}/{len(rollout.waves)} failed: " + "; ".join(parts) + keep
