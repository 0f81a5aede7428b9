"""What the daemon's parts (restore.py, service.py) may use of the daemon that hosts them: a
narrow, named interface, so neither reaches into the daemon's private members nor imports
daemon.py (which imports them). `Daemon` implements it; the type checker holds both sides to
it. A part that needs something new of the daemon adds it here first, where a reader sees the
whole surface.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterable
from pathlib import Path
from typing import Any, Protocol

from vsup.clock import Clock
from vsup.control.alerts import Alerts
from vsup.control.benchprogress import BenchProgressBoard
from vsup.control.export import MetricsListener
from vsup.control.journal import Journal
from vsup.control.monitor import Monitor
from vsup.control.pulls import Pulls
from vsup.control.state import StateFile
from vsup.engine import Engine
from vsup.layout.compiled import CompiledLayout
from vsup.layout.node import NodeFacts
from vsup.layout.spec import InstanceSpec
from vsup.snapshot import Advice, NodeInfo, StatusSnapshot


class DaemonHost(Protocol):
    """The daemon's state and helpers its restore and API methods rely on. `Daemon`
    implements it (daemon.py)."""

    home: Path
    clock: Clock
    node: NodeInfo
    node_facts: NodeFacts  # the node's GPUs (its telemetry probe), that layouts compile against
    engine: Engine
    journal: Journal
    state_file: StateFile
    monitor: Monitor
    alerts: Alerts
    metrics: MetricsListener  # the Prometheus listener of `[layout] metrics_listen`
    bench: BenchProgressBoard  # the latest report of a `vsup bench` in progress
    pulls: Pulls  # hub models pulled before their instances start
    # the running layout, as applied (None before the first apply)
    layout_path: str | None
    layout_toml: str | None
    layout_name: str | None
    layout: CompiledLayout | None  # the running layout compiled (None: none, or it no longer does)
    metrics_listen: tuple[str, int] | None
    problems: list[Advice]  # the daemon's own problems, shown as advice
    shutting_down: bool  # `vsup down` is under way: no more applies or actions
    apply_lock: asyncio.Lock  # one apply (compile to engine) or shutdown's stops at a time

    def build_snapshot(self) -> StatusSnapshot:
        """A new status snapshot, built now."""
        ...

    def snapshot(self) -> StatusSnapshot:
        """The status snapshot to serve: the latest, rebuilt only when something changed."""
        ...

    def set_layout_specs(self, specs: Iterable[InstanceSpec] | None) -> None:
        """The running layout's specs (what each instance should run; status `outdated`)."""
        ...

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        """Run `coro` as a task the daemon keeps (its failure is logged)."""
        ...

    def report_problem(self, kind: str, message: str) -> None:
        """A daemon-level problem: daemon.log, the journal and advice."""
        ...

    def state_changed(self) -> None:
        """Something the state file holds changed: it is written shortly."""
        ...

    def note_failure(self, name: str) -> None:
        """A failed exit of `name`, counted towards crash-loop advice."""
        ...

    async def start_metrics(self) -> bool:
        """Serve Prometheus metrics on `metrics_listen`; False (and a problem) when it
        cannot."""
        ...

    async def shut_down(self, stop_instances: bool) -> None:
        """`vsup down` after its answer: stop every instance (unless told not to), then end
        the daemon."""
        ...
