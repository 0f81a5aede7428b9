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
import sys
from pathlib import Path

import pytest

from vsup.layout.spec import SpanRole

from tests.integration.engine.test_processes import until
from tests.ports import free_port

pytestmark = pytest.mark.timeout(60)


async def fake_head(logs: Path, mode: dict[str, str]) -> tuple[asyncio.Server, list[int]]:
    """An API server's /health: `mode` "joined": 200 once a run log of the follower exists;
    "old": 200; "gone": 503."""
    answers: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                if line in (b"\r\n", b"\n"):
                    joined = mode["is"] == "joined" and any(logs.glob("run-*.log"))
                    code = 200 if joined or mode["is"] == "old" else 503
                    answers.append(code)
                    writer.write(f"HTTP/1.1 {code} X\r\ncontent-length: 0\r\n\r\n".encode())
                    await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, answers


def follower_spec(emulator_spec, head_port: int):
    role = SpanRole(
        node="gpu02",
        head=False,
        start_rank=1,
        ranks=1,
        members=(("gpu01", 1), ("gpu02", 1)),
        address="127.0.0.1",
        rpc_port=free_port(),
        port=head_port,
    )
    # a follower runs ranks only (no API server): a process that runs is enough here
    sleeper = (sys.executable, "-c", "import time; time.sleep(120)")
    return emulator_spec("big", port=head_port, span=role, start_timeout_s=30, command=sleeper)


async def test_a_follower_whose_head_answers_as_soon_as_it_runs_is_ready(
    engine, emulator_spec, tmp_path
):
    mode = {"is": "joined"}
    server, answers = await fake_head(tmp_path / "logs" / "big", mode)
    port = server.sockets[0].getsockname()[1]
    eng = engine(health_timeout_s=1.0)
    try:
        await eng.apply([follower_spec(emulator_spec, port)])
        await eng.wait("big", ("ready",), timeout=15)
        # the look before the spawn found no head; every look after it found the head
        assert answers[0] == 503 and 200 in answers, answers
        assert eng.instances["big"].wait is None
    finally:
        server.close()


async def test_a_follower_started_while_an_old_head_answers_waits_for_its_next_run(
    engine, emulator_spec, tmp_path
):
    mode = {"is": "old"}
    server, answers = await fake_head(tmp_path / "logs" / "big", mode)
    port = server.sockets[0].getsockname()[1]
    eng = engine(health_timeout_s=1.0)
    try:
        await eng.apply([follower_spec(emulator_spec, port)])
        await until(lambda: len(answers) >= 5)
        inst = eng.instances["big"]
        assert inst.state == "starting", answers
        assert inst.wait is not None and "to start again" in inst.wait.message, inst.wait
        # the old head goes away, and a new one answers: this follower joined that one
        mode["is"] = "gone"
        await until(lambda: answers[-1] == 503)
        mode["is"] = "old"
        await eng.wait("big", ("ready",), timeout=15)
    finally:
        server.close()
