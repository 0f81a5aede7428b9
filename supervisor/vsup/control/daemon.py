"""The vsup daemon: one per VSUP_HOME, owner of every instance process.

It hosts the engine (state machines, processes) and the telemetry monitor (scraper, log
watchers, GPU probe), polls each instance at 1 Hz, builds a `StatusSnapshot` each poll with live
advice and history, keeps the state file and journal, and serves the control API on
`$VSUP_HOME/vsup.sock`.

Lifetime rules:
- One daemon per VSUP_HOME: `fcntl.flock` on `$VSUP_HOME/daemon.lock`, held for its life.
- SIGHUP (a dropped SSH session) is ignored; the daemon runs in its own session anyway.
- SIGTERM/SIGINT stop the API and the daemon but leave instances running: a later daemon
  re-adopts them from the state file. Only `vsup down` (POST /v1/shutdown) stops instances.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import signal
import socket
import sys
from collections import deque
from dataclasses import asdict
from pathlib import Path
from typing import Any

from vsup import __version__, paths
from vsup.clock import Clock, SystemClock
from vsup.control.advice import (
    CRASH_WINDOW_S,
    KV_PEAK_WINDOW_S,
    AdviceInputs,
    compute_advice,
    problem,
)
from vsup.control.api import LogFile, build_app
from vsup.control.errors import Conflict, ControlError, UnknownInstances
from vsup.control.export import MetricsListener, parse_listen
from vsup.control.journal import Journal, last_layout, replay
from vsup.control.lock import acquire_lock, daemon_lock_holder
from vsup.control.monitor import Monitor, Target
from vsup.control.server import ServedApp, bind_unix_socket
from vsup.control.state import (
    DaemonState,
    InstanceRecord,
    StateFile,
    spec_from_dict,
    spec_to_dict,
)
from vsup.engine import AdoptRecord, Engine
from vsup.engine.restart import DETERMINISTIC  # exits that recur: not restarted when vanished
from vsup.layout.spec import InstanceSpec
from vsup.snapshot import (
    Advice,
    LastExit,
    NodeInfo,
    StatusSnapshot,
    SupervisorInfo,
    empty_instance,
)

log = logging.getLogger("vsup.daemon")

SECRET_KEY = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL", re.IGNORECASE)
# How often the daemon checks that its socket file is still the one it bound.
SOCKET_CHECK_S = 2.0
# A state file write the disk refused is retried this often.
STATE_RETRY_S = 1.0
# How long a restarted daemon waits for adopted instances' first health check before serving.
ADOPT_SETTLE_S = 5.0
# Engine events also written to daemon.log (all of them are in the journal), with these keys.
LOGGED_EVENTS = {
    "spawn": ("run", "pid"),
    "ready": ("run", "pid", "startup_s"),
    "exit": ("run", "pid", "code", "signal", "reason"),
    "adopt": ("adopted", "pid", "run", "why"),
    "failed": ("reason", "failures"),
    "stop_incomplete": ("message",),
    "stuck_gone": ("run", "pids"),
    "error": ("message",),
}


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
        engine_options: dict[str, Any] | None = None,
    ) -> None:
        self.home = Path(home)
        self.clock = clock or SystemClock()
        self.poll_interval = poll_interval
        self.started_mono = self.clock.monotonic()
        self.state_file = StateFile(paths.state_path(self.home))
        self.journal = Journal(paths.journal_path(self.home), clock_wall=self.clock.wall)
        self.logs_dir = paths.logs_dir(self.home)
        self.monitor = Monitor(self.clock, poll_interval, probe=gpu_probe)
        self.layout_path: str | None = None
        self.layout_toml: str | None = None
        self.layout_name: str | None = None
        self.metrics_listen: str | None = None
        self.problems: list[Advice] = []
        self.state_write_error: str | None = None
        self.node = NodeInfo(
            hostname=socket.gethostname(), gpu_vendor="none", gpu_count=0, cpu_count=os.cpu_count()
        )
        self.poll_count = 0
        self._failures: dict[str, deque[float]] = {}
        self._snapshot: StatusSnapshot | None = None
        self._stopping = asyncio.Event()
        self._shutting_down = False
        self._state_dirty = asyncio.Event()
        self._apply_lock = asyncio.Lock()
        self._api: ServedApp | None = None
        self._socket_id: tuple[int, int] | None = None
        self._tasks: set[asyncio.Task] = set()
        self.metrics = MetricsListener(lambda: self._snapshot)
        self.engine = Engine(
            self.clock,
            self.logs_dir,
            on_event=self._on_event,
            gpu_release_check=self.monitor.gpu_released,
            requests_running=self._requests_running,
            **(engine_options or {}),
        )

    # ----------------------------------------------------------------- engine events

    def _on_event(self, event: dict[str, Any]) -> None:
        """Engine events: journal them, keep the state file current, count failures."""
        doc = dict(event)
        kind = doc.pop("kind", "event")
        name = doc.pop("instance", None)
        if kind == "action" and name is None and doc.get("action") == "apply":
            return  # journaled by apply() itself, with the layout's name and path
        doc.pop("t", None)
        inst = self.engine.instances.get(name) if name else None
        if kind == "spawn" and inst is not None:
            # What journal replay needs to adopt this process if the state file is lost.
            doc.update(port=inst.spec.port, restarts=inst.restarts, spec=spec_to_dict(inst.spec))
        if kind == "exit" and name and doc.get("reason") not in ("stopped", None):
            self._failures.setdefault(name, deque(maxlen=64)).append(self.clock.monotonic())
        self.journal.append(kind, name, **doc)
        if kind in LOGGED_EVENTS:
            keys = [k for k in LOGGED_EVENTS[kind] if doc.get(k) is not None]
            log.info("%s %s %s", name or "-", kind, " ".join(f"{k}={doc[k]}" for k in keys))
        if kind not in ("action",):
            self._state_dirty.set()

    def _requests_running(self, name: str) -> float | None:
        metrics = self.monitor.metrics(name)
        return metrics.requests_running if metrics is not None else None

    # ----------------------------------------------------------------- lifecycle

    async def serve(self, sock: socket.socket | None = None, handle_signals: bool = True) -> None:
        """Run until asked to stop: restore, serve the API, poll, then shut down."""
        loop = asyncio.get_running_loop()
        if handle_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.request_stop, f"signal {sig.name}")
        if sock is None:
            sock = bind_unix_socket(paths.socket_path(self.home))
        self.journal.append("daemon_start", None, pid=os.getpid(), version=__version__)
        await self.monitor.open()
        self.node = NodeInfo(
            hostname=self.node.hostname,
            gpu_vendor=self.monitor.vendor,
            gpu_count=self.monitor.gpu_count,
            cpu_count=self.node.cpu_count,
        )
        await self.restore()
        self._api = ServedApp(build_app(self), sock, name="control API")
        self._socket_id = _file_id(paths.socket_path(self.home))
        await self._api.start()
        log.info("vsup daemon %s (pid %d) serving %s", __version__, os.getpid(), sock.getsockname())
        poller = self._spawn(self._poll_loop(), "poll")
        writer = self._spawn(self._state_writer(), "state writer")
        watcher = self._spawn(self._socket_watch(), "socket watch")
        try:
            await self._stopping.wait()
        finally:
            watcher.cancel()
            await self._api.stop()
            await self.metrics.stop()
            poller.cancel()
            writer.cancel()
            for t in (poller, writer):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t
            # Write the state before the engine lets go of its processes: the next daemon
            # adopts from it.
            self._write_state()
            with contextlib.suppress(Exception):
                await self.engine.shutdown(stop_instances=False)
            await self.monitor.close()
            left = [n for n, i in self.engine.instances.items() if i.pid]
            self.journal.append("daemon_stop", None, pid=os.getpid(), left_running=left)
            self.journal.close()
            sock_path = paths.socket_path(self.home)
            if _file_id(sock_path) == self._socket_id:  # ours, not a successor's
                with contextlib.suppress(OSError):
                    sock_path.unlink()

    async def _socket_watch(self) -> None:
        """Bind the control socket again when its file is gone or replaced (`rm vsup.sock`, a
        cleaner of /tmp): a live daemon nobody can reach is worse than none. Checked every
        SOCKET_CHECK_S by comparing the file's inode with the one bound."""
        path = paths.socket_path(self.home)
        while True:
            await asyncio.sleep(SOCKET_CHECK_S)
            now = _file_id(path)
            if now == self._socket_id or self._stopping.is_set():
                continue
            what = "gone" if now is None else "replaced"
            try:
                sock = bind_unix_socket(path)
            except OSError as exc:
                self._report_problem(
                    "control_socket",
                    f"the control socket {path} is {what} and cannot be bound again ({exc}); "
                    f"remove what is in its place (clients cannot reach this daemon meanwhile)",
                )
                continue
            api = ServedApp(build_app(self), sock, name="control API")
            await api.start()
            old, self._api = self._api, api
            self._socket_id = _file_id(path)
            self.problems = [p for p in self.problems if p.kind != "control_socket"]
            log.warning("the control socket %s was %s; bound it again", path, what)
            self.journal.append("socket_rebound", None, path=str(path), was=what)
            # Answers in flight on the old socket finish; then it closes.
            self._spawn(old.stop(), "old control API")

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
        self._replay_journal(state)
        applied = last_layout(self.journal.iter_file())
        if applied is not None and (applied.seq >= state.journal_seq or not state.layout_toml):
            # Applied after the state was written, or the state files lost it.
            state.layout_toml, state.layout_path = applied.toml, applied.path
            state.layout_name = applied.name
            if result.problem:
                log.info("the running layout comes back from journal event %d", applied.seq)
        self.layout_path = state.layout_path
        self.layout_toml = state.layout_toml
        self.layout_name = state.layout_name
        if state.layout_toml:
            self.metrics_listen = _metrics_listen(state.layout_toml)
        for name, rec in state.instances.items():
            try:
                spec = spec_from_dict(rec.spec)
            except ValueError as exc:
                self._report_problem("state_file", f"instance {name}: {exc}")
                continue
            if rec.pid is not None and rec.create_time is not None and rec.pgid is not None:
                record = AdoptRecord(
                    pid=rec.pid,
                    create_time=rec.create_time,
                    pgid=rec.pgid,
                    port=rec.port or spec.port,
                    run=rec.run,
                    restarts=rec.restarts,
                    descendants={int(p): t for p, t in rec.descendants.items()},
                )
                inst = self.engine.adopt(spec, record)
                if inst is not None:
                    log.info("re-adopted %s (pid %s, run %s)", name, rec.pid, rec.run)
                    continue
                # It died while no daemon watched: an exit like any other.
                gone = self.engine.instances[name]
                reason = gone.last_exit.reason if gone.last_exit else "unknown"
                self._failures.setdefault(name, deque(maxlen=64)).append(self.clock.monotonic())
                log.warning("%s: pid %s vanished while no daemon ran (%s)", name, rec.pid, reason)
                if spec.restart.policy != "never" and reason not in DETERMINISTIC:
                    await self.engine.start(name, automatic=True)
                continue
            self._register_idle(spec, rec)
        await self._settle_adopted()
        if self.metrics_listen:
            await self._start_metrics()
        self._state_dirty.set()

    async def _settle_adopted(self) -> None:
        """Give adopted instances one health check before the API answers, so that the first
        status after a daemon restart says `ready` for servers that are (bounded wait)."""
        adopted = [n for n, i in self.engine.instances.items() if getattr(i, "adopted", False)]
        if not adopted:
            return
        settled = ("ready", "unhealthy", "backoff", "failed", "stopped")
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(
                asyncio.gather(*(self.engine.wait(n, settled) for n in adopted)),
                ADOPT_SETTLE_S,
            )

    def _replay_journal(self, state: DaemonState) -> None:
        """Bring `state` up to date with journal events written after it (a daemon killed
        between an event and the next state write, or a state file restored from its backup)."""
        after = state.journal_seq - 1 if state.journal_seq else 0
        if state.written_at is None and state.instances:
            after = 0
        for name, rep in replay(self.journal.iter_file(), after_seq=after).items():
            rec = state.instances.get(name)
            if rec is None:
                if rep.spec is None:
                    continue
                rec = state.instances[name] = InstanceRecord(name=name, spec=rep.spec)
            if rep.spec is not None:
                rec.spec = rep.spec
            if rep.running and rep.pid:
                rec.pid, rec.pgid, rec.create_time = rep.pid, rep.pgid, rep.create_time
                rec.port = rep.port or rec.port
                rec.run = max(rec.run, rep.run)
                rec.descendants = {}
                rec.state = "starting"
            elif not rep.running and rep.last_exit is not None:
                rec.pid = rec.pgid = rec.create_time = None
                rec.last_exit = rep.last_exit
                rec.state = "stopped"
            rec.restarts = max(rec.restarts, rep.restarts)

    def _register_idle(self, spec: InstanceSpec, rec: InstanceRecord) -> None:
        """An instance with no process (stopped or failed): known again, not started, with
        its run number, restarts and last exit as they were."""
        self.engine.restore(
            spec,
            state="failed" if rec.state == "failed" else "stopped",
            run=rec.run,
            restarts=rec.restarts,
            last_exit=_last_exit(rec.last_exit),
            failed_why=rec.failed_why,
        )

    def _report_problem(self, kind: str, message: str) -> None:
        """A daemon-level problem: daemon.log, the journal, and advice in every snapshot."""
        log.warning("%s", message)
        self.journal.append("problem", None, problem=kind, message=message)
        self.problems = [p for p in self.problems if p.message != message]
        self.problems.append(problem(kind, message))

    # ----------------------------------------------------------------- state file

    def state_document(self) -> DaemonState:
        """The state file's content, from the engine's instances."""
        instances = {}
        for name, inst in self.engine.instances.items():
            rec = inst.adopt_record()
            instances[name] = InstanceRecord(
                name=name,
                spec=spec_to_dict(inst.spec),
                state=inst.state,
                pid=rec.pid if rec else None,
                create_time=rec.create_time if rec else None,
                pgid=rec.pgid if rec else None,
                port=inst.spec.port,
                run=inst.run,
                restarts=inst.restarts,
                last_exit=asdict(inst.last_exit) if inst.last_exit else None,
                descendants={str(p): t for p, t in rec.descendants.items()} if rec else {},
                adopted=bool(getattr(inst, "adopted", False)),
                failed_why=inst.failed_why,
            )
        return DaemonState(
            layout_path=self.layout_path,
            layout_toml=self.layout_toml,
            layout_name=self.layout_name,
            instances=instances,
            daemon_pid=os.getpid(),
            journal_seq=self.journal.next_seq,
        )

    def _write_state(self, doc: DaemonState | None = None) -> bool:
        """Write the state file; False (and `state_write_error` set) when the disk refused."""
        try:
            self.state_file.save(doc or self.state_document())
        except OSError as exc:
            why = f"cannot write {self.state_file.path}: {exc.strerror or exc}"
            if why != self.state_write_error:
                log.error("%s", why)
            self.state_write_error = why
            return False
        self.state_write_error = None
        return True

    def _check_writes(self) -> None:
        """Retry the journal's pending events; keep the write alerts in step with the disk.

        Supervision never waits on these writes: a failure is an alert (advice in status and
        the dashboard) and a retry, each poll, until the disk takes them again."""
        self.journal.flush_pending()
        for kind, error, what in (
            ("journal_write", self.journal.write_error, "events are kept in memory"),
            ("state_write", self.state_write_error, "the last good state file stays"),
        ):
            if error is None:
                if any(p.kind == kind for p in self.problems):
                    log.info("%s works again", kind.replace("_", " "))
                    self.problems = [p for p in self.problems if p.kind != kind]
                continue
            message = (
                f"{error}; {what} and the write is retried each second - free space in "
                f"{self.home} (instances are supervised meanwhile)"
            )
            if not any(p.kind == kind and p.message == message for p in self.problems):
                self.problems = [p for p in self.problems if p.kind != kind]
                self.problems.append(problem(kind, message, severity="error"))

    async def flush_state(self) -> None:
        """Write the state file now (it is otherwise written shortly after each change)."""
        doc = self.state_document()
        await asyncio.to_thread(self._write_state, doc)

    async def _state_writer(self) -> None:
        """Write the state file whenever something changed, at most 10 times a second; a
        write the disk refused is retried each second until it goes through."""
        while True:
            await self._state_dirty.wait()
            self._state_dirty.clear()
            doc = self.state_document()  # read on the loop; written in a thread
            if not await asyncio.to_thread(self._write_state, doc):
                self._check_writes()
                await asyncio.sleep(STATE_RETRY_S)
                self._state_dirty.set()
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

    def _targets(self) -> list[Target]:
        out = []
        for name, inst in self.engine.instances.items():
            out.append(
                Target(
                    name=name,
                    base_url=inst.spec.base_url,
                    run=inst.run,
                    pid=inst.pid,
                    pgid=inst.pgid,
                    gpus=tuple(inst.spec.gpus),
                    live=inst.state in ("ready", "unhealthy") and inst.pid is not None,
                    log_path=inst.log_path() if inst.run else None,
                    attention_flag=inst.spec.arg("attention-backend"),
                )
            )
        return out

    async def poll_once(self) -> StatusSnapshot:
        """One poll: telemetry of every instance, GPUs, then a snapshot with advice."""
        self._check_writes()
        await self.monitor.poll(self._targets())
        self.poll_count += 1
        return self.build_snapshot()

    # ----------------------------------------------------------------- snapshot

    def build_snapshot(self) -> StatusSnapshot:
        """The current snapshot: the engine's states now, telemetry as of the last poll."""
        now_m = self.clock.monotonic()
        gpus = self.monitor.gpus
        gpu_total = {g.index: g.hbm_total_bytes for g in gpus}
        instances = []
        for name, inst in self.engine.instances.items():
            spec = inst.spec
            live = inst.state in ("ready", "unhealthy") and inst.pid is not None
            planned = None
            if spec.gpu_memory_utilization is not None and spec.gpus:
                totals = [gpu_total.get(g) for g in spec.gpus]
                if all(t is not None for t in totals):
                    planned = int(spec.gpu_memory_utilization * sum(totals))
            fields = {
                **inst.status_fields(),
                **self.monitor.fields(name, live),
                "planned_hbm_bytes": planned,
                "waiting_for": inst.waiting_for,
            }
            if inst.pid is None:
                fields["hbm_bytes"] = None  # the figure of a process that is gone
            instances.append(empty_instance(**fields))
        window_start = now_m - CRASH_WINDOW_S
        inputs = AdviceInputs(
            recent_failures={
                n: sum(1 for t in ts if t >= window_start) for n, ts in self._failures.items()
            },
            problems=tuple(self.problems),
            kv_peak={i.name: self.monitor.kv_peak(i.name, KV_PEAK_WINDOW_S) for i in instances},
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
            gpus=gpus,
            instances=tuple(instances),
            advice=compute_advice(instances, gpus, inputs),
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
        layout_obj, specs, diags = await asyncio.to_thread(
            parse_layout, toml, path, self.node.gpu_count
        )
        errors = [d.to_json() for d in diags if d.is_error]
        warnings = [d.to_json() for d in diags if not d.is_error]
        if errors:
            return _refused(errors, warnings)
        plan = self.engine.diff(specs).to_json()
        if dry_run:
            return {"plan": plan, "errors": [], "warnings": warnings, "applied": False}
        self.layout_toml, self.layout_path = toml, path
        self.layout_name = layout_obj.name
        # The layout's text rides with the event: a daemon that finds both state files bad
        # takes the running layout back from the journal (`last_layout`).
        self.journal.append(
            "action",
            None,
            action="apply",
            layout=self.layout_name,
            path=path,
            plan=plan,
            toml=toml,
        )
        self._state_dirty.set()
        self.metrics_listen = _metrics_listen(toml)
        if self.metrics_listen:
            if not await self._start_metrics():
                warnings.append(
                    {
                        "severity": "warning",
                        "message": self.problems[-1].message,
                        "text": self.problems[-1].message,
                    }
                )
        else:
            await self.metrics.stop()
        async with self._apply_lock:
            # Returns once every start is under way (stops of removed instances continue).
            plan = (await self.engine.apply(specs)).to_json()
        self._state_dirty.set()
        return {"plan": plan, "errors": [], "warnings": warnings, "applied": True}

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
        self.journal.append("action", None, action=action, names=names, by="operator")

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
        if previous:
            path = inst.previous_log_path
            run = inst.run - 1 if path is not None else None
        else:
            run = inst.run or None
            path = inst.log_path() if run else None
        if path is not None and not Path(path).exists():
            path = None
        return LogFile(run=run, path=Path(path) if path else None)

    def config(self, name: str) -> dict[str, Any]:
        inst = self._instance(name)
        spec = inst.spec
        env = spec.child_env({})
        if spec.api_key_env:
            where = "" if os.environ.get(spec.api_key_env) else ", which is not set"
            env["VLLM_API_KEY"] = f"*** (from ${spec.api_key_env}{where})"
        masked = {
            k: ("***" if SECRET_KEY.search(k) and not v.startswith("***") else v)
            for k, v in env.items()
        }
        cache = self.monitor.cache_config(name)
        return {
            "argv": spec.argv(),
            "env": masked,
            "cache_config": dict(cache) if cache else None,
            "spec": spec_to_dict(spec),
        }

    def history(self, name: str) -> dict[str, Any]:
        self._instance(name)
        return self.monitor.history_json(name)

    def events(self, since: int, limit: int) -> dict[str, Any]:
        events, nxt = self.journal.read(since, limit)
        return {"events": events, "next": nxt}

    async def save(self, path: str, parents: bool = False) -> dict[str, Any]:
        if not self.layout_toml:
            raise ControlError("no layout is running; `vsup up LAYOUT` first", status=409)
        from vsup.fsutil import UnsafeTarget, regular_target
        from vsup.layout import LayoutError, loads_layout, save_layout

        try:
            target = regular_target(path, parents=parents)
        except UnsafeTarget as exc:
            raise ControlError(f"not saved: {exc}", status=400) from None
        layout_obj = loads_layout(self.layout_toml, self.layout_path)
        try:
            if parents:
                target.parent.mkdir(parents=True, exist_ok=True)
            await asyncio.to_thread(
                save_layout, layout_obj, target, node_gpus=self.node.gpu_count or None
            )
        except LayoutError as exc:
            raise ControlError(
                f"the running layout does not validate; nothing was written to {path}",
                status=422,
                body={"errors": [d.to_json() for d in exc.diagnostics if d.is_error]},
            ) from None
        except OSError as exc:
            raise ControlError(
                f"cannot write {target}: {exc.strerror or exc}", status=400
            ) from None
        self.journal.append("action", None, action="save", path=path, written=str(target))
        return {"path": path, "written": str(target)}

    async def shutdown(self, stop_instances: bool) -> dict[str, Any]:
        if self._shutting_down:
            return {"stopping": [], "already": True}
        self._shutting_down = True
        names = [n for n, i in self.engine.instances.items() if i.state != "stopped"]
        if not stop_instances:
            names = []
        self.journal.append("action", None, action="shutdown", stop_instances=stop_instances)
        self._spawn(self._shutdown(stop_instances), "shutdown")
        return {"stopping": names}

    async def _shutdown(self, stop_instances: bool) -> None:
        try:
            if stop_instances:
                async with self._apply_lock:
                    await asyncio.gather(
                        *(self.engine.stop(n) for n in list(self.engine.instances)),
                        return_exceptions=True,
                    )
                self._state_dirty.set()
        finally:
            self._stopping.set()


# --------------------------------------------------------------------------- helpers


def parse_layout(toml: str, path: str | None, node_gpus: int) -> tuple[Any, list, list]:
    """(layout, specs, diagnostics) of a layout text; specs is [] when it has errors."""
    from vsup.layout import LayoutError, loads_layout, validate

    layout_obj = loads_layout(toml, path)
    diags = list(validate(layout_obj, node_gpus=node_gpus or None))
    listen = layout_obj.header.get("metrics_listen")
    if listen is not None and not any(d.is_error for d in diags):
        try:
            parse_listen(str(listen))
        except ValueError as exc:
            from vsup.layout.diagnostics import Diagnostic

            diags.insert(
                0, Diagnostic("error", str(exc), file=path, table="[layout]", key="metrics_listen")
            )
    if any(d.is_error for d in diags):
        return layout_obj, [], diags
    try:
        specs = layout_obj.resolve()
    except LayoutError as exc:
        return layout_obj, [], list(exc.diagnostics)
    return layout_obj, specs, diags


def layout_diagnostics(path: Path | str) -> list:
    """Validation of a layout file on this node (what `vsup up` checks before applying)."""
    from vsup.layout.validate import validate_file

    _layout, diags = validate_file(str(path))
    return list(diags)


def _metrics_listen(toml: str) -> str | None:
    import tomllib

    try:
        value = (tomllib.loads(toml).get("layout") or {}).get("metrics_listen")
    except tomllib.TOMLDecodeError:
        return None
    return str(value) if value else None


def _file_id(path: Path) -> tuple[int, int] | None:
    """(device, inode) of `path` itself (not a link's target), or None when it is missing."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _last_exit(value: Any) -> LastExit | None:
    if not isinstance(value, dict):
        return None
    return LastExit(
        code=value.get("code"),
        signal=value.get("signal"),
        reason=value.get("reason") or "unknown",
        at=value.get("at") or "",
        log_excerpt=value.get("log_excerpt"),
    )


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
    # One line per /health check would bury what matters in daemon.log.
    for noisy in ("httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    from vsup.control.client import check_socket_path

    check_socket_path(paths.socket_path(home))
    lock_fd = acquire_lock(home)
    if lock_fd is None:
        holder = daemon_lock_holder(home)
        print(f"vsup daemon: another daemon (pid {holder}) serves {home}", file=sys.stderr)
        return 0
    # An SSH hang-up must never stop the daemon (it is in its own session; this is belt
    # and braces for `vsup daemon` run by hand in a terminal).
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    # The lock fd stays open until the process ends: whoever sees the lock free knows that
    # this daemon is gone, not merely finishing up.
    sock = bind_unix_socket(paths.socket_path(home))
    asyncio.run(Daemon(home, poll_interval=poll_interval).serve(sock))
    return 0
