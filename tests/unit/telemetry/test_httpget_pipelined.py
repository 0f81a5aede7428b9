"""`HttpGetter.get_all`: the GETs of one scrape (/health, /load, /metrics) written at once on one
kept-alive connection and the answers read back to back (the daemon's CPU: docs/benchmarks.md),
against raw loopback servers, including ones that close the connection between answers."""

from __future__ import annotations

import asyncio

import pytest

from vsup.telemetry.httpget import HttpError, HttpGetter

from tests.unit.telemetry.test_httpget import RawServer


def by_path(path: str) -> bytes:
    body = path.encode()
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


async def test_every_request_is_written_before_the_first_answer_is_read() -> None:
    """A server that answers only once it holds all three requests: a client that waits for
    each answer before sending the next request would get nothing."""
    seen: list[str] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for _ in range(3):
            head = await reader.readuntil(b"\r\n\r\n")
            seen.append(head.split(b" ", 2)[1].decode())
        writer.write(b"".join(by_path(p) for p in seen))
        await writer.drain()
        await reader.read()  # held open (kept alive) until the client closes it
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    g = HttpGetter()
    try:
        urls = [f"http://127.0.0.1:{port}{p}" for p in ("/health", "/load", "/metrics")]
        got = await g.get_all(urls, 2)
    finally:
        await g.aclose()
        server.close()
    assert seen == ["/health", "/load", "/metrics"]
    assert [(r.status, r.body) for r in got] == [
        (200, b"/health"),
        (200, b"/load"),
        (200, b"/metrics"),
    ]


async def test_the_connection_is_kept_for_the_next_call() -> None:
    async with RawServer(by_path) as srv:
        g = HttpGetter()
        for _ in range(3):
            got = await g.get_all([srv.url("/a"), srv.url("/b")], 2)
            assert [r.body for r in got] == [b"/a", b"/b"]
        await g.aclose()
    assert srv.connections == 1


async def test_a_server_that_closes_after_each_answer_gets_the_rest_asked_again() -> None:
    async with RawServer(by_path, close_after=1) as srv:
        g = HttpGetter()
        got = await g.get_all([srv.url("/a"), srv.url("/b"), srv.url("/c")], 2)
        await g.aclose()
    assert [r.body for r in got] == [b"/a", b"/b", b"/c"]
    assert srv.connections == 3


async def test_a_connection_closed_while_idle_is_replaced() -> None:
    async with RawServer(by_path, close_after=2) as srv:
        g = HttpGetter()
        first = await g.get_all([srv.url("/a"), srv.url("/b")], 2)
        await asyncio.sleep(0.05)  # the server has closed the kept-alive connection
        second = await g.get_all([srv.url("/c"), srv.url("/d")], 2)
        await g.aclose()
    assert [r.body for r in first + second] == [b"/a", b"/b", b"/c", b"/d"]
    assert srv.connections == 2


async def test_urls_of_two_servers_are_refused() -> None:
    g = HttpGetter()
    with pytest.raises(HttpError, match="one server"):
        await g.get_all(["http://127.0.0.1:1/a", "http://127.0.0.1:2/b"], 1)
