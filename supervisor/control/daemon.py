"""The vsup daemon: one per VSUP_HOME, owner of every instance process.

It hosts the engine (state machines, processes) and telemetry (scraper, GPU probe), polls each
instance at 1 Hz, builds a `StatusSnapshot` each poll with live advice and history, keeps the
state file and journal, and serves the control API on `$VSUP_HOME/vsup.sock`.

Lifetime rules:
- One daemon per VSUP_HOME: `fcntl.flock` on `$VSUP_HOME/daemon.lock`, held for its life.
- SIGHUP (a dropped SSH session) is ignored; the daemon runs in its own session anyway.
- SIGTERM/SIGINT stop the API and the daemon but leave instances running: a later daemon
  re-adopts them from the state file. Only `vsup down` (POST /v1/shutdown) stops instances.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import re
import signal
import socket
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from supervisor import __version__, paths
from supervisor.clock import Clock, SystemClock, iso_utc
from supervisor.control.advice import CRASH_WINDOW_S, AdviceInputs, compute_advice, problem
from supervisor.control.api import LogFile, build_app
from supervisor.control.errors import Conflict, ControlError, UnknownInstances
from supervisor.control.export import MetricsListener
from supervisor.control.history import History
from supervisor.control.journal import Journal, replay
from supervisor.control.server import ServedApp, bind_unix_socket
from supervisor.control.state import (
    DaemonState,
    InstanceRecord,
    StateFile,
    spec_from_dict,
    spec_to_dict,
)
from supervisor.layout.spec import InstanceSpec
from supervisor.snapshot import (
    Advice,
    GpuStatus,
    InstanceStatus,
    LastExit,
    NodeInfo,
    StatusSnapshot,
    SupervisorInfo,
)

log = logging.getLogger("vsup.daemon")

LOCK_NAME = "daemon.lock"
# A client probing the lock holds it for microseconds; a starting daemon retries this long
# before concluding that another daemon owns VSUP_HOME.
LOCK_RETRY_S = 2.0
# create_time of one process read twice agrees to the clock tick (10 ms); a reused pid differs
# by at least the time between the two processes' starts.
CREATE_TIME_TOLERANCE_S = 0.05
SECRET_KEY = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL", re.IGNORECASE)
ACTIVE_STATES = ("starting", "ready", "unhealthy", "stopping")


# --------------------------------------------------------------------------- lock and process


def acquire_lock(home: Path, retry_s: float = LOCK_RETRY_S) -> int | None:
    """Take the daemon lock; the fd (keep it open) or None when another daemon holds it."""
    path = home / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    deadline = time.monotonic() + retry_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                return None
            time.sleep(0.05)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def daemon_lock_holder(home: Path) -> int | None:
    """The pid of the daemon holding `home`'s lock, or None when no daemon holds it."""
    path = home / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            # Shared and non-blocking: a starting daemon that meets it retries (LOCK_RETRY_S).
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                return int(os.pread(fd, 32, 0).split()[0])
            except (ValueError, IndexError):
                return -1  # held, by a daemon that has not written its pid yet
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def process_matches(pid: int | None, create_time: float | None) -> bool:
    """Whether `pid` is alive and is the very process that started at `create_time`."""
    if not pid or pid <= 0:
        return False
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        if create_time is None:
            return True
        return abs(proc.create_time() - create_time) <= CREATE_TIME_TOLERANCE_S
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def recorded_live_instances(home: Path) -> list[str]:
    """Instances the state file says are running and whose process is alive."""
    result = StateFile(paths.state_path(home)).load()
    if result.state is None:
        return []
    return [
        name
        for name, rec in result.state.instances.items()
        if rec.pid and process_matches(rec.pid, rec.create_time)
    ]


# --------------------------------------------------------------------------- telemetry view


@dataclass
class InstanceTelemetry:
    """The latest telemetry of one instance (None = unknown)."""

    kv_cache_usage: float | None = None
    kv_capacity_tokens: int | None = None
    preemptions_total: float | None = None
    preemptions_per_min: float | None = None
    requests_running: float | None = None
    requests_waiting: float | None = None
    generation_tokens_per_s: float | None = None
    prompt_tokens_per_s: float | None = None
    prefix_cache_hit_rate: float | None = None
    cache_config: dict[str, str] | None = None
    backend: str | None = None
    backend_source: str | None = None
    hbm_bytes: int | None = None
    hbm_source: str = "unavailable"
    scraped_at: float | None = None  # monotonic
    error: str | None = None


