"""The GET client's one deadline per request (a timer that cancels the request's task, cheaper
than asyncio.timeout): it ends as Timeout and leaves no cancellation behind; a cancellation
from outside stays a cancellation; an outer asyncio.timeout still wins when it is shorter."""

from __future__ import annotations

import asyncio

import pytest

from vsup.telemetry.httpget import HttpGetter, Timeout


async def silent_server() -> tuple[asyncio.Server, int, asyncio.Event]:
    never = asyncio.Event()

    async def silent(reader, writer):
        await never.wait()
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], never


async def test_a_deadline_is_a_timeout_and_the_task_goes_on_uncancelled() -> None:
    server, port, never = await silent_server()
    g = HttpGetter()
    try:
        with pytest.raises(Timeout, match="no answer within 0.2 s"):
            await g.get(f"http://127.0.0.1:{port}/health", 0.2)
        task = asyncio.current_task()
        assert task is not None and task.cancelling() == 0
        await asyncio.sleep(0.05)  # no stray cancellation hits the next await
    finally:
        never.set()
        server.close()
        await g.aclose()


async def test_a_cancellation_from_outside_is_not_a_timeout() -> None:
    server, port, never = await silent_server()
    g = HttpGetter()
    try:
        request = asyncio.ensure_future(g.get(f"http://127.0.0.1:{port}/health", 30))
        await asyncio.sleep(0.1)
        request.cancel()
        with pytest.raises(asyncio.CancelledError):
            await request
    finally:
        never.set()
        server.close()
        await g.aclose()


async def test_a_shorter_outer_timeout_wins() -> None:
    server, port, never = await silent_server()
    g = HttpGetter()
    try:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.1):
                await g.get(f"http://127.0.0.1:{port}/health", 30)
    finally:
        never.set()
        server.close()
        await g.aclose()
