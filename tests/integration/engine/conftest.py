"""Fixtures for engine tests that run real processes (the vLLM emulator, or real vLLM).

Every process a test starts carries `VSUP_TEST_TOKEN=<token>` in its environment (children
inherit it, whatever group or session they move to), so the finalizer finds and SIGKILLs all
of them even when a test fails half-way or the engine under test is broken.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from vsup.clock import SystemClock
from vsup.engine import Engine, EngineSettings
from vsup.engine.proc import process_table, read_stat
from vsup.journalevents import JournalEvent
from vsup.layout.spec import InstanceSpec, RestartPolicy

from tests.ports import free_port
from tests.programs.proctoken import kill_token, token_pids  # noqa: F401 (re-exported)

EMULATOR = Path(__file__).parents[2] / "programs" / "vllm_emulator.py"


def pid_alive(pid: int) -> bool:
    info = read_stat(pid)
    return info is not None and info.state != "Z"


def group_members(pgid: int) -> list[int]:
    """Live processes of group `pgid`."""
    return [p for p, i in process_table().items() if i.pgid == pgid and i.state != "Z"]


def my_zombies() -> list[int]:
    """Children of this test process that exited and were never reaped."""
    me = os.getpid()
    return [p for p, i in process_table().items() if i.state == "Z" and i.ppid == me]


class Events:
    """The engine's events, each stamped with time.monotonic() on arrival."""

    def __init__(self) -> None:
        self.items: list[tuple[float, dict[str, Any]]] = []
        self._changed = asyncio.Event()

    def __call__(self, event: JournalEvent) -> None:
        # kept as the journal's JSON object: the tests read the keys the journal holds
        self.items.append((time.monotonic(), event.to_json()))
        self._changed.set()

    def of(self, kind: str, instance: str | None = None) -> list[dict[str, Any]]:
        return [
            e
            for _, e in self.items
            if e["kind"] == kind and (instance is None or e.get("instance") == instance)
        ]

    def stamped(self, kind: str, instance: str | None = None) -> list[tuple[float, dict]]:
        return [
            (t, e)
            for t, e in self.items
            if e["kind"] == kind and (instance is None or e.get("instance") == instance)
        ]

    async def wait(
        self, pred: Callable[[dict[str, Any]], bool], count: int = 1, timeout: float = 30
    ) -> list[dict[str, Any]]:
        """Wait until `count` events match `pred`."""

        async def until() -> list[dict[str, Any]]:
            while True:
                hits = [e for _, e in self.items if pred(e)]
                if len(hits) >= count:
                    return hits
                self._changed.clear()
                await self._changed.wait()

        return await asyncio.wait_for(until(), timeout)


@pytest.fixture
def token() -> Iterator[str]:
    tok = uuid.uuid4().hex
    yield tok
    left = kill_token(tok)
    assert not left, f"processes left behind by the test: {left}"


@pytest.fixture
def events() -> Events:
    return Events()


# Engine's own parameters (what it asks the daemon); every other keyword is an EngineSettings field
ENGINE_HOOKS = ("gpu_release_check", "requests_running", "gpu_memory")


@pytest.fixture
async def engine(tmp_path: Path, events: Events, token: str):
    """An engine on the system clock; shut down (stopping everything) at the end."""
    made: list[Engine] = []

    def make(**kw: Any) -> Engine:
        hooks = {k: kw.pop(k) for k in ENGINE_HOOKS if k in kw}
        kw.setdefault("health_timeout_s", 1.0)
        kw.setdefault("chores_interval_s", 0.2)
        settings = EngineSettings(**kw)
        eng = Engine(SystemClock(), tmp_path / "logs", events, settings=settings, **hooks)
        made.append(eng)
        return eng

    yield make
    for eng in made:
        if not eng._closed:
            await eng.shutdown(stop_instances=True)


@pytest.fixture
def emulator_spec(token: str, port_factory):
    """InstanceSpec factory for the vLLM emulator: emulator_spec("a", "--engine-child", ...)."""

    def make(name: str, *flags: str, port: int | None = None, gpus=(), **kw: Any) -> InstanceSpec:
        args: dict[str, Any] = {}
        i = 0
        while i < len(flags):
            key = flags[i].lstrip("-")
            if i + 1 < len(flags) and not flags[i + 1].startswith("--"):
                args[key] = flags[i + 1]
                i += 2
            else:
                args[key] = True
                i += 1
        base: dict[str, Any] = dict(
            name=name,
            model="/models/fake",
            command=(sys.executable, str(EMULATOR)),
            host="127.0.0.1",
            port=port if port is not None else port_factory(),
            gpus=tuple(gpus),
            gpu_memory_utilization=None,
            args=args,
            env={"VSUP_TEST_TOKEN": token},
            restart=RestartPolicy(backoff_s=0.05, backoff_max_s=0.2, stable_s=600, max_failures=5),
            start_timeout_s=20,
            stop_grace_s=2,
            health_interval_s=0.05,
            unhealthy_after=2,
        )
        base.update(kw)
        return InstanceSpec(**base)

    return make


@pytest.fixture
def port_factory():
    """Distinct free loopback ports (tests/ports.py)."""
    return free_port