# --------------------------------------------------------------------------- the daemon


class Daemon:
    """The daemon's state and the `ControlService` the API calls."""

    def __init__(
        self,
        home: Path,
        *,
        clock: Clock | None = None,
        poll_interval: float = 1.0,
        gpu_probe: Any = None,
    ) -> None:
        self.home = Path(home)
        self.clock = clock or SystemClock()
        self.poll_interval = poll_interval
        self.started_mono = self.clock.monotonic()
        self.state_file = StateFile(paths.state_path(self.home))
        self.journal = Journal(paths.journal_path(self.home), clock_wall=self.clock.wall)
        self.history = History()
        self.logs_dir = paths.logs_dir(self.home)
        self.layout_path: str | None = None
        self.layout_toml: str | None = None
        self.layout_name: str | None = None
        self.layout_obj: Any = None
        self.metrics_listen: str | None = None
        self.problems: list[Advice] = []
        self.telemetry: dict[str, InstanceTelemetry] = {}
        self.gpus: tuple[GpuStatus, ...] = ()
        self.node = NodeInfo(
            hostname=socket.gethostname(), gpu_vendor="none", gpu_count=0, cpu_count=os.cpu_count()
        )
        self._failures: dict[str, deque[float]] = {}
        self._snapshot: StatusSnapshot | None = None
        self._stopping = asyncio.Event()
        self._stop_instances = False
        self._shutting_down = False
        self._state_dirty = asyncio.Event()
        self._apply_lock = asyncio.Lock()
        self._tasks: set[asyncio.Task] = set()
        self.metrics = MetricsListener(lambda: self._snapshot)
        self._gpu_probe = gpu_probe
        self.engine = self._make_engine()

    # ----------------------------------------------------------------- wiring to the engine

    def _make_engine(self):
        from supervisor.engine import Engine

        return Engine(clock=self.clock, logs_dir=self.logs_dir, on_event=self._on_event)

    def _on_event(self, event: Any) -> None:
        """Engine events: journal them, keep the state file current, count failures."""
        doc = _event_dict(event)
        kind = doc.pop("kind", "event")
        name = doc.pop("instance", None)
        doc.pop("t", None)
        if kind == "spawn" and name in self.engine.instances and "create_time" not in doc:
            doc["create_time"] = _create_time(doc.get("pid"))
        if kind == "exit" and name and doc.get("reason") not in ("stopped", None):
            self._failures.setdefault(name, deque(maxlen=64)).append(self.clock.monotonic())
        if kind in ("spawn", "exit") and name:
            tel = self.telemetry.get(name)
            if tel is not None:
                # A new process: no figure of the old one may pass for it.
                self.telemetry[name] = InstanceTelemetry(
                    backend=None, hbm_source=tel.hbm_source
                )
        self.journal.append(kind, name, **doc)
        self._state_dirty.set()

    # ----------------------------------------------------------------- lifecycle

    async def serve(self, sock: socket.socket | None = None) -> None:
        """Run until asked to stop: restore, serve the API, poll, then shut down."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, self.request_stop, f"signal {sig.name}")
        if sock is None:
            sock = bind_unix_socket(paths.socket_path(self.home))
        self.journal.append("daemon_start", pid=os.getpid(), version=__version__)
        await self.restore()
        api = ServedApp(build_app(self), sock, name="control API")
        await api.start()
        log.info("vsup daemon %s (pid %d) serving %s", __version__, os.getpid(), sock.getsockname())
        poller = self._spawn(self._poll_loop(), "poll")
        writer = self._spawn(self._state_writer(), "state writer")
        try:
            await self._stopping.wait()
        finally:
            await api.stop()
            await self.metrics.stop()
            poller.cancel()
            if self._stop_instances:
                pass  # the shutdown task already stopped every instance
            with contextlib.suppress(Exception):
                await self.engine.shutdown(stop_instances=False)
            writer.cancel()
            for t in (poller, writer):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t
            await asyncio.to_thread(self._write_state)
            self.journal.append(
                "daemon_stop", pid=os.getpid(), instances_left_running=self._running_names()
            )
            self.journal.close()
            with contextlib.suppress(OSError):
                paths.socket_path(self.home).unlink()

    def request_stop(self, why: str = "request") -> None:
        """Stop the daemon, leaving instances running (SIGTERM, SIGINT)."""
        log.info("stopping the daemon (%s); instances keep running", why)
        self._stopping.set()

    def _spawn(self, coro, name: str) -> asyncio.Task:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("task %s failed", task.get_name(), exc_info=task.exception())

    # ----------------------------------------------------------------- restore and adoption

    async def restore(self) -> None:
        """Bring back what the last daemon left: the layout, live instances (adopted), and
        instances that vanished meanwhile (their exit goes through the restart policy)."""
        result = self.state_file.load()
        if result.problem:
            self._report_problem("state_file", result.problem)
        state = result.state or DaemonState()
        # The journal may know of spawns and exits after the state file (or its backup) was
        # written: a daemon killed between an event and the next state write.
        after = 0
        if result.state is not None and result.state.written_at is not None:
            after = self._journal_seq_at(result.state.written_at)
        for name, rep in replay(self.journal.iter_file(), after_seq=after).items():
            rec = state.instances.get(name)
            if rec is None:
                if rep.spec is None:
                    continue
                rec = state.instances[name] = InstanceRecord(name=name, spec=rep.spec)
            if rep.running and rep.pid:
                rec.pid, rec.pgid, rec.create_time = rep.pid, rep.pgid, rep.create_time
                rec.port = rep.port or rec.port
                rec.run = max(rec.run, rep.run)
                rec.state = "starting" if rec.state in ("stopped", "backoff") else rec.state
            elif not rep.running and rep.last_exit is not None:
                rec.pid = None
                rec.last_exit = rep.last_exit
                if rec.state in ACTIVE_STATES:
                    rec.state = "backoff"
            rec.restarts = max(rec.restarts, rep.restarts)
        self.layout_path = state.layout_path
        self.layout_toml = state.layout_toml
        self.layout_name = state.layout_name
        if state.layout_toml:
            try:
                self.layout_obj, _specs, diags = _parse_layout(
                    state.layout_toml, state.layout_path, self.node.gpu_count
                )
                self.metrics_listen = _metrics_listen(self.layout_obj, state.layout_toml)
            except Exception as exc:  # the layout was valid when applied; report, go on
                self._report_problem("layout", f"the running layout no longer parses: {exc}")
        for name, rec in state.instances.items():
            try:
                spec = spec_from_dict(rec.spec)
            except ValueError as exc:
                self._report_problem("state_file", f"instance {name}: {exc}")
                continue
            alive = rec.pid is not None and process_matches(rec.pid, rec.create_time)
            if alive:
                self.engine.adopt(spec, _adopt_record(rec))
                self.journal.append(
                    "adopt", name, pid=rec.pid, pgid=rec.pgid, create_time=rec.create_time,
                    port=rec.port, run=rec.run, restarts=rec.restarts,
                )
                log.info("re-adopted %s (pid %s)", name, rec.pid)
            elif rec.pid is not None and rec.state in ACTIVE_STATES + ("backoff",):
                why = "gone" if not psutil.pid_exists(rec.pid) else "reused by another process"
                self.journal.append(
                    "vanished", name, pid=rec.pid, reason="unknown", code=None, signal=None,
                    at=iso_utc(self.clock.wall()),
                    log_excerpt=f"pid {rec.pid} {why} while no daemon watched it",
                )
                self._adopt_vanished(spec, rec)
                log.warning("%s: pid %s %s; applying its restart policy", name, rec.pid, why)
            else:
                self._register_idle(spec, rec)
        if self.metrics_listen:
            await self._start_metrics()
        self._state_dirty.set()

    def _journal_seq_at(self, wall: float) -> int:
        """The last journal seq written at or before wall time `wall`."""
        stamp = iso_utc(wall)
        last = 0
        for ev in self.journal.iter_file():
            if str(ev.get("t", "")) <= stamp and isinstance(ev.get("seq"), int):
                last = ev["seq"]
        return last

    def _adopt_vanished(self, spec: InstanceSpec, rec: InstanceRecord) -> None:
        self.engine.adopt(spec, _adopt_record(rec, vanished=True))

    def _register_idle(self, spec: InstanceSpec, rec: InstanceRecord) -> None:
        self.engine.adopt(spec, _adopt_record(rec, idle=True))

    def _report_problem(self, kind: str, message: str) -> None:
        """A daemon-level problem: daemon.log, the journal, and advice in every snapshot."""
        log.warning("%s", message)
        print(f"vsup daemon: {message}", file=sys.stderr, flush=True)
        self.journal.append("problem", None, problem=kind, message=message)
        self.problems.append(problem(kind, message))

    # ----------------------------------------------------------------- state file

    def state_document(self) -> DaemonState:
        """The state file's content, from the engine's instances."""
        instances = {}
        for name, inst in self.engine.instances.items():
            view = _inst_view(inst)
            instances[name] = InstanceRecord(
                name=name,
                spec=spec_to_dict(inst.spec),
                state=view["state"],
                pid=view["pid"],
                create_time=view["create_time"],
                pgid=view["pgid"],
                port=inst.spec.port,
                run=view["run"],
                restarts=view["restarts"],
                last_exit=view["last_exit"],
                started_at=view["started_at"],
                ready_since=view["ready_since"],
            )
        return DaemonState(
            layout_path=self.layout_path,
            layout_toml=self.layout_toml,
            layout_name=self.layout_name,
            instances=instances,
            daemon_pid=os.getpid(),
        )

    def _write_state(self, doc: DaemonState | None = None) -> None:
        try:
            self.state_file.save(doc or self.state_document())
        except OSError as exc:
            log.error("cannot write %s: %s", self.state_file.path, exc)

    async def _state_writer(self) -> None:
        """Write the state file whenever something changed, at most 10 times a second."""
        while True:
            await self._state_dirty.wait()
            self._state_dirty.clear()
            doc = self.state_document()  # read on the loop; written in a thread
            await asyncio.to_thread(self._write_state, doc)
            await asyncio.sleep(0.1)

    # ----------------------------------------------------------------- polling

    async def _poll_loop(self) -> None:
        next_at = self.clock.monotonic()
        while True:
            try:
                await self.poll_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("poll failed")
            next_at += self.poll_interval
            delay = next_at - self.clock.monotonic()
            if delay < 0:
                next_at = self.clock.monotonic()  # fell behind: do not burst to catch up
                delay = 0
            await asyncio.sleep(delay)

    async def poll_once(self) -> StatusSnapshot:
        """One poll: telemetry of every instance, GPUs, then a snapshot with advice."""
        await self._poll_telemetry()
        snap = self.build_snapshot()
        now = self.clock.wall()
        for inst in snap.instances:
            self.history.record(now, inst)
        self.history.forget({i.name for i in snap.instances})
        return snap

    async def _poll_telemetry(self) -> None:
        """Scrape each running instance (concurrently, each with its own timeout)."""
        # Filled in by the telemetry integration.
        return None

    # ----------------------------------------------------------------- snapshot

    def build_snapshot(self) -> StatusSnapshot:
        """The current snapshot: the engine's states now, telemetry as of the last poll."""
        now_m = self.clock.monotonic()
        gpu_total = {g.index: g.hbm_total_bytes for g in self.gpus}
        instances = []
        for name, inst in self.engine.instances.items():
            spec = inst.spec
            view = _inst_view(inst)
            tel = self.telemetry.get(name) or InstanceTelemetry()
            live = view["state"] in ("ready", "unhealthy")
            planned = None
            if spec.gpu_memory_utilization is not None and spec.gpus:
                totals = [gpu_total.get(g) for g in spec.gpus]
                if all(t is not None for t in totals):
                    planned = int(spec.gpu_memory_utilization * sum(totals))
            instances.append(
                InstanceStatus(
                    name=name,
                    state=view["state"],
                    pid=view["pid"],
                    port=spec.port,
                    gpus=tuple(spec.gpus),
                    model=spec.model,
                    restarts=view["restarts"],
                    uptime_s=view["uptime_s"],
                    hbm_bytes=tel.hbm_bytes if view["pid"] else None,
                    hbm_source=tel.hbm_source,
                    kv_cache_usage=tel.kv_cache_usage if live else None,
                    kv_capacity_tokens=tel.kv_capacity_tokens if live else None,
                    preemptions_total=tel.preemptions_total if live else None,
                    preemptions_per_min=tel.preemptions_per_min if live else None,
                    requests_running=tel.requests_running if live else None,
                    requests_waiting=tel.requests_waiting if live else None,
                    generation_tokens_per_s=tel.generation_tokens_per_s if live else None,
                    backend=tel.backend,
                    backend_source=tel.backend_source,
                    last_exit=_last_exit(view["last_exit"]),
                    prompt_tokens_per_s=tel.prompt_tokens_per_s if live else None,
                    prefix_cache_hit_rate=tel.prefix_cache_hit_rate if live else None,
                    planned_hbm_bytes=planned,
                    gpu_memory_utilization=spec.gpu_memory_utilization,
                    state_since_s=view["state_since_s"],
                    run=view["run"],
                    host=spec.host,
                    backoff_remaining_s=view["backoff_remaining_s"],
                )
            )
        window_start = now_m - CRASH_WINDOW_S
        inputs = AdviceInputs(
            preemptions_rising={
                i.name: self.history.preemptions_rising(i.name, self.clock.wall())
                for i in instances
            },
            recent_failures={
                n: sum(1 for t in ts if t >= window_start) for n, ts in self._failures.items()
            },
            problems=tuple(self.problems),
        )
        snap = StatusSnapshot(
            supervisor=SupervisorInfo(
                pid=os.getpid(),
                version=__version__,
                uptime_s=round(now_m - self.started_mono, 3),
                layout=self.layout_name,
                home=str(self.home),
            ),
            node=self.node,
            gpus=self.gpus,
            instances=tuple(instances),
            advice=compute_advice(instances, self.gpus, inputs),
        )
        self._snapshot = snap
        return snap

    # ----------------------------------------------------------------- ControlService

    def instance_names(self) -> list[str]:
        return list(self.engine.instances)

    def ping(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "version": __version__, "home": str(self.home)}

    def status(self) -> dict[str, Any]:
        return self.build_snapshot().to_json()

    def layout(self) -> dict[str, Any]:
        return {"path": self.layout_path, "toml": self.layout_toml, "name": self.layout_name}

    async def apply(self, toml: str, path: str | None, dry_run: bool) -> dict[str, Any]:
        if self._shutting_down:
            raise Conflict("the daemon is shutting down (vsup down); run `vsup up` afterwards")
        try:
            layout_obj, specs, diags = _parse_layout(toml, path, self.node.gpu_count)
        except Exception as exc:
            return _refused([{"severity": "error", "message": str(exc), "text": str(exc)}])
        errors = [_diag_json(d) for d in diags if _is_error(d)]
        warnings = [_diag_json(d) for d in diags if not _is_error(d)]
        listen = _metrics_listen(layout_obj, toml)
        if listen:
            from supervisor.control.export import parse_listen

            try:
                parse_listen(listen)
            except ValueError as exc:
                errors.append({"severity": "error", "message": str(exc), "text": str(exc),
                               "key": "layout.metrics_listen"})
        if errors:
            return _refused(errors, warnings)
        plan = _plan_json(self.engine.diff(specs))
        if dry_run:
            return {"plan": plan, "errors": [], "warnings": warnings, "applied": False}
        self.layout_obj, self.layout_toml, self.layout_path = layout_obj, toml, path
        self.layout_name = _layout_name(layout_obj, toml, path)
        self.journal.append("action", None, action="apply", layout=self.layout_name, path=path,
                            plan=plan)
        self._state_dirty.set()
        self.metrics_listen = listen
        if listen:
            if not await self._start_metrics():
                warnings.append({"severity": "warning", "message": self.problems[-1].message,
                                 "text": self.problems[-1].message})
        else:
            await self.metrics.stop()
        self._spawn(self._apply(specs), "apply")
        return {"plan": plan, "errors": [], "warnings": warnings, "applied": True}

    async def _apply(self, specs: list[InstanceSpec]) -> None:
        async with self._apply_lock:
            await self.engine.apply(specs)
            self._state_dirty.set()

    async def _start_metrics(self) -> bool:
        try:
            await self.metrics.start(self.metrics_listen)
            self.problems = [p for p in self.problems if p.kind != "metrics_listen"]
            return True
        except (OSError, ValueError) as exc:
            self._report_problem(
                "metrics_listen",
                f"cannot serve Prometheus metrics on {self.metrics_listen} ({exc}); change "
                "[layout] metrics_listen and run `vsup up` again",
            )
            return False

    async def action(self, action: str, names: list[str], wait: bool) -> dict[str, Any]:
        if self._shutting_down:
            raise Conflict("the daemon is shutting down (vsup down)")
        self.journal.append("action", None, action=action, names=names)

        async def one(name: str) -> None:
            if action == "start":
                await self.engine.start(name)
            elif action == "stop":
                await self.engine.stop(name)
            elif action == "drain":
                await self.engine.stop(name, drain=True)
            elif action == "restart":
                await self.engine.restart(name)
            self._state_dirty.set()

        tasks = {name: self._spawn(one(name), f"{action} {name}") for name in names}
        if not wait:
            return {"done": [], "pending": names, "errors": []}
        # Shielded: a client that hangs up does not cancel a stop half-way.
        await asyncio.wait([asyncio.shield(t) for t in tasks.values()])
        done, errors = [], []
        for name, task in tasks.items():
            exc = task.exception()
            if exc is None:
                done.append(name)
            else:
                errors.append({"name": name, "error": str(exc) or type(exc).__name__})
        return {"done": done, "errors": errors}

    def _instance(self, name: str):
        inst = self.engine.instances.get(name)
        if inst is None:
            raise UnknownInstances([name], self.engine.instances)
        return inst

    def log_file(self, name: str, previous: bool) -> LogFile:
        inst = self._instance(name)
        view = _inst_view(inst)
        run = view["run"]
        if previous:
            path = _call_or_attr(inst, "previous_log_path")
            run = run - 1 if run else None
        else:
            path = inst.log_path(run) if run else None
        if path is not None and not Path(path).exists():
            path = None
        return LogFile(run=run, path=Path(path) if path else None)

    def config(self, name: str) -> dict[str, Any]:
        inst = self._instance(name)
        spec = inst.spec
        env = spec.child_env({})
        if spec.api_key_env:
            env["VLLM_API_KEY"] = (
                f"*** (from ${spec.api_key_env}"
                + (")" if os.environ.get(spec.api_key_env) else ", which is not set)")
            )
        masked = {k: ("***" if SECRET_KEY.search(k) and not v.startswith("***") else v)
                  for k, v in env.items()}
        tel = self.telemetry.get(name)
        return {
            "argv": spec.argv(),
            "env": masked,
            "cache_config": dict(tel.cache_config) if tel and tel.cache_config else None,
            "spec": spec_to_dict(spec),
        }

    def history(self, name: str) -> dict[str, Any]:
        self._instance(name)
        return self.history_series(name)

    def history_series(self, name: str) -> dict[str, Any]:
        doc = self.history.series(name)
        doc.pop("preemptions_total", None)
        return doc

    def events(self, since: int, limit: int) -> dict[str, Any]:
        events, nxt = self.journal.read(since, limit)
        return {"events": events, "next": nxt}

    async def save(self, path: str) -> dict[str, Any]:
        if not self.layout_toml:
            raise ControlError("no layout is running; `vsup up LAYOUT` first", status=409)
        layout_obj, _specs, diags = _parse_layout(self.layout_toml, self.layout_path,
                                                  self.node.gpu_count)
        errors = [_diag_json(d) for d in diags if _is_error(d)]
        if errors:
            raise ControlError(
                "the running layout does not validate on this node; nothing was written",
                status=422, body={"errors": errors},
            )
        try:
            await asyncio.to_thread(_save_layout, layout_obj, self.layout_toml, Path(path))
        except OSError as exc:
            raise ControlError(f"cannot write {path}: {exc.strerror or exc}", status=400) from None
        self.journal.append("action", None, action="save", path=path)
        return {"path": path}

    async def shutdown(self, stop_instances: bool) -> dict[str, Any]:
        if self._shutting_down:
            return {"stopping": [], "already": True}
        self._shutting_down = True
        names = self._running_names() if stop_instances else []
        self.journal.append("action", None, action="shutdown", stop_instances=stop_instances)
        self._stop_instances = stop_instances
        self._spawn(self._shutdown(stop_instances), "shutdown")
        return {"stopping": names}

    async def _shutdown(self, stop_instances: bool) -> None:
        try:
            if stop_instances:
                async with self._apply_lock:
                    await self.engine.shutdown(stop_instances=True)
                self._state_dirty.set()
        finally:
            self._stopping.set()

    def _running_names(self) -> list[str]:
        return [n for n, i in self.engine.instances.items() if _inst_view(i)["pid"]]


