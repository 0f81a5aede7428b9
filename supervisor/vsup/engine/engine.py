"""The engine: the API the daemon hosts on its asyncio loop (docs/ARCHITECTURE.md, "Engine API").

    engine = Engine(clock, logs_dir, on_event, gpu_release_check=None, requests_running=None)
    plan = engine.diff(specs)                  # ApplyPlan, nothing changes
    plan = await engine.apply(specs)           # start new, restart changed, stop removed
    await engine.start(name); await engine.stop(name, drain=False); await engine.restart(name)
    engine.adopt(spec, AdoptRecord(...))       # after a daemon restart
    engine.instances[name]                     # Instance: spec, state, pid, ... (read only)
    await engine.wait(name, ("ready",))        # until a state is reached
    await engine.shutdown(stop_instances)

Events go to `on_event` as plain JSON-able dicts `{"t": ISO, "kind": ..., "instance": ...}`;
the kinds and their keys are listed in ARCHITECTURE.md.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from vsup.clock import Clock, iso_utc
from vsup.engine import health, stop
from vsup.engine.exitreason import classify
from vsup.engine.lifecycle import RUNNING, Lifecycle
from vsup.engine.memory import GpuMemoryView
from vsup.engine.proc import (
    ProcInfo,
    RunningProcess,
    process_table,
    read_stat,
    same_process,
)
from vsup.engine.rollout import Rollout, RolloutState
from vsup.engine.runlog import DEFAULT_KEEP, DEFAULT_MAX_BYTES, RunLogs
from vsup.engine.runner import Runner
from vsup.engine.scheduler import DeviceScheduler
from vsup.engine.stop import GpuReleaseCheck, RequestsRunning
from vsup.layout.spec import InstanceSpec
from vsup.snapshot import LastExit

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


@dataclass(frozen=True)
class AdoptRecord:
    """What the daemon's state file keeps of a running instance to take it over later.

    `create_time` is the process start time as psutil gives it (the `spawn` event carries it);
    `descendants` maps pids seen in the tree to their start times, so orphans that left the
    process group are still found.
    """

    pid: int
    create_time: float
    pgid: int
    port: int
    run: int
    restarts: int = 0
    descendants: Mapping[int, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "create_time": self.create_time,
            "pgid": self.pgid,
            "port": self.port,
            "run": self.run,
            "restarts": self.restarts,
            "descendants": {str(p): t for p, t in self.descendants.items()},
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> AdoptRecord:
        return cls(
            pid=int(doc["pid"]),
            create_time=float(doc["create_time"]),
            pgid=int(doc["pgid"]),
            port=int(doc["port"]),
            run=int(doc["run"]),
            restarts=int(doc.get("restarts", 0)),
            descendants={int(p): float(t) for p, t in (doc.get("descendants") or {}).items()},
        )


class Instance:
    """One supervised instance as the daemon sees it. Read its attributes; change it only
    through the Engine."""

    def __init__(self, spec: InstanceSpec, engine: Engine) -> None:
        self.spec = spec
        self._lc = Lifecycle(
            spec,
            engine.clock,
            on_change=lambda old, new: engine._on_state(self, old, new),
            deterministic_spawns=engine.deterministic_spawns,
        )
        self._logs = RunLogs(engine.logs_dir, spec.name, engine.log_keep_runs, engine.log_max_bytes)
        self.process: RunningProcess | None = None
        self.adopted = False
        self.waiting_for: str | None = None  # e.g. "b starting": whose turn it waits for
        self.gpu_released: bool | None = None  # after the last exit, on GPUs with a check
        # what a person asked for; the runner acts on it
        self._want = False
        self._restart = False
        self._drain = False
        self._next_spec: InstanceSpec | None = None
        self._drain_timeout_s: float | None = None  # a rollout's limit for the next drain
        self._stale_sweep: asyncio.Task | None = None
        self._kick = asyncio.Event()
        self._task: asyncio.Task | None = None

    def _set_spec(self, spec: InstanceSpec) -> None:
        self.spec = spec
        self._next_spec = None
        self._lc.configure(spec)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def state(self) -> str:
        return self._lc.state

    @property
    def state_since(self) -> float:
        """Clock monotonic time of the last change of state."""
        return self._lc.state_since

    @property
    def ready_since(self) -> float | None:
        return self._lc.ready_since

    @property
    def started_at(self) -> float | None:
        """Clock monotonic time the current process was spawned."""
        return self._lc.spawned_at

    @property
    def run(self) -> int:
        return self._lc.run

    @property
    def restarts(self) -> int:
        return self._lc.restarts

    @property
    def failures(self) -> int:
        return self._lc.failures

    @property
    def last_exit(self) -> LastExit | None:
        return self._lc.last_exit

    @property
    def failed_why(self) -> str | None:
        """Why the instance is `failed`; None in any other state."""
        return self._lc.failed_why

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def pgid(self) -> int | None:
        return self.process.pgid if self.process is not None else None

    @property
    def descendants(self) -> frozenset[int]:
        """Pids seen in the current process's tree, the API server excluded."""
        return self.process.descendants() if self.process is not None else frozenset()

    @property
    def supervised(self) -> bool:
        """A runner is at work (starting, watching, backing off or stopping)."""
        return self._task is not None

    def backoff_remaining_s(self) -> float | None:
        return self._lc.backoff_remaining_s()

    def log_path(self, run: int | None = None) -> Path | None:
        """The log file of run `run` (default: the latest), or None before the first run."""
        run = self.run if run is None else run
        return self._logs.path(run) if run > 0 else None

    @property
    def previous_log_path(self) -> Path | None:
        """The log of the run before the latest, if it is still kept."""
        if self.run <= 1:
            return None
        path = self._logs.path(self.run - 1)
        return path if path.exists() else None

    def status_fields(self) -> dict[str, Any]:
        """The InstanceStatus fields the engine knows (snapshot.empty_instance(**these))."""
        now = self._lc.clock.monotonic()
        return {
            "name": self.name,
            "state": self.state,
            "pid": self.pid,
            "port": self.spec.port,
            "gpus": tuple(self.spec.gpus),
            "model": self.spec.model,
            "restarts": self.restarts,
            "uptime_s": round(now - self.started_at, 3) if self.started_at is not None else None,
            "last_exit": self.last_exit,
            "gpu_memory_utilization": self.spec.gpu_memory_utilization,
            "state_since_s": round(now - self.state_since, 3),
            "run": self.run or None,
            "host": self.spec.host,
            "backoff_remaining_s": self.backoff_remaining_s(),
            "failed_why": self.failed_why,
        }

    def adopt_record(self) -> AdoptRecord | None:
        """What the state file needs to adopt the running process later; None if none runs."""
        p = self.process
        if p is None:
            return None
        return AdoptRecord(
            pid=p.pid,
            create_time=p.create_time,
            pgid=p.pgid,
            port=self.spec.port,
            run=p.run,
            restarts=self.restarts,
            descendants={q: t for q, t in p.tracked.items() if q != p.pid},
        )

    def __repr__(self) -> str:
        return f"<Instance {self.name} {self.state} pid={self.pid} run={self.run}>"


