"""An instance as the engine keeps it: its spec, Lifecycle, run logs, process and the
`Control` record through which the engine and the instance's runner talk, plus the
`AdoptRecord` a state file keeps to take a running process over. A leaf of the engine: it
imports neither the engine nor the runner."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vsup.clock import Clock
from vsup.engine.intent import IntentCell
from vsup.engine.lifecycle import Lifecycle
from vsup.engine.proc import RunningProcess
from vsup.engine.runlog import RunLogs
from vsup.layout.spec import InstanceSpec, SpanRole
from vsup.snapshot import LastExit, SpanNodeStatus, SpanStatus, WaitReason
from vsup.states import State


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


class Control(IntentCell):
    """What is wanted of an instance (its intent, intent.py: the engine moves it, the runner
    reads it and takes a pending restart) and the handles of the work on it. The only mutable
    state the engine and the runner share besides the Lifecycle."""

    def __init__(self) -> None:
        super().__init__()
        self.stale_sweep: asyncio.Task | None = None  # ending what an unwatched dead run left
        self.task: asyncio.Task | None = None  # the runner
        self.kick = asyncio.Event()  # wakes the runner


class Instance:
    """One supervised instance as the daemon sees it. Read its attributes; change it only
    through the Engine (`control`, `lifecycle` and `logs` are the engine's and its runner's
    handles)."""

    def __init__(
        self,
        spec: InstanceSpec,
        clock: Clock,
        logs: RunLogs,
        on_state: Callable[[Instance, State, State], None],
        deterministic_spawns: int = 1,
    ) -> None:
        self.spec = spec
        self.lifecycle = Lifecycle(
            spec,
            clock,
            on_change=lambda old, new: on_state(self, old, new),
            deterministic_spawns=deterministic_spawns,
        )
        self.logs = logs
        self.control = Control()
        self.process: RunningProcess | None = None
        self.adopted = False
        # what a start waits for now (a turn on its devices, GPU memory); set by its runner
        self.wait: WaitReason | None = None
        self.gpu_released: bool | None = None  # after the last exit, on GPUs with a check

    def set_spec(self, spec: InstanceSpec) -> None:
        """Take `spec` now (its live fields apply from the next decision)."""
        self.spec = spec
        self.control.drop_spec()
        self.lifecycle.configure(spec)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def waiting_for(self) -> str | None:
        """`wait`'s message, e.g. "b starting" while it waits for a turn on its device."""
        return self.wait.message if self.wait is not None else None

    def wait_reason(self) -> WaitReason | None:
        """What it waits for before its next start: the runner's `wait`, else the backoff."""
        if self.wait is not None:
            return self.wait
        left = self.backoff_remaining_s() if self.state == State.BACKOFF else None
        if left is None:
            return None
        why = self.last_exit.reason if self.last_exit is not None else None
        return WaitReason(
            kind="backoff",
            message=f"next start in {max(0.0, left):.0f}s" + (f" (after {why})" if why else ""),
            remaining_s=round(max(0.0, left), 1),
        )

    @property
    def state(self) -> State:
        return self.lifecycle.state

    @property
    def state_since(self) -> float:
        """Clock monotonic time of the last change of state."""
        return self.lifecycle.state_since

    @property
    def ready_since(self) -> float | None:
        return self.lifecycle.ready_since

    @property
    def started_at(self) -> float | None:
        """Clock monotonic time the current process was spawned."""
        return self.lifecycle.spawned_at

    @property
    def run(self) -> int:
        return self.lifecycle.run

    @property
    def restarts(self) -> int:
        return self.lifecycle.restarts

    @property
    def failures(self) -> int:
        return self.lifecycle.failures

    @property
    def last_exit(self) -> LastExit | None:
        return self.lifecycle.last_exit

    @property
    def failed_why(self) -> str | None:
        """Why the instance is `failed`; None in any other state."""
        return self.lifecycle.failed_why

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
        return self.control.task is not None

    def backoff_remaining_s(self) -> float | None:
        return self.lifecycle.backoff_remaining_s()

    def log_path(self, run: int | None = None) -> Path | None:
        """The log file of run `run` (default: the latest), or None before the first run."""
        run = self.run if run is None else run
        return self.logs.path(run) if run > 0 else None

    @property
    def previous_log_path(self) -> Path | None:
        """The log of the run before the latest, if it is still kept."""
        if self.run <= 1:
            return None
        path = self.logs.path(self.run - 1)
        return path if path.exists() else None

    def status_fields(self) -> dict[str, Any]:
        """The InstanceStatus fields the engine knows (snapshot.empty_instance(**these))."""
        now = self.lifecycle.clock.monotonic()
        return {
            "name": self.name,
            "state": self.state,
            "pid": self.pid,
            "port": self.spec.port,
            "gpus": tuple(self.spec.gpus),
            "model": self.spec.model,
            "served_model_name": self.spec.served_model_name,
            "restarts": self.restarts,
            "uptime_s": round(now - self.started_at, 3) if self.started_at is not None else None,
            "last_exit": self.last_exit,
            "gpu_memory_utilization": self.spec.gpu_memory_utilization,
            "state_since_s": round(now - self.state_since, 3),
            "run": self.run or None,
            "host": self.spec.host,
            "backoff_remaining_s": self.backoff_remaining_s(),
            "failed_why": self.failed_why,
            "wait": self.wait_reason(),
            "start_timeout_s": self.spec.start_timeout_s,
            # the router's runner holds a RouterSpec, which has no span
            "span": span_status(role) if (role := getattr(self.spec, "span", None)) else None,
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


def span_status(role: SpanRole) -> SpanStatus:
    """A span member's `span` status: its part and where the rest of the unit lives."""
    nodes, start = [], 0
    for node, n in role.members:
        nodes.append(SpanNodeStatus(node, start, n))
        start += n
    return SpanStatus(
        node=role.node,
        head=role.head,
        start_rank=role.start_rank,
        ranks=role.ranks,
        size=role.size,
        nodes=tuple(nodes),
        address=role.address,
        port=role.port,
        across=role.across,
    )
