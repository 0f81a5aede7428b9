"""The vsup daemon: one per VSUP_HOME, owner of every instance process.

This module is the daemon's life: start, the engine's events, the state file, polling and
snapshots, the socket watch, signals. Its parts: the lock (lock.py), liveness checks for
clients (liveness.py), restore and adoption (restore.py), the API methods (service.py).

It hosts the engine (state machines, processes) and the telemetry monitor (scraper, log
watchers, GPU probe), polls each instance at 1 Hz, builds a `StatusSnapshot` with live advice
and history each poll that something reads (else at the next status request), keeps the
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
import dataclasses
import logging
import os
import signal
import socket
import sys
import threading
from collections import deque
from collections.abc import Coroutine, Iterable, Mapping
from dataclasses import asdict
from dataclasses import fields as dataclass_fields
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
from vsup.control.alerts import Alerts
from vsup.control.api import build_app
from vsup.control.benchprogress import BenchProgressBoard
from vsup.control.dpstatus import parallel_fields
from vsup.control.export import MetricsListener
from vsup.control.journal import Journal
from vsup.control.lock import acquire_lock, daemon_lock_holder
from vsup.control.monitor import Monitor, Target
from vsup.control.pulls import Pulls
from vsup.control.restore import restore
from vsup.control.server import ServedApp, bind_unix_socket
from vsup.control.service import DaemonService
from vsup.control.stalls import StallActions
from vsup.control.state import (
    DaemonState,
    InstanceRecord,
    StateFile,
    spec_to_dict,
)
from vsup.engine import Engine, EngineSettings, Instance
from vsup.engine.intent import Run
from vsup.engine.sleep import SleepRefused
from vsup.journalevents import (
    ActionEvent,
    DaemonStartEvent,
    DaemonStopEvent,
    ExitEvent,
    JournalEvent,
    ProblemEvent,
    SocketReboundEvent,
    SpawnEvent,
)
from vsup.layout.compiled import CompiledLayout
from vsup.layout.listen import format_listen
from vsup.layout.node import NodeFacts
from vsup.layout.spec import InstanceSpec
from vsup.snapshot import (
    Advice,
    GpuStatus,
    InstanceStatus,
    NodeInfo,
    RolloutStatus,
    RouterStatus,
    SleepStatus,
    StatusSnapshot,
    SupervisorInfo,
    empty_instance,
)
from vsup.states import SERVING, ExitReason, RolloutState, SleepState, State
from vsup.telemetry.gpu import node_facts
from vsup.telemetry.hbm import InstanceRef

log = logging.getLogger("vsup.daemon")

# How often the daemon checks that its socket file is still the one it bound.
SOCKET_CHECK_S = 2.0
# A state file write the disk refused is retried this often.
STATE_RETRY_S = 1.0
# Engine events also written to daemon.log (all of them are in the journal), with these keys.
LOGGED_EVENTS = {
    "spawn": ("run", "pid"),
    "ready": ("run", "pid", "startup_s"),
    "exit": ("run", "pid", "code", "signal", "reason"),
    "adopt": ("adopted", "pid", "run", "why"),
    "failed": ("reason", "failures"),
    "stop_incomplete": ("message",),
    "stuck_gone": ("run", "pids"),
    "stall_restart": ("run", "pid", "why"),
    "sleep": ("level", "took_s", "why", "error"),
    "wake": ("took_s", "why"),
    "sleep_failed": ("why", "error"),
    "wake_failed": ("why", "error"),
    "error": ("message",),
}


def planned_hbm(spec: InstanceSpec, gpu_total: Mapping[int, int | None]) -> int | None:
    """gpu_memory_utilization x the memory of the instance's GPUs; None when either is
    unknown."""
    if spec.gpu_memory_utilization is None or not spec.gpus:
        return None
    totals = [gpu_total.get(g) for g in spec.gpus]
    if not all(t is not None for t in totals):
        return None
    return int(spec.gpu_memory_utilization * sum(t for t in totals if t is not None))


# --------------------------------------------------------------------------- the daemon


class Daemon:
    """The daemon's state and life. Its restore (restore.py) and the `ControlService` the API
    calls (service.py, `self.service`) use it through `host.DaemonHost`."""

    def __init__(
        self,
        home: Path,
        *,
        clock: Clock | None = None,
        poll_interval: float = 1.0,
        gpu_probe: Any = None,
        engine_settings: EngineSettings | None = None,
    ) -> None:
        self.home = Path(home)
        self.clock = clock or SystemClock()
        self.poll_interval = poll_interval
        self.started_mono = self.clock.monotonic()
        self.state_file = StateFile(paths.state_path(self.home))
        self.journal = Journal(paths.journal_path(self.home), clock_wall=self.clock.wall)
        self.logs_dir = paths.logs_dir(self.home)
        self.monitor = Monitor(self.clock, poll_interval, probe=gpu_probe)
        self.bench = BenchProgressBoard(
            self.clock, home=self.home, running_layout=lambda: self.layout_toml
        )
        self._init_layout()
        self.node = NodeInfo(
            hostname=socket.gethostname(), gpu_vendor="none", gpu_count=0, cpu_count=os.cpu_count()
        )
        self.node_facts = NodeFacts()  # what layouts are validated against: the GPU probe's
        self._init_bookkeeping()
        self._init_parts(engine_settings)

    def _init_layout(self) -> None:
        """The running layout: none until restore or the first apply."""
        self.layout_path: str | None = None
        self.layout_toml: str | None = None
        self.layout_name: str | None = None
        # the running layout compiled (None before the first apply, or when the one restored
        # from the state file no longer compiles: then layout_toml still says what it was)
        self.layout: CompiledLayout | None = None
        self.metrics_listen: tuple[str, int] | None = None
        # the running layout's specs by name: what each instance should run (`outdated`)
        self.layout_specs: Mapping[str, InstanceSpec] | None = None
        self.problems: list[Advice] = []

    def _init_bookkeeping(self) -> None:
        """The state file's and the snapshot's bookkeeping, failures, stop events, tasks."""
        self.state_write_error: str | None = None
        # state documents in the order they were made; the last one written (_write_state)
        self._state_lock = threading.Lock()
        self._state_made = self._state_written = 0
        self._failures: dict[str, deque[float]] = {}
        # The latest snapshot: built by each poll, and again for a status request only when
        # something changed since (`_snapshot_dirty`: an engine event, an apply, a problem).
        self._snapshot: StatusSnapshot | None = None
        self._snapshot_dirty = True
        # each instance's last Target and what it was made of (`_targets`)
        self._target_memo: dict[str, tuple[tuple[object, ...], Target]] = {}
        self._bench_seen = 0  # the bench board's version the snapshot shows
        self._stopping = asyncio.Event()
        self.shutting_down = False
        self._state_dirty = asyncio.Event()
        self.apply_lock = asyncio.Lock()
        self._api: ServedApp | None = None
        self._socket_id: tuple[int, int] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    def _init_parts(self, engine_settings: EngineSettings | None) -> None:
        """The parts the daemon hosts, wired to it: metrics, alerts, the engine, the API's
        service, pulls, stall actions."""
        # Prometheus reads the poll's snapshot, never building one (export.py caches it)
        self.metrics = MetricsListener(lambda: self._snapshot)
        self.alerts = Alerts(
            self.clock, self.node.hostname, state_path=paths.alerts_state_path(self.home)
        )
        self.engine = Engine(
            self.clock,
            self.logs_dir,
            on_event=self._on_event,
            settings=engine_settings,
            gpu_release_check=self.monitor.gpu_released,
            requests_running=self._requests_running,
            gpu_memory=self.monitor.gpu_memory,
        )
        self.service = DaemonService(self)
        # hub models pulled before their instances start (control/pulls.py)
        self.pulls = Pulls(self.home, self.clock, self.journal.append, self.spawn)
        self.stalls = StallActions(self.journal.append, self.engine)
        # a ready instance the latest snapshot flags `stalled`, or one that is not awake (sleep
        # mode: vLLM holds a request sent to a sleeper), gets no request from the router
        self.engine.router.exclude = self._excluded
        self.engine.sleeper.weights_of = self._weights_of
        self.engine.sleeper.engine_requests = self._engine_requests
        self.engine.sleeper.gpu_held_now = self._gpu_held_now
        self.engine.sleeper.gpu_memory_now = self.monitor.gpu_memory_now
        # a scrape asks /health with /metrics: the engine's check of that second
        self.monitor.on_health = self.engine.health_answered
        # an instance at rest is scraped every rest_interval_s: its health loop is told
        self.monitor.on_rest = self.engine.health_resting

    # ----------------------------------------------------------------- engine events

    def _on_event(self, event: JournalEvent) -> None:
        """Engine events: journal them, keep the state file current, count failures."""
        self._snapshot_dirty = True
        name = event.instance
        if isinstance(event, ActionEvent) and name is None and event.action == "apply":
            return  # journaled by apply() itself, with the layout's name and path
        inst = self.engine.instances.get(name) if name else None
        if isinstance(event, SpawnEvent) and inst is not None:
            # What journal replay needs to adopt this process if the state file is lost.
            spec = spec_to_dict(inst.spec)
            event = dataclasses.replace(
                event, port=inst.spec.port, restarts=inst.restarts, spec=spec
            )
        if isinstance(event, ExitEvent) and name and event.reason not in (ExitReason.STOPPED, None):
            self.note_failure(name)
        self.journal.append(event)
        kind = event.kind
        if kind in LOGGED_EVENTS:
            doc = event.fields()
            keys = [k for k in LOGGED_EVENTS[kind] if doc.get(k) is not None]
            log.info("%s %s %s", name or "-", kind, " ".join(f"{k}={doc[k]}" for k in keys))
        if not isinstance(event, ActionEvent):
            self._state_dirty.set()

    def _weights_of(self, name: str) -> int | None:
        """The weights vLLM loaded for the instance (its start-up log), for a level-1 sleep."""
        inst = self._snapshot.instance(name) if self._snapshot is not None else None
        return inst.memory.vllm_weights_bytes if inst is not None else None

    def _excluded(self, name: str) -> bool:
        return self.engine.sleeper.excluded(name) or self._stalled(name)

    def _stalled(self, name: str) -> bool:
        """Whether stall detection flags the instance in the latest snapshot (False when it
        is not known: an instance is no less a worker for lack of a figure)."""
        inst = self._snapshot.instance(name) if self._snapshot is not None else None
        return inst is not None and inst.active_stall is not None

    async def _requests_running(self, name: str) -> float | None:
        """Requests an instance runs or queues, read fresh for a drain (the last poll's figure
        may predate requests the router sent just before it removed the instance)."""
        inst = self.engine.instances.get(name)
        scraper = self.monitor.scraper
        if inst is not None and scraper is not None:
            # with load tracking, /load also counts requests the engine has not taken yet
            result = await scraper.scrape(inst.spec.base_url, with_load=inst.spec.load_tracking)
            m = result.metrics if result.ok else None
            if m is not None and m.requests_running is not None:
                engine = m.requests_running + (m.requests_waiting or 0)
                return max(engine, float(result.server_load or 0))
        metrics = self.monitor.metrics(name)
        return metrics.requests_running if metrics is not None else None

    async def _engine_requests(self, name: str) -> float | None:
        """The engine's running + waiting alone, read fresh (vLLM's gauges, not /load)."""
        inst = self.engine.instances.get(name)
        scraper = self.monitor.scraper
        if inst is None or scraper is None:
            return None
        result = await scraper.scrape(inst.spec.base_url, with_load=False)
        m = result.metrics if result.ok else None
        if m is None or m.requests_running is None:
            return None
        return m.requests_running + (m.requests_waiting or 0)

    async def _gpu_held_now(self, name: str) -> int | None:
        """What an instance holds on its GPUs, read from the driver now (a sleep's release)."""
        inst = self.engine.instances.get(name)
        if inst is None or inst.pid is None or not inst.spec.gpus:
            return None
        ref = InstanceRef(name, inst.pid, tuple(inst.spec.gpus), inst.pgid)
        return await self.monitor.hbm_now(ref)

    # ----------------------------------------------------------------- lifecycle

    async def serve(self, sock: socket.socket | None = None, handle_signals: bool = True) -> None:
        """Run until asked to stop: restore, serve the API, poll, then shut down."""
        if handle_signals:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.request_stop, f"signal {sig.name}")
        await self._start(sock)
        tasks = (
            self.spawn(self._poll_loop(), "poll"),
            self.spawn(self._state_writer(), "state writer"),
        )
        watcher = self.spawn(self._socket_watch(), "socket watch")
        try:
            await self._stopping.wait()
        finally:
            watcher.cancel()
            if self._api is not None:  # the one bound last (_socket_watch may bind again)
                await self._api.stop()
            await self._shut_down(tasks)

    async def _start(self, sock: socket.socket | None) -> None:
        """Open the GPU probe, learn the node, restore the instances, start the alerts and the
        control API (on `sock`, or the home's socket bound now)."""
        if sock is None:
            sock = bind_unix_socket(paths.socket_path(self.home))
        self.journal.append(DaemonStartEvent(pid=os.getpid(), version=__version__))
        await self.monitor.open()
        self.node = NodeInfo(
            hostname=self.node.hostname,
            gpu_vendor=self.monitor.vendor,
            gpu_count=self.monitor.gpu_count,
            cpu_count=self.node.cpu_count,
        )
        if self.monitor.gpu_count:
            self.node_facts = await asyncio.to_thread(node_facts, self.monitor.probe)
        await restore(self)
        await self.alerts.start()
        self._api = ServedApp(build_app(self.service), sock, name="control API")
        self._socket_id = _file_id(paths.socket_path(self.home))
        await self._api.start()
        log.info("vsup daemon %s (pid %d) serving %s", __version__, os.getpid(), sock.getsockname())

    async def _shut_down(self, tasks: tuple[asyncio.Task[Any], ...]) -> None:
        """After the API stopped: the metrics listener, alerts, the poll and state tasks and
        the pulls end; the state is written; the engine lets go of its processes (they keep
        running); the journal closes and our socket file goes."""
        await self.metrics.stop()
        await self.alerts.aclose()
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        await self.pulls.shutdown()
        # Write the state before the engine lets go of its processes: the next daemon
        # adopts from it.
        self._write_state()
        try:
            await self.engine.shutdown(stop_instances=False)
        except Exception:  # the daemon still exits; the next one re-adopts from the state
            log.exception("letting go of the instances failed")
        await self.monitor.close()
        left = [n for n, i in self.engine.instances.items() if i.pid]
        self.journal.append(DaemonStopEvent(pid=os.getpid(), left_running=left))
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
                self.report_problem(
                    "control_socket",
                    f"the control socket {path} is {what} and cannot be bound again ({exc}); "
                    f"remove what is in its place (clients cannot reach this daemon meanwhile)",
                )
                continue
            api = ServedApp(build_app(self.service), sock, name="control API")
            await api.start()
            old, self._api = self._api, api
            self._socket_id = _file_id(path)
            self.problems = [p for p in self.problems if p.kind != "control_socket"]
            log.warning("the control socket %s was %s; bound it again", path, what)
            self.journal.append(SocketReboundEvent(path=str(path), was=what))
            # Answers in flight on the old socket finish; then it closes.
            if old is not None:
                self.spawn(old.stop(), "old control API")

    def request_stop(self, why: str = "request") -> None:
        """Stop the daemon, leaving instances running (SIGTERM, SIGINT)."""
        log.info("stopping the daemon (%s); instances keep running", why)
        self._stopping.set()

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        """Run `coro` as a task the daemon keeps (its failure is logged)."""
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("task %s failed", task.get_name(), exc_info=task.exception())

    def report_problem(self, kind: str, message: str) -> None:
        """A daemon-level problem: daemon.log, the journal, and advice in every snapshot."""
        log.warning("%s", message)
        self.journal.append(ProblemEvent(problem=kind, message=message))
        self.problems = [p for p in self.problems if p.message != message]
        self.problems.append(problem(kind, message))
        self._snapshot_dirty = True

    def state_changed(self) -> None:
        """Something the state file holds changed: it is written shortly (`_state_writer`)."""
        self._state_dirty.set()
        self._snapshot_dirty = True

    def set_layout_specs(self, specs: Iterable[InstanceSpec] | None) -> None:
        """The running layout's specs (an apply, a restore): what each instance should run.
        Status compares them with what runs (`outdated`)."""
        self.layout_specs = None if specs is None else {s.name: s for s in specs}
        self._snapshot_dirty = True

    def note_failure(self, name: str) -> None:
        """A failed exit of `name`, counted towards crash-loop advice."""
        self._failures.setdefault(name, deque(maxlen=64)).append(self.clock.monotonic())

    async def start_metrics(self) -> bool:
        """Serve Prometheus metrics on `metrics_listen`; False (and a problem) when it
        cannot (a bad or busy address)."""
        if not self.metrics_listen:
            return False  # callers ask only when the layout names an address
        try:
            await self.metrics.start(self.metrics_listen)
            self.problems = [p for p in self.problems if p.kind != "metrics_listen"]
            return True
        except (OSError, ValueError) as exc:
            self.report_problem(
                "metrics_listen",
                f"cannot serve Prometheus metrics on {format_listen(self.metrics_listen)} ({exc}); "
                "change "
                "[layout] metrics_listen and run `vsup up` again",
            )
            return False

    async def shut_down(self, stop_instances: bool) -> None:
        """`vsup down` after its answer: stop every instance (unless told not to), then end
        the daemon."""
        try:
            await self.pulls.shutdown("vsup down")
            if stop_instances:
                async with self.apply_lock:
                    # the router first: it would send requests to instances on their way out
                    await self.engine.router.stop()
                    await asyncio.gather(
                        *(self.engine.stop(n) for n in list(self.engine.instances)),
                        return_exceptions=True,
                    )
                self._state_dirty.set()
        finally:
            self._stopping.set()

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
            router=self.engine.router.adopt_record(),
            rollout=self.engine.rollout.to_record() if self.engine.rollout is not None else None,
        )

    def _state_ticket(self) -> int:
        """The order of a state document made now: a write never replaces a newer one."""
        self._state_made += 1
        return self._state_made

    def _write_state(self, doc: DaemonState | None = None, ticket: int | None = None) -> bool:
        """Write the state file; False (and `state_write_error` set) when the disk refused.

        Writes run in threads, and a cancelled `to_thread` write still runs: the shutdown's
        last write must not be overwritten by an older document finishing after it, so writes
        are serialized and one made before the last written is dropped."""
        if doc is None:
            ticket, doc = self._state_ticket(), self.state_document()
        with self._state_lock:
            if ticket is not None and ticket < self._state_written:
                return True  # a newer state is on disk
            self._state_written = max(self._state_written, ticket or 0)
            return self._save_state(doc)

    def _save_state(self, doc: DaemonState) -> bool:
        try:
            self.state_file.save(doc)
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
        ticket, doc = self._state_ticket(), self.state_document()
        await asyncio.to_thread(self._write_state, doc, ticket)

    async def _state_writer(self) -> None:
        """Write the state file whenever something changed, at most 10 times a second; a
        write the disk refused is retried each second until it goes through."""
        while True:
            await self._state_dirty.wait()
            self._state_dirty.clear()
            ticket, doc = self._state_ticket(), self.state_document()  # read on the loop
            if not await asyncio.to_thread(self._write_state, doc, ticket):
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
        # a rolling apply or a bench (its progress reports) reads every figure as it comes
        rollout = self.engine.rollout
        quiet = not (rollout is not None and rollout.active) and not self.bench.running
        memo = self._target_memo
        if len(memo) > len(self.engine.instances):
            for gone in [n for n in memo if n not in self.engine.instances]:
                del memo[gone]
        for name, inst in self.engine.instances.items():
            spec = inst.spec
            # the canary's /v1 request needs the instance's API key, when it has one
            key = os.environ.get(spec.api_key_env) if spec.api_key_env else None
            awake = self.engine.sleeper.awake(name)
            rest_s = self._rest_s(name, inst) if quiet else 0.0
            # what a Target is made of; the same as the last poll's (nearly always): the
            # same Target, not one more built from the spec (docs/benchmarks.md, "2026-12-06, late")
            inputs = (inst, spec, inst.run, inst.pid, inst.pgid, inst.state, awake, rest_s, key)
            last = memo.get(name)
            if last is not None and last[0] == inputs:
                out.append(last[1])
                continue
            target = Target(
                name=name,
                base_url=spec.base_url,
                run=inst.run,
                pid=inst.pid,
                pgid=inst.pgid,
                gpus=tuple(inst.spec.gpus),
                # a span's follower has no server of its own: its base URL is its
                # head's, whose figures are the whole unit's (docs/fleet.md)
                live=inst.state in SERVING and inst.pid is not None and not spec.follower,
                log_path=inst.log_path() if inst.run else None,
                attention_flag=spec.arg("attention-backend"),
                # no canary to a sleeper: vLLM would hold it until it wakes
                ready=inst.state == State.READY and inst.pid is not None and awake,
                load_tracking=spec.load_tracking,
                canary_interval_s=spec.canary_interval_s,
                stall_after_s=spec.stall_after_s,
                dp_ranks=spec.data_parallel_size,
                canary_headers=(("Authorization", f"Bearer {key}"),) if key else (),
                rest_s=rest_s,
            )
            memo[name] = (inputs, target)
            out.append(target)
        return out

    def _rest_s(self, name: str, inst: Instance) -> float:
        """How often the instance may be scraped while its figures show it at rest
        (telemetry/rest.py): its `rest_interval_s`, or 0 (every poll) while anything about it
        is in transition - not ready, a stop, drain or restart asked for, a sleep, wake or
        reconciliation under way, a known stall - or it is a member of a span (the unit's
        health is read every second by its followers, and its head judges every rank)."""
        spec = inst.spec
        if (
            spec.rest_interval_s <= 0
            or inst.state != State.READY
            or inst.pid is None
            or spec.span is not None
            or not isinstance(inst.control.intent, Run)
            or not self.engine.sleeper.settled(name)
            or self.stalls.knows(name)
        ):
            return 0.0
        return spec.rest_interval_s

    async def poll_once(self) -> StatusSnapshot | None:
        """One poll: telemetry of every instance, GPUs, then a snapshot with advice (the one
        status requests get until something changes) when something reads it each poll
        (`_poll_reads_rows`); otherwise None, and the next status request builds one."""
        self._check_writes()
        await asyncio.gather(self.monitor.poll(self._targets()), self._poll_router())
        self._snapshot_dirty = True  # telemetry moved on
        if not self._poll_reads_rows():
            return None
        snap = self.build_snapshot()
        self.stalls.observe(snap.instances)
        self._idle_sleep(snap)
        self.alerts.observe(snap.advice)
        return snap

    def _poll_reads_rows(self) -> bool:
        """Whether this poll's snapshot has a reader besides status requests (which build
        one when asked, from the same telemetry): alerts, the Prometheus exporter, sleep
        mode's idle watch, stall detection with a stall to start, follow or end, or the
        router (its exclusion of stalled instances reads the latest snapshot). Nothing else
        reads it, so a daemon nobody asks builds none (~60 us an instance a poll:
        docs/benchmarks.md, 2026-12-06, later still)."""
        if self.alerts.config is not None or self.metrics.running or self.stalls.tracking:
            return True
        if self.engine.router.spec is not None:
            return True
        sleeper = self.engine.sleeper
        for name, inst in self.engine.instances.items():
            spec = inst.spec
            if spec.sleep is not None:
                return True
            ready = inst.state == State.READY and inst.pid is not None and sleeper.awake(name)
            view = self.monitor.stall_view(name, ready, spec.stall_after_s)
            if view is not None and view.stalled:
                return True  # as `_instance_status` judges it: the journal starts it now
        return False

    def _idle_sleep(self, snap: StatusSnapshot) -> None:
        """Sleep mode: each poll tells the sleeper what each server's metrics say of its sleep
        (a disagreement is checked with the server) and which instances had work; those idle
        for `after_idle_s` are put to sleep (in the background; journaled)."""
        sleeper = self.engine.sleeper
        for inst in snap.instances:
            if inst.sleep is None:
                continue
            if inst.lifecycle.state == State.READY:
                # what its server's metrics say of its sleep, against vsup's view
                sleeper.observe_server(inst.name, self.monitor.metrics(inst.name))
            busy = (
                (inst.telemetry.requests_in_flight or 0)
                + (inst.telemetry.requests_running or 0)
                + (inst.telemetry.requests_waiting or 0)
            )
            sleeper.observe(inst.name, busy > 0 or bool(inst.telemetry.generation_tokens_per_s))
        for name in sleeper.idle_due():
            after = self.engine.instances[name].spec.sleep
            why = f"idle for {after.after_idle_s:g} s (sleep.after_idle_s)" if after else "idle"
            self.spawn(self._sleep_quietly(name, why), f"idle sleep {name}")
        for name in sleeper.recycle_due():  # sleep.recycle_growth_gib
            self.spawn(sleeper.recycle(name), f"recycle {name}")

    async def _sleep_quietly(self, name: str, why: str) -> None:
        try:
            await self.engine.sleeper.sleep(name, why=why)
        except SleepRefused as exc:
            log.warning("%s: idle sleep: %s", name, exc)
        self.state_changed()

    async def _poll_router(self) -> None:
        """The router's figures and worker list (at most a poll interval: it never delays one)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.engine.router.poll(), self.poll_interval)

    # ----------------------------------------------------------------- snapshot

    def snapshot(self) -> StatusSnapshot:
        """The snapshot to serve: the latest one, rebuilt only when something changed since
        it was built (a poll, an engine event, an apply). A poll builds one only when
        something reads it each poll (`poll_once`); otherwise the first request after a poll
        does. 128 instances cost ~20 ms a build: eight dashboards polling each second would
        otherwise take a quarter of a core."""
        if self._snapshot is None or self._snapshot_dirty or self._bench_seen != self.bench.version:
            return self.build_snapshot()
        return self._snapshot

    def build_snapshot(self) -> StatusSnapshot:
        """The current snapshot: the engine's states now, telemetry as of the last poll."""
        self._snapshot_dirty = False
        self._bench_seen = self.bench.version
        now_m = self.clock.monotonic()
        gpus = self.monitor.gpus
        gpu_total = {g.index: g.hbm_total_bytes for g in gpus}
        instances = []
        outdated: set[str] = set()
        for name, inst in self.engine.instances.items():
            drift = self._drift(inst)
            if drift:
                outdated.add(name)
            instances.append(self._instance_status(inst, gpus, gpu_total, drift))
        router_status = self.engine.router.status_json(self.node.hostname)
        advice = compute_advice(
            instances, gpus, self._advice_inputs(instances, now_m, router_status)
        )
        rollout_status = None
        if self.engine.rollout is not None:
            rollout_status = self.engine.rollout.status(
                outdated if self.layout_specs is not None else None
            )
            advice = (*advice, *rollout_advice(rollout_status))
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
            advice=advice,
            router=router_status,
            bench=self.bench.status(),
            rollout=rollout_status,
            pulls=self.pulls.statuses(),
        )
        self._snapshot = snap
        return snap

    def _instance_status(
        self,
        inst: Instance,
        gpus: tuple[GpuStatus, ...],
        gpu_total: Mapping[int, int | None],
        drift: tuple[str, ...] | None,
    ) -> InstanceStatus:
        """One instance's row: the engine's fields, the monitor's telemetry and stall view,
        its plan, drift, ranks, pull and sleep."""
        name, spec = inst.name, inst.spec
        # a follower's server figures would be its head's, the unit's: none of its own
        live = inst.state in SERVING and inst.pid is not None and not spec.follower
        fields = {
            **inst.status_fields(),
            **self.monitor.fields(name, live),
            **self.monitor.stall_fields(
                name,
                # a sleeper holds requests by design: never stalled
                inst.state == State.READY
                and inst.pid is not None
                and self.engine.sleeper.awake(name),
                spec.stall_after_s,
            ),
            "planned_hbm_bytes": planned_hbm(spec, gpu_total),
            "waiting_for": inst.waiting_for,
            "outdated": None if drift is None else bool(drift),
            "outdated_fields": drift or (),
            **parallel_fields(inst, gpus),
            "pull": self.pulls.for_instance(name),
            "sleep": self.engine.sleeper.status(name),
        }
        if inst.pid is None:
            fields["hbm_bytes"] = None  # the figure of a process that is gone
        fields.update(_sleeper_rates(fields["sleep"]))
        return empty_instance(**fields)

    def _advice_inputs(
        self,
        instances: list[InstanceStatus],
        now_m: float,
        router_status: RouterStatus | None,
    ) -> AdviceInputs:
        """What live advice reads besides the instances and GPUs: recent failures, problems,
        KV peaks, the router's view."""
        window_start = now_m - CRASH_WINDOW_S
        return AdviceInputs(
            recent_failures={
                n: sum(1 for t in ts if t >= window_start) for n, ts in self._failures.items()
            },
            problems=(*self.problems, *self.bench.advice()),  # a bench that died mid-run
            kv_peak={i.name: self.monitor.kv_peak(i.name, KV_PEAK_WINDOW_S) for i in instances},
            foreign_workers=self.engine.router.foreign_recent(),
            removed_workers=self.engine.router.removed_recent(),
            router=router_status,
        )

    def _drift(self, inst: Instance) -> tuple[str, ...] | None:
        """The spec fields in which what `inst` runs (or would start with) differs from the
        running layout; None when there is no layout to compare with."""
        want = self.layout_specs.get(inst.name) if self.layout_specs is not None else None
        if want is None:
            return None
        have = inst.spec
        if want.model_path is None and have.model_path is not None:
            # the compiled layout names a hub model; its pull resolved it to a local snapshot
            have = dataclasses.replace(have, model_path=None)
        if have == want:
            return ()
        return tuple(
            f.name
            for f in dataclass_fields(InstanceSpec)
            if getattr(have, f.name) != getattr(want, f.name)
        )