# --------------------------------------------------------------------------- adapters


def _event_dict(event: Any) -> dict[str, Any]:
    if isinstance(event, dict):
        return dict(event)
    from dataclasses import asdict, is_dataclass

    if is_dataclass(event):
        doc = asdict(event)
        extra = doc.pop("data", None) or doc.pop("fields", None)
        if isinstance(extra, dict):
            doc.update(extra)
        return doc
    return dict(vars(event))


def _create_time(pid: Any) -> float | None:
    try:
        return psutil.Process(int(pid)).create_time()
    except (psutil.Error, TypeError, ValueError):
        return None


def _call_or_attr(obj: Any, name: str) -> Any:
    value = getattr(obj, name, None)
    return value() if callable(value) else value


def _inst_view(inst: Any) -> dict[str, Any]:
    """What the daemon reads from an engine instance, in one place."""
    raise NotImplementedError("engine integration pending")


def _adopt_record(rec: InstanceRecord, vanished: bool = False, idle: bool = False) -> Any:
    raise NotImplementedError("engine integration pending")


def _last_exit(value: Any) -> LastExit | None:
    if value is None:
        return None
    if isinstance(value, LastExit):
        return value
    if isinstance(value, dict):
        return LastExit(
            code=value.get("code"),
            signal=value.get("signal"),
            reason=value.get("reason") or "unknown",
            at=value.get("at") or "",
            log_excerpt=value.get("log_excerpt"),
        )
    return LastExit(
        code=getattr(value, "code", None),
        signal=getattr(value, "signal", None),
        reason=getattr(value, "reason", "unknown"),
        at=getattr(value, "at", ""),
        log_excerpt=getattr(value, "log_excerpt", None),
    )