class Engine:
    """Supervises instances (see the module doc)."""

    def __init__(
        self,
        clock: Clock,
        logs_dir: Path,
        on_event: Callable[[dict[str, Any]], None] | None = None,
        gpu_release_check: GpuReleaseCheck | None = None,
        requests_running: RequestsRunning | None = None,
        *,
        base_env: Mapping[str, str] | None = None,
        health_timeout_s: float = health.DEFAULT_TIMEOUT_S,
        gpu_release_timeout_s: float = 60.0,
        kill_wait_s: float = stop.KILL_WAIT_S,
        log_keep_runs: int = DEFAULT_KEEP,
        log_max_bytes: int = DEFAULT_MAX_BYTES,
        deterministic_spawns: int = 1,
        chores_interval_s: float = 5.0,
        gpu_memory: GpuMemoryView | None = None,
        memory_poll_s: float = 1.0,
    ) -> None:
        """`gpu_release_check(pids, gpus)` answers whether those GPUs no longer hold memory of
        those pids (the telemetry's; awaited at most `gpu_release_timeout_s` after every
        exit of a GPU instance). `requests_running(name)` gives the latest
        `vllm:num_requests_running` of an instance (None if unknown), for drains. `base_env`
        is the environment children start from (default: the daemon's, read at each spawn).
        `gpu_memory(gpus)` gives the GPUs' memory and who holds it (the telemetry's latest
        figures, memory.GpuMemory; None when unknown): with it a start waits while processes
        that are no instance's hold the memory it needs (re-read every `memory_poll_s`), and a
        `gpu_memory_insufficient` exit fails fast when the layout's own instances hold it."""
        self.clock = clock
        self.logs_dir = Path(logs_dir)
        self.on_event = on_event
        self.gpu_release_check = gpu_release_check
        self.requests_running = requests_running
        self.base_env = base_env
        self.health_timeout_s = health_timeout_s
        self.gpu_release_timeout_s = gpu_release_timeout_s
        self.kill_wait_s = kill_wait_s
        self.log_keep_runs = log_keep_runs
        self.log_max_bytes = log_max_bytes
        self.deterministic_spawns = deterministic_spawns
        self.chores_interval_s = chores_interval_s
        self.gpu_memory = gpu_memory
        self.memory_poll_s = memory_poll_s
        self.stuck_poll_s = 1.0  # how often processes that outlived SIGKILL are looked for
        self._instances: dict[str, Instance] = {}
        self._scheduler = DeviceScheduler(on_change=self._kick_waiting)
        self._http: health.HttpGetter | None = None
        self._waiters: list[asyncio.Future] = []
        self._background: set[asyncio.Task] = set()
        self._detached = False
        self._closed = False
        self._table: dict[int, ProcInfo] | None = None
        self._table_at = 0.0
        self._table_scan: asyncio.Future | None = None
        self.rollout: Rollout | None = None  # the latest rolling apply (status JSON `rollout`)
        self._rollout_task: asyncio.Task | None = None

    # -- reading --------------------------------------------------------------------------

    @property
    def instances(self) -> Mapping[str, Instance]:
        """name -> Instance, in the order they were added (a read-only view)."""
        return MappingProxyType(self._instances)

    def diff(self, specs: Iterable[InstanceSpec], rolling: bool = True) -> ApplyPlan:
        """What `apply(specs, rolling=...)` would do; changes nothing."""
        new = _by_name(specs)
        start, restart, update, unchanged = [], [], [], []
        for name, spec in new.items():
            inst = self._instances.get(name)
            if inst is None:
                start.append(name)
                continue
            current = inst._next_spec or inst.spec
            changed = _changed_fields(current, spec)
            idle = inst.state in ("stopped", "failed") and not inst.supervised
            if changed - LIVE_FIELDS:
                (start if idle else restart).append(name)
            elif idle:
                start.append(name)
            elif changed:
                update.append(name)
            else:
                unchanged.append(name)
        gone = [n for n in self._instances if n not in new]
        waves = [n for n in restart if self._instances[n].state == "ready"] if rolling else []
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
    ) -> ApplyPlan:
        """Make the running set match `specs` (see ApplyPlan) and return the plan at once;
        with `wait`, return when every stop has finished, every start is ready or failed and
        the rollout has ended.

        With `rolling` (the default) serving instances that must restart do so in waves of at
        most `max_unavailable`, each drained (at most `drain_timeout_s`, default each
        instance's own) and ready before the next (rollout.py; `self.rollout` shows its
        progress); the other changes happen at once. A rollout still under way is superseded:
        its wave in flight finishes before the new one takes anything down.

        A new instance on a device that a removed one used starts only after that one has
        stopped (its memory is free), whatever the order of the layout."""
        specs = list(specs)
        if max_unavailable < 1:
            raise ValueError(f"max_unavailable must be 1 or more (it is {max_unavailable})")
        plan = self.diff(specs, rolling=rolling)
        new = _by_name(specs)
        self._emit(None, "action", action="apply", plan=plan.to_json())
        in_flight: tuple[str, ...] = ()
        previous = self.rollout
        if previous is not None and previous.active:
            in_flight = previous.current
            if self._rollout_task is not None:
                self._rollout_task.cancel()
            previous.end(RolloutState.SUPERSEDED, iso_utc(self.clock.wall()))
            self._emit(None, "rollout", **previous.to_json())
        removed_devices = {name: set(self._instances[name].spec.devices) for name in plan.stop}
        removals: dict[str, asyncio.Task] = {
            name: self._spawn_task(self._remove(name)) for name in plan.stop
        }
        for name in plan.update:
            self._instances[name]._set_spec(new[name])
        waits: list[asyncio.Task] = list(removals.values())
        for name in plan.restart:
            if name in plan.rolling:
                continue
            inst = self._instances[name]
            inst._next_spec = new[name]
            await self.restart(name)
        for name in plan.start:
            inst = self._instances.get(name)
            if inst is None:
                inst = self._instances[name] = Instance(new[name], self)
            else:
                inst._set_spec(new[name])
            devices = set(new[name].devices)
            blocking = [task for gone, task in removals.items() if devices & removed_devices[gone]]
            if blocking:
                waits.append(self._spawn_task(self._start_after(name, blocking)))
            else:
                await self.start(name)
        if plan.rolling:
            rollout = Rollout(
                plan.rolling, max_unavailable, drain_timeout_s, iso_utc(self.clock.wall())
            )
            self.rollout = rollout
            self._rollout_task = self._spawn_task(self._roll(rollout, new, in_flight))
            waits.append(self._rollout_task)
        if wait:
            await asyncio.gather(*waits, return_exceptions=True)
            for name in (*plan.start, *plan.restart):
                if name in self._instances:
                    await self.wait(name, ("ready", "failed", "stopped"))
        return plan

    async def _roll(
        self, rollout: Rollout, new: Mapping[str, InstanceSpec], after: tuple[str, ...] = ()
    ) -> None:
        """Drive `rollout` wave by wave (see rollout.py). `after`: instances a superseded
        rollout has down; they count against `max_unavailable` until they are back."""
        try:
            for name in after:
                if name in self._instances:
                    await self._restarted(self._instances[name])
            self._emit(None, "rollout", **rollout.to_json())
            for number in range(1, len(rollout.waves) + 1):
                wave = [
                    self._instances[n]
                    for n in rollout.begin_wave(number)
                    if n in self._instances and self._instances[n]._want
                ]
                self._emit(None, "rollout", **rollout.to_json())
                for inst in wave:
                    inst._next_spec = new[inst.name]
                    inst._drain_timeout_s = rollout.drain_timeout_s
                    await self.restart(inst.name, drain=True)
                outcomes = [(inst, await self._restarted(inst)) for inst in wave]
                bad = [(inst, state) for inst, state in outcomes if state != "ready"]
                if bad:
                    rollout.end(
                        RolloutState.FAILED,
                        iso_utc(self.clock.wall()),
                        _wave_failure(number, rollout, bad),
                    )
                    self._emit(None, "rollout", **rollout.to_json())
                    return
                rollout.wave_ready()
            rollout.end(RolloutState.DONE, iso_utc(self.clock.wall()))
            self._emit(None, "rollout", **rollout.to_json())
        except asyncio.CancelledError:
            if rollout.active:
                rollout.end(RolloutState.CANCELLED, iso_utc(self.clock.wall()))
            raise
        finally:
            self._notify()

    async def _restarted(self, inst: Instance) -> str:
        """Wait until a restart of `inst` has come to an end: ready, failed or stopped."""
        await self._until(lambda: not inst._restart and inst.state != "stopping")
        await self._until(lambda: inst.state in ("ready", "failed", "stopped"))
        return inst.state

    async def start(self, name: str, wait: bool = False, automatic: bool = False) -> None:
        """Run the instance (a failed one too: the breaker resets); with `wait`, return once it
        is ready, failed or stopped. `automatic`: the supervisor's own restart of an instance
        that exited unwatched - counted in `restarts`, the breaker not reset."""
        inst = self._get(name)
        self._emit(inst, "action", action="start", automatic=automatic)
        inst._want = True
        inst._lc.request_start(automatic=automatic)
        self._ensure_runner(inst)
        if wait:
            await self.wait(name, ("ready", "failed", "stopped"))

    async def stop(self, name: str, drain: bool = False) -> None:
        """Stop the instance and return when nothing of it is left running. With `drain`,
        first wait (at most `drain_timeout_s`) until it runs no request."""
        inst = self._get(name)
        self._emit(inst, "action", action="stop", drain=drain)
        inst._want = False
        inst._restart = False
        inst._drain = drain
        if inst._task is None:
            if inst.state != "stopped":
                inst._lc.begin_stop()
                inst._lc.finish_stop()
            return
        if inst.state in RUNNING or inst.state == "backoff":
            inst._lc.begin_stop()
        inst._kick.set()
        await self._until(lambda: inst._task is None or inst._want)

    async def restart(self, name: str, drain: bool = False, wait: bool = False) -> None:
        """Stop the running process (if any) and start again; the breaker resets."""
        inst = self._get(name)
        self._emit(inst, "action", action="restart", drain=drain)
        inst._want = True
        inst._drain = drain
        inst._lc.tracker.reset()
        if inst.process is not None:
            inst._restart = True
            inst._lc.begin_stop()
        else:
            inst._lc.request_start()
        self._ensure_runner(inst)
        inst._kick.set()
        if wait:
            await self._until(lambda: not inst._restart and inst.state != "stopping")
            await self.wait(name, ("ready", "failed", "stopped"))

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
        inst = self._instances[spec.name] = Instance(spec, self)
        lc = inst._lc
        lc.run = record.run
        lc.restarts = record.restarts
        proc = RunningProcess(
            record.pid, record.pgid, record.create_time, record.run, None, dict(record.descendants)
        )
        why = _not_adoptable(record)
        if why is None:
            try:
                proc.watch()
            except ProcessLookupError:
                why = f"pid {record.pid} ended while being adopted"
        if why is not None:
            c = classify(None, None, inst._logs.tail(record.run), model=spec.model)
            lc.last_exit = LastExit(None, None, c.reason, iso_utc(self.clock.wall()), c.excerpt)
            self._emit(inst, "adopt", adopted=False, pid=record.pid, run=record.run, why=why)
            self._emit(
                inst,
                "exit",
                run=record.run,
                pid=record.pid,
                code=None,
                signal=None,
                reason=c.reason,
                log_excerpt=c.excerpt,
            )
            inst._stale_sweep = self._spawn_task(self._sweep_stale(inst, proc))
            return None
        inst.adopted = True
        inst.process = proc
        inst._want = True
        lc.spawned(record.run, started_ago_s=self.clock.wall() - record.create_time)
        lc.restarts = record.restarts
        self._emit(inst, "adopt", adopted=True, pid=record.pid, pgid=record.pgid, run=record.run)
        self._ensure_runner(inst)
        return inst

    def restore(
        self,
        spec: InstanceSpec,
        state: str = "stopped",
        run: int = 0,
        restarts: int = 0,
        last_exit: LastExit | None = None,
        failed_why: str | None = None,
    ) -> Instance:
        """Register an instance without a process as a state file remembers it (`stopped` or
        `failed`, and why), keeping its run number, restarts and last exit; nothing starts."""
        if spec.name in self._instances:
            raise ValueError(f"instance {spec.name!r} exists already")
        if state not in ("stopped", "failed"):
            raise ValueError(f"an instance without a process is stopped or failed, not {state!r}")
        inst = self._instances[spec.name] = Instance(spec, self)
        lc = inst._lc
        lc.run = run
        lc.restarts = restarts
        lc.last_exit = last_exit
        if state == "failed":
            lc.fail(failed_why or "it was failed when the previous daemon stopped")
        return inst

    async def wait(
        self, name: str, states: Iterable[str] = ("ready",), timeout: float | None = None
    ) -> str:
        """Wait until the instance is in one of `states`; returns the state."""
        inst = self._get(name)
        wanted = tuple(states)
        await asyncio.wait_for(self._until(lambda: inst.state in wanted), timeout)
        return inst.state

    async def settle(self, name: str, timeout: float | None = None) -> str:
        """Wait until no runner works on the instance (after `failed` or a clean exit the
        sweep of its tree still runs); returns the state."""
        inst = self._get(name)
        await asyncio.wait_for(self._until(lambda: inst._task is None), timeout)
        return inst.state

    async def shutdown(self, stop_instances: bool) -> None:
        """Stop every instance (`stop_instances`) or leave them running for the next daemon to
        adopt (write the state file first: `Instance.adopt_record()`); then release the engine's
        resources. A spawn in flight while detaching is killed: nothing would know it."""
        if stop_instances:
            await asyncio.gather(*(self.stop(n) for n in list(self._instances)))
        else:
            self._detached = True
        tasks = [i._task for i in self._instances.values() if i._task is not None]
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

    def _get(self, name: str) -> Instance:
        try:
            return self._instances[name]
        except KeyError:
            raise UnknownInstance(name) from None

    def _ensure_runner(self, inst: Instance) -> None:
        if self._closed:
            raise RuntimeError("the engine is shut down")
        if inst._task is None:
            inst._task = asyncio.get_running_loop().create_task(
                Runner(self, inst).run(), name=f"vsup-runner-{inst.name}"
            )
        inst._kick.set()

    def _kick_waiting(self, names: list[str]) -> None:
        for name in names:
            inst = self._instances.get(name)
            if inst is not None:
                inst._kick.set()

    def _spawn_task(self, coro) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def _remove(self, name: str) -> None:
        inst = self._instances[name]
        await self.stop(name)
        if self._instances.get(name) is inst and not inst._want:
            del self._instances[name]
            self._emit(inst, "removed")
            self._notify()

    async def _start_after(self, name: str, removals: list[asyncio.Task]) -> None:
        await asyncio.gather(*removals, return_exceptions=True)
        await self.start(name)

    async def _sweep_stale(self, inst: Instance, proc: RunningProcess) -> None:
        """What is left of a process that died while no daemon watched (EngineCore orphans);
        on GPUs the memory must be gone too before the instance starts there again."""
        await self._scheduler.acquire(inst.name, inst.spec.devices, "stop")
        try:
            await self._end_tree(inst, proc)
            await self._await_release(inst, proc)
        finally:
            self._scheduler.release(inst.name)

    async def _end_tree(self, inst: Instance, proc: RunningProcess) -> stop.Ended:
        """TERM, then KILL, every process of the run's group and tree; report what it took."""
        ended = await stop.end_tree(proc, inst.spec.stop_grace_s, self.kill_wait_s)
        if ended.signalled:
            self._emit(
                inst,
                "sweep",
                run=proc.run,
                pids=list(ended.signalled),
                kill=ended.kill_sent,
                waited_s=round(ended.waited_s, 3),
            )
        return ended

    async def _resume_when_gone(
        self, inst: Instance, proc: RunningProcess, pids: tuple[int, ...], why: str
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
                and i.state != "Z"
                and same_process(i.create_time, t)
            ]

        def untouched() -> bool:
            return (
                self._instances.get(inst.name) is inst
                and inst.state == "failed"
                and inst.failed_why == why
            )

        # the API server itself may be among them: wait for its exit to be seen too
        while (alive() or inst.process is proc) and untouched():
            await asyncio.sleep(self.stuck_poll_s)
        if not untouched():
            return
        self._emit(inst, "stuck_gone", run=proc.run, pids=list(born))
        released = await self._await_release(inst, proc)
        if not untouched():
            return
        if released is False:
            gpus = ", ".join(str(g) for g in inst.spec.gpus)
            later = (
                f"the stuck processes of {inst.name} are gone but GPU {gpus} still lists "
                f"their memory after {self.gpu_release_timeout_s:.0f} s; not starting it "
                f"there again until a person does (vsup start {inst.name})"
            )
            self._emit(
                inst, "failed", reason="gpu_memory_not_released", failures=inst.failures, why=later
            )
            inst._lc.fail(later)
            self._notify()
            return
        await self.start(inst.name, automatic=True)

    async def _await_release(self, inst: Instance, proc: RunningProcess) -> bool | None:
        """Wait (bounded) until the instance's GPUs no longer list memory of the run's
        processes; None when nothing can tell (no GPUs, no check)."""
        released, waited = await stop.await_gpu_release(
            self.gpu_release_check, proc.tracked.keys(), inst.spec.gpus, self.gpu_release_timeout_s
        )
        if released is not None or (self.gpu_release_check is not None and inst.spec.gpus):
            inst.gpu_released = released
            self._emit(
                inst,
                "gpu_release",
                run=proc.run,
                gpus=list(inst.spec.gpus),
                released=released,
                waited_s=round(waited, 3),
            )
        return released

    async def _until(self, predicate: Callable[[], bool]) -> None:
        loop = asyncio.get_running_loop()
        while not predicate():
            fut = loop.create_future()
            self._waiters.append(fut)
            await fut

    def _notify(self) -> None:
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    def _on_state(self, inst: Instance, old: str, new: str) -> None:
        self._emit(inst, "state", **{"from": old, "to": new})
        self._notify()

    def _emit(self, inst: Instance | None, kind: str, **fields: Any) -> None:
        event = {"t": iso_utc(self.clock.wall()), "kind": kind}
        if inst is not None:
            event["instance"] = inst.name
        event.update(fields)
        if self.on_event is None:
            return
        try:
            self.on_event(event)
        except Exception:
            log.exception("on_event failed for %s", event)

    async def _process_table(self) -> dict[int, ProcInfo]:
        """The node's process table, scanned at most once per half chores interval for all
        runners together (one scan reads every /proc entry: ~20 ms per 1000 processes)."""
        loop = asyncio.get_running_loop()
        if self._table is not None and loop.time() - self._table_at < self.chores_interval_s / 2:
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

    def _client(self) -> health.HttpGetter:
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


def _not_adoptable(record: AdoptRecord) -> str | None:
    info = read_stat(record.pid)
    if info is None or info.state == "Z":
        return f"pid {record.pid} is gone"
    if not same_process(info.create_time, record.create_time):
        return f"pid {record.pid} is now another process (started at {info.create_time:.2f})"
    if info.pgid != record.pgid:
        return f"pid {record.pid} is in process group {info.pgid}, not {record.pgid}"
    return None


def _wave_failure(number: int, rollout: Rollout, bad: list[tuple[Instance, str]]) -> str:
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
