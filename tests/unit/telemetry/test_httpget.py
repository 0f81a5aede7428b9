"""The daemon's small HTTP/1.1 GET client against raw loopback servers: the answer shapes vLLM's
uvicorn (or anything else on the port) can give, kept-alive connections that the server closed
meanwhile, caps and deadlines."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

import pytest

from vsup.telemetry.httpget import (
    ConnectFailed,
    HttpGetter,
    ProtocolError,
    Timeout,
    TooLarge,
)

# raw answer for a request path; None: hang up without answering
Answer = Callable[[str], bytes | None]


class RawServer:
    """Answers each request with the bytes `answer(path)` gives; counts connections."""

    def __init__(self, answer: Answer, close_after: int | None = None) -> None:
        self.answer = answer
        self.close_after = close_after  # close the connection after this many answers
        self.connections = 0
        self.writers: list[asyncio.StreamWriter] = []

    async def __aenter__(self) -> RawServer:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()
        for w in self.writers:
            w.close()

    def url(self, path: str = "/metrics") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        served = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                raw = self.answer(head.split(b" ", 2)[1].decode())
                if raw is None:
                    break
                writer.write(raw)
                await writer.drain()
                served += 1
                if self.close_after is not None and served >= self.close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def refused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_content_length_answers_reuse_one_connection() -> None:
    async with RawServer(lambda p: b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello") as srv:
        g = HttpGetter()
        got = [await g.get(srv.url(), 2) for _ in range(3)]
        await g.aclose()
    assert [(r.status, r.body) for r in got] == [(200, b"hello")] * 3
    assert srv.connections == 1


async def test_chunked_body_with_a_trailer() -> None:
    raw = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: 1\r\n\r\n"
    )
    async with RawServer(lambda p: raw) as srv:
        g = HttpGetter()
        first = await g.get(srv.url(), 2)
        second = await g.get(srv.url(), 2)
        await g.aclose()
    assert first.body == second.body == b"hello world"
    assert srv.connections == 1


async def test_body_until_close_and_connection_close_are_not_reused() -> None:
    answers = {
        "/eof": b"HTTP/1.0 200 OK\r\n\r\nall of it",
        "/close": b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\n"
        b"Content-Length: 0\r\n\r\n",
    }
    async with RawServer(answers.get, close_after=1) as srv:
        g = HttpGetter()
        eof = await g.get(srv.url("/eof"), 2)
        closed = await g.get(srv.url("/close"), 2)
        again = await g.get(srv.url("/close"), 2)
        await g.aclose()
    assert (eof.status, eof.body) == (200, b"all of it")
    assert closed.status == again.status == 503
    assert srv.connections == 3


async def test_a_kept_alive_connection_the_server_dropped_is_replaced() -> None:
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    async with RawServer(lambda p: ok) as srv:
        g = HttpGetter()
        assert (await g.get(srv.url(), 2)).body == b"ok"
        for w in srv.writers:  # the server drops its idle connections (keep-alive timeout)
            w.close()
        await asyncio.sleep(0.05)
        assert (await g.get(srv.url(), 2)).body == b"ok"
        await g.aclose()
    assert srv.connections == 2


async def test_a_server_that_hangs_up_mid_answer_is_a_protocol_error() -> None:
    async with RawServer(
        lambda p: b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort", close_after=1
    ) as srv:
        g = HttpGetter()
        with pytest.raises(ProtocolError, match="hung up"):
            await g.get(srv.url(), 2)
        await g.aclose()


async def test_not_http_is_a_protocol_error() -> None:
    async with RawServer(lambda p: b"SSH-2.0-OpenSSH_9.6\r\n\r\n") as srv:
        g = HttpGetter()
        with pytest.raises(ProtocolError, match="not an HTTP/1.x answer"):
            await g.get(srv.url(), 2)
        await g.aclose()


async def test_a_body_over_the_cap_is_refused() -> None:
    async with RawServer(
        lambda p: b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"x" * 100
    ) as srv:
        g = HttpGetter(max_body=10)
        with pytest.raises(TooLarge):
            await g.get(srv.url(), 2)
        await g.aclose()


async def test_refused_and_silent_servers() -> None:
    g = HttpGetter()
    with pytest.raises(ConnectFailed, match="refused"):
        await g.get(f"http://127.0.0.1:{refused_port()}/health", 2)
    never = asyncio.Event()

    async def silent(reader, writer):
        await never.wait()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    with pytest.raises(Timeout, match="no answer within 0.2 s"):
        await g.get(f"http://127.0.0.1:{port}/health", 0.2)
    never.set()
    server.close()
    await g.aclose()


async def test_extra_headers_and_host_are_sent() -> None:
    seen: list[bytes] = []

    async def serve(reader, writer):
        seen.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    g = HttpGetter({"Authorization": "Bearer k"})
    assert (await g.get(f"http://127.0.0.1:{port}/metrics?x=1", 2)).status == 200
    await g.aclose()
    server.close()
    head = seen[0].decode()
    assert head.startswith("GET /metrics?x=1 HTTP/1.1\r\n")
    assert f"Host: 127.0.0.1:{port}\r\n" in head and "Authorization: Bearer k\r\n" in head
