"""An in-process daemon on a real socket, and layouts of vLLM emulators
(`tests/programs/vllm_emulator.py`: real processes that answer like vLLM, without a model, fast
enough for unit tests)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from pathlib import Path

import pytest

from vsup import paths
from vsup.control.client import AsyncJsonClient
from vsup.control.daemon import Daemon
from vsup.control.server import bind_unix_socket
from vsup.telemetry.gpu import NoneProbe


class DaemonRunner:
    """Starts daemons in this event loop; the teardown stops every process they spawned.

    Each comes with a wire client (`AsyncJsonClient`): these tests read the control API's JSON
    as the daemon sends it; test_answers.py reads it through the typed client."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.running: list[tuple[Daemon, asyncio.Task, AsyncJsonClient]] = []

    async def start(self, **kw) -> tuple[Daemon, AsyncJsonClient]:
        kw.setdefault("poll_interval", 0.2)
        kw.setdefault("gpu_probe", NoneProbe())
        daemon = Daemon(self.home, **kw)
        sock = bind_unix_socket(paths.socket_path(self.home))
        task = asyncio.create_task(daemon.serve(sock, handle_signals=False))
        client = AsyncJsonClient(self.home)
        for _ in range(200):
            if task.done():
                task.result()
            with contextlib.suppress(Exception):
                await client.ping()
                break
            await asyncio.sleep(0.02)
        self.running.append((daemon, task, client))
        return daemon, client

    async def stop(self, daemon: Daemon, stop_instances: bool = False) -> None:
        """Stop `daemon`; with `stop_instances` like `vsup down`, else like SIGTERM."""
        for d, task, client in list(self.running):
            if d is daemon:
                if stop_instances:
                    await client.shutdown(stop_instances=True)
                else:
                    d.request_stop()
                await asyncio.wait_for(task, 30)
                await client.aclose()
                self.running.remove((d, task, client))

    async def close(self) -> None:
        for d, _task, _client in list(self.running):
            await self.stop(d, stop_instances=True)
        # Anything a test left running (e.g. killed daemons' instances): end its group.
        journal = paths.journal_path(self.home)
        if journal.exists():
            for line in journal.read_text().splitlines():
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    ev = json.loads(line)
                    if ev["kind"] == "spawn" and ev.get("pgid"):
                        with contextlib.suppress(ProcessLookupError, PermissionError):
                            os.killpg(ev["pgid"], signal.SIGKILL)


@pytest.fixture
async def daemons(vsup_home):
    runner = DaemonRunner(vsup_home)
    try:
        yield runner
    finally:
        await runner.close()
