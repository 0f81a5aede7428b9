"""What a runner (runner.py) and the teardown (teardown.py) may use of the engine that hosts
them: a narrow, named interface, so neither imports engine.py (which imports them) nor reaches
into its private members. `Engine` implements it."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Mapping
from typing import Any, Protocol

from vsup.clock import Clock
from vsup.engine.health import HttpGetter
from vsup.engine.instance import Instance
from vsup.engine.memory import GpuMemoryView
from vsup.engine.proc import ProcInfo
from vsup.engine.scheduler import DeviceScheduler
from vsup.engine.stop import GpuReleaseCheck, RequestsRunning


class RunnerHost(Protocol):
    clock: Clock
    base_env: Mapping[str, str] | None
    health_timeout_s: float
    kill_wait_s: float
    chores_interval_s: float
    stuck_poll_s: float
    gpu_release_check: GpuReleaseCheck | None
    gpu_release_timeout_s: float
    requests_running: RequestsRunning | None
    gpu_memory: GpuMemoryView | None
    memory_poll_s: float
    scheduler: DeviceScheduler  # start order: turns on devices

    @property
    def instances(self) -> Mapping[str, Instance]: ...

    @property
    def detached(self) -> bool:
        """The daemon detaches: processes live on, nothing may be stopped on the way out."""
        ...

    def emit(self, inst: Instance | None, kind: str, **fields: Any) -> None:
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
