"""A span follower's start against a head that answers the moment the follower runs.

A follower is ready only behind a head that started after it (engine/spanwatch.py): it must
have seen the head not answer before the head's 200 counts. Its first look at the head used to
come after its spawn, so a follower that joined fast (or a daemon slow to look, as on a loaded
CI machine, where `fleet up` of a span timed out once in 120 s) first saw the head it had just
joined answer, took it for an older head, and waited for that head to start again until its
start timed out. The first look is taken before the spawn now.

The head here is a small HTTP server of the test's: it says 503 until the follower's run log
exists (the daemon writes its header just before the spawn), then 200, as a head whose last
rank just joined; or, as its `mode` says, an old head that answers all along, or none.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from vsup.layout.spec import SpanRole

from tests.integration.engine.test_processes import until
from tests.ports import free_port

pytestmark = pytest.mark.timeout(60)


@dataclass
class FakeHead:
    """An API server's /health, as a span's head answers it. `mode` "joined": 200 once a run
    log of the follower exists; "old": 200; "gone": 503. `answers`: every code it gave."""

    logs: Path
    mode: str
    answers: list[int] = field(default_factory=list)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                if line in (b"\r\n", b"\n"):
                    joined = self.mode == "joined" and any(self.logs.glob("run-*.log"))
                    code = 200 if joined or self.mode == "old" else 503
                    self.answers.append(code)
                    writer.write(f"HTTP/1.1 {code} X\r\ncontent-length: 0\r\n\r\n".encode())
                    await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()


@contextlib.asynccontextmanager
async def follower_of(mode: str, engine, emulator_spec, tmp_path: Path):
    """A fake head in `mode`, and an engine running one follower of it ("big")."""
    head = FakeHead(tmp_path / "logs" / "big", mode)
    server = await asyncio.start_server(head.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    role = SpanRole(
        node="gpu02",
        head=False,
        start_rank=1,
        ranks=1,
        members=(("gpu01", 1), ("gpu02", 1)),
        address="127.0.0.1",
        rpc_port=free_port(),
        port=port,
    )
    # a follower runs ranks only (no API server): a process that runs is enough here
    sleeper = (sys.executable, "-c", "import time; time.sleep(120)")
    spec = emulator_spec("big", port=port, span=role, start_timeout_s=30, command=sleeper)
    eng = engine(health_timeout_s=1.0)
    try:
        await eng.apply([spec])
        yield head, eng
    finally:
        server.close()


async def test_a_follower_whose_head_answers_as_soon_as_it_runs_is_ready(
    engine, emulator_spec, tmp_path
):
    async with follower_of("joined", engine, emulator_spec, tmp_path) as (head, eng):
        await eng.wait("big", ("ready",), timeout=15)
        # the look before the spawn found no head; every look after it found the head
        assert head.answers[0] == 503 and 200 in head.answers, head.answers
        assert eng.instances["big"].wait is None


async def test_a_follower_started_while_an_old_head_answers_waits_for_its_next_run(
    engine, emulator_spec, tmp_path
):
    async with follower_of("old", engine, emulator_spec, tmp_path) as (head, eng):
        await until(lambda: len(head.answers) >= 5)
        inst = eng.instances["big"]
        assert inst.state == "starting", head.answers
        assert inst.wait is not None and "to start again" in inst.wait.message, inst.wait
        # the old head goes away, and a new one answers: this follower joined that one
        head.mode = "gone"
        await until(lambda: head.answers[-1] == 503)
        head.mode = "old"
        await eng.wait("big", ("ready",), timeout=15)