# --------------------------------------------------------------------------- helpers


def rollout_advice(rollout: RolloutStatus) -> tuple[Advice, ...]:
    """`rollout_interrupted` (warning): a daemon ended in the middle of a rolling apply and
    instances still run their old spec, which `vsup up` of the layout restarts.
    `canary_rolled_back` (warning): the canary failed its gate and is back on the old spec;
    the layout's change is not applied (docs/canary.md)."""
    if rollout.state == RolloutState.ROLLED_BACK:
        return (
            Advice(
                "canary_rolled_back",
                "warning",
                f"{rollout.failure or 'the canary failed'} - the new spec is not applied; "
                "`vsup events` has the figures",
            ),
        )
    if rollout.state != RolloutState.INTERRUPTED or not rollout.old_config:
        return ()
    names = ", ".join(rollout.old_config)
    return (
        Advice(
            "rollout_interrupted",
            "warning",
            f"a rolling apply was interrupted at wave {rollout.wave}/{rollout.waves} (its "
            f"daemon ended); {names} still run(s) the old spec - `vsup up` of the layout "
            "finishes it",
        ),
    )


def _file_id(path: Path) -> tuple[int, int] | None:
    """(device, inode) of `path` itself (not a link's target), or None when it is missing."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


# --------------------------------------------------------------------------- entry point


def run_daemon(home: Path | None = None, poll_interval: float = 1.0) -> int:
    """`vsup daemon`: take the lock, serve until stopped. 0 also when another daemon runs."""
    # VSUP_HOME is as paths.vsup_home() made or found it: a directory vsup did not create (a
    # home directory, say) keeps its mode; what must be private in it is private by itself
    # (the socket 0600, state, journal and logs 0600/0700).
    home = Path(home) if home else paths.vsup_home()
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


# The rates a sleeper shows: its counters stand still while it sleeps, but a rate's window
# (telemetry/rates.py: 10 s for tokens, 60 s for preemptions) still holds its last awake
# seconds. Asleep it serves nothing (0); falling asleep, waking or not yet known: None.
_SLEEPER_RATES = ("generation_tokens_per_s", "prompt_tokens_per_s", "preemptions_per_min")


def _sleeper_rates(sleep: SleepStatus | None) -> dict[str, float | None]:
    if sleep is None or sleep.state == SleepState.AWAKE:
        return {}
    value = 0.0 if sleep.state == SleepState.ASLEEP else None
    return dict.fromkeys(_SLEEPER_RATES, value)