def _parse_layout(toml: str, path: str | None, node_gpus: int) -> tuple[Any, list, list]:
    """(layout object, specs, diagnostics) of a layout text."""
    raise NotImplementedError("layout integration pending")


def _save_layout(layout_obj: Any, toml: str, path: Path) -> None:
    raise NotImplementedError("layout integration pending")


def _metrics_listen(layout_obj: Any, toml: str) -> str | None:
    value = getattr(layout_obj, "metrics_listen", None)
    if value is None:
        import tomllib

        try:
            value = (tomllib.loads(toml).get("layout") or {}).get("metrics_listen")
        except tomllib.TOMLDecodeError:
            return None
    return str(value) if value else None


def _layout_name(layout_obj: Any, toml: str, path: str | None) -> str | None:
    name = getattr(layout_obj, "name", None)
    if name:
        return str(name)
    return Path(path).stem if path else None


def _is_error(diag: Any) -> bool:
    if isinstance(diag, dict):
        return diag.get("severity") == "error"
    return bool(getattr(diag, "is_error", False))


def _diag_json(diag: Any) -> dict[str, Any]:
    if isinstance(diag, dict):
        return diag
    to_json = getattr(diag, "to_json", None)
    if callable(to_json):
        return to_json()
    return {"severity": "error" if _is_error(diag) else "warning", "message": str(diag),
            "text": str(diag)}


