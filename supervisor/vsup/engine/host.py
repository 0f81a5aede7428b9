"""What the parts of the engine that live in other modules may use of the engine that hosts them:
narrow, named interfaces, so none of them imports engine.py (which imports them) nor reaches
into its private members. mypy checks `Engine` against both.

- `RunnerHost`: what a runner (runner.py), the teardown (teardown.py) and adoption
  (adoption.py) use. The router's runner gets one too (routing.py's `_RouterHost`), whose
  events name the router instead of an instance.
- `EngineHost`: what the router's supervision (routing.py) uses of the engine besides that.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any, Protocol

from vsup.clock import Clock
from vsup.engine.health import HttpGetter
from vsup.engine.instance import Instance
from vsup.engine.memory import GpuMemoryView
from vsup.engine.proc import ProcInfo
from vsup.engine.scheduler import DeviceScheduler
from vsup.engine.settings import EngineSettings
from vsup.engine.sleep import Sleeper
from vsup.engine.stop import GpuReleaseCheck, RequestsRunning
from vsup.journalevents import JournalEvent
from vsup.layout.spec import InstanceSpec


class RunnerHost(Protocol):
    @property
    def clock(self) -> Clock: ...

    @property
    def settings(self) -> EngineSettings: ...

    @property
    def gpu_release_check(self) -> GpuReleaseCheck | None:
        """(pids, gpus) -> whether those GPUs no longer list memory of those pids."""
        ...

    @property
    def requests_running(self) -> RequestsRunning | None:
        """(name) -> requests the instance runs or queues (for drains), None if unknown."""
        ...

    @property
    def gpu_memory(self) -> GpuMemoryView | None:
        """(gpus) -> the telemetry's latest figures of their memory and who holds it."""
        ...

    @property
    def scheduler(self) -> DeviceScheduler:
        """Start order: turns on devices."""
        ...

    @property
    def instances(self) -> Mapping[str, Instance]: ...

    @property
    def sleeper(self) -> Sleeper | None:
        """vLLM's sleep mode (sleep.py): the start gate of swap groups; None for the router."""
        ...

    @property
    def detached(self) -> bool:
        """The daemon detaches: processes live on, nothing may be stopped on the way out."""
        ...

    def emit(self, inst: Instance | None, event: JournalEvent) -> None:
        """Send an event (ARCHITECTURE.md's table) to the daemon."""
        ...

    def notify(self) -> None:
        """Wake whoever waits for a change of an instance (Engine.wait, settle, a rollout)."""
        ...

    def http_client(self) -> HttpGetter:
        """The shared keep-alive client of /health checks."""
        ...

    async def scan_processes(self) -> dict[int, ProcInfo]:
        """The node's process table, shared by all runners (rescanned at most so often)."""
        ...

    def spawn_background(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task:
        """Run `coro` as a task the engine cancels when it shuts down."""
        ...

    async def start(self, name: str, wait: bool = False, automatic: bool = False) -> None: ...


class EngineHost(RunnerHost, Protocol):
    @property
    def logs_dir(self) -> Path: ...

    async def until(self, predicate: Callable[[], bool]) -> None:
        """Return once `predicate()` holds (re-checked at every `notify`)."""
        ...

    def relaunch(
        self,
        inst: Instance,
        drain: bool = False,
        drain_timeout_s: float | None = None,
        spec: InstanceSpec | None = None,
    ) -> None:
        """Want `inst` running again with a fresh breaker (the one restart path)."""
        ...

    async def halt(self, inst: Instance, drain: bool = False) -> None:
        """Stop `inst`'s process and return once it has (the one stop path)."""
        ...