def _plan_json(plan: Any) -> dict[str, list[str]]:
    out = {}
    for key in ("start", "restart", "stop", "unchanged"):
        items = getattr(plan, key, None) if not isinstance(plan, dict) else plan.get(key)
        out[key] = [i if isinstance(i, str) else getattr(i, "name", str(i)) for i in items or ()]
    return out


def _refused(errors: list, warnings: list | None = None) -> dict[str, Any]:
    return {"plan": None, "errors": errors, "warnings": warnings or [], "applied": False}


# --------------------------------------------------------------------------- entry point


def run_daemon(home: Path | None = None, poll_interval: float = 1.0) -> int:
    """`vsup daemon`: take the lock, serve until stopped. 0 also when another daemon runs."""
    home = Path(home) if home else paths.vsup_home()
    os.chmod(home, 0o700)
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    from supervisor.control.client import check_socket_path

    check_socket_path(paths.socket_path(home))
    lock_fd = acquire_lock(home)
    if lock_fd is None:
        holder = daemon_lock_holder(home)
        print(f"vsup daemon: another daemon (pid {holder}) serves {home}", file=sys.stderr)
        return 0
    # An SSH hang-up must never stop the daemon (it is in its own session; this is belt
    # and braces for `vsup daemon` run by hand in a terminal).
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        sock = bind_unix_socket(paths.socket_path(home))
        asyncio.run(_main(home, sock, poll_interval))
    finally:
        os.close(lock_fd)
    return 0


async def _main(home: Path, sock: socket.socket, poll_interval: float) -> None:
    daemon = Daemon(home, poll_interval=poll_interval)
    await daemon.serve(sock)
