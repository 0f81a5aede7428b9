"""The per-poll scrape batch (telemetry/batch.py: every server's scrape from one worker thread)
against real loopback servers: the same figures as `Scraper.scrape`, one kept-alive
connection, chunked answers, a server that closes after an answer or while idle, a half
answer then silence (pending into the next run, never sent twice, then a timeout), a refused
connection, one that closes without answering, and the whole page when the filter says
nothing."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from vsup.telemetry.batch import Job, ScrapeBatch, batch_for
from vsup.telemetry.scrape import Scraper, ScrapeResult

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "vllm-0.32-cpu"
PAYLOAD = (FIX / "metrics_load.txt").read_bytes()

# (path, connection number, request number on it) -> the bytes to write; None: write nothing
# and keep the connection open; b"": close it without a word
Answer = Callable[[str, int, int], Awaitable[bytes | None]]


def ok(body: bytes, extra: str = "") -> bytes:
    return f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body


def chunked(body: bytes) -> bytes:
    parts = [body[i : i + 1000] for i in range(0, len(body), 1000)]
    out = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    for part in parts:
        out += f"{len(part):x}\r\n".encode() + part + b"\r\n"
    return out + b"0\r\n\r\n"


async def vllm(path: str, _conn: int, _n: int) -> bytes | None:
    """What a vLLM server (0.32, whose `/metrics/` filters) answers."""
    if path == "/health":
        return ok(b"")
    if path == "/load":
        return ok(b'{"server_load":3}')
    if path.startswith("/metrics"):
        return ok(PAYLOAD)
    return b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"


class Server:
    """A loopback HTTP/1.1 server that reads pipelined requests and answers each as `answer`
    says; counts connections and records the paths asked."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.connections = 0
        self.paths: list[str] = []
        self.hold = asyncio.Event()

    async def __aenter__(self) -> Server:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.hold.set()
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        conn = self.connections
        n = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                path = head.split(b" ", 2)[1].decode()
                self.paths.append(path)
                n += 1
                out = await self.answer(path, conn, n)
                if out is None:
                    await self.hold.wait()
                    return
                if out == b"":
                    return
                writer.write(out)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def run(
    batch: ScrapeBatch, jobs: list[Job[str]], wait_s: float = 2.0
) -> dict[str, ScrapeResult]:
    got: dict[str, ScrapeResult] = {}

    def deliver(results: list[tuple[Job[str], ScrapeResult]]) -> None:
        for job, result in results:
            assert job.name not in got
            got[job.name] = result

    await batch.run(jobs, wait_s, deliver)
    return got


def job(url: str, name: str = "a", load: bool = True, health: bool = True) -> Job[str]:
    return Job(name, name, url, with_load=load, with_health=health)


async def twice(scraper: Scraper, url: str) -> tuple[ScrapeResult, ScrapeResult]:
    """Two runs of one batch of `scraper`'s, one job for `url` each: their results."""
    batch = batch_for(scraper)
    assert batch is not None
    try:
        first = (await run(batch, [job(url)]))["a"]
        second = (await run(batch, [job(url)]))["a"]
    finally:
        await batch.aclose()
    return first, second


def refused_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


async def test_the_batch_reads_what_the_scraper_reads_on_one_kept_alive_connection() -> None:
    async with Server(vllm) as srv, Scraper(timeout_s=5) as scraper:
        want = await scraper.scrape(srv.url, with_load=True, with_health=True)
        srv.connections = 0
        first, second = await twice(scraper, srv.url)
    for got in (first, second):
        assert got.ok and got.error is None and got.status == 200
        assert got.metrics == want.metrics and got.metrics.preemptions_total == 2.0
        assert got.server_load == 3 and got.load_error is None and got.health_status == 200
        assert got.url == want.url == srv.url + "/metrics"
    assert srv.connections == 1  # kept alive between runs
    assert srv.paths[-3:][:2] == ["/health", "/load"]
    assert srv.paths[-1].startswith("/metrics/?name%5B%5D=")  # the filtered page


async def test_load_and_health_are_asked_only_when_the_job_says() -> None:
    async with Server(vllm) as srv, Scraper(timeout_s=5) as scraper:
        batch = batch_for(scraper)
        assert batch is not None
        try:
            got = (await run(batch, [job(srv.url, load=False, health=False)]))["a"]
        finally:
            await batch.aclose()
    assert got.ok and got.server_load is None and got.health_status is None
    assert [p.partition("?")[0] for p in srv.paths] == ["/metrics/"]


async def test_a_chunked_answer_is_read_whole() -> None:
    async def answer(path: str, conn: int, n: int) -> bytes | None:
        if path.startswith("/metrics"):
            return chunked(PAYLOAD)
        return await vllm(path, conn, n)

    async with Server(answer) as srv, Scraper(timeout_s=5) as scraper:
        batch = batch_for(scraper)
        assert batch is not None
        try:
            got = [(await run(batch, [job(srv.url)]))["a"] for _ in range(2)]
        finally:
            await batch.aclose()
    assert all(r.ok and r.size_bytes == len(PAYLOAD) for r in got)
    assert got[0].metrics.preemptions_total == 2.0
    assert srv.connections == 1


async def test_a_server_that_closes_after_an_answer_gets_the_rest_asked_again() -> None:
    async def answer(path: str, conn: int, n: int) -> bytes | None:
        if n == 1:
            return ok(b"", "Connection: close\r\n") if conn == 1 else await vllm(path, conn, n)
        return await vllm(path, conn, n)

    async with Server(answer) as srv, Scraper(timeout_s=5) as scraper:
        batch = batch_for(scraper)
        assert batch is not None
        try:
            got = (await run(batch, [job(srv.url)]))["a"]
        finally:
            await batch.aclose()
    assert got.ok and got.server_load == 3 and got.health_status == 200
    assert srv.connections == 2
    assert [p.partition("?")[0] for p in srv.paths] == [
        "/health",
        "/load",
        "/metrics/",
        "/load",
        "/metrics/",
    ]


async def test_a_kept_alive_connection_the_server_closed_while_idle_is_replaced() -> None:
    async def answer(path: str, conn: int, n: int) -> bytes | None:
        if conn == 1 and n > 3:
            return b""  # closes when asked again, as a server whose idle timer ran out
        return await vllm(path, conn, n)

    async with Server(answer) as srv, Scraper(timeout_s=5) as scraper:
        first, second = await twice(scraper, srv.url)
    assert first.ok and second.ok and second.server_load == 3
    assert srv.connections == 2


async def test_a_new_connection_closed_without_an_answer_is_an_error() -> None:
    async def answer(_path: str, _conn: int, _n: int) -> bytes | None:
        return b""

    async with Server(answer) as srv, Scraper(timeout_s=5) as scraper:
        batch = batch_for(scraper)
        assert batch is not None
        try:
            got = (await run(batch, [job(srv.url)]))["a"]
        finally:
            await batch.aclose()
    assert not got.ok and got.status is None and got.error is not None
    assert "closed the connection without answering" in got.error
    assert got.load_error is not None and got.load_error.startswith(srv.url + "/load")


async def test_a_refused_connection_is_an_error_at_once() -> None:
    url = refused_url()
    async with Scraper(timeout_s=5) as scraper:
        batch = batch_for(scraper)
        assert batch is not None
        try:
            got = (await run(batch, [job(url)]))["a"]
        finally:
            await batch.aclose()
    assert got.error is not None
    assert not got.ok and "connection refused or unreachable" in got.error
    assert "no answer within" not in got.error  # refused, not waited out to the timeout


async def test_a_half_answer_then_silence_stays_pending_is_not_sent_again_then_times_out() -> None:
    class Half(Server):
        async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            try:
                while True:
                    head = await reader.readuntil(b"\r\n\r\n")
                    path = head.split(b" ", 2)[1].decode()
                    self.paths.append(path)
                    if path.startswith("/metrics"):
                        writer.write(ok(PAYLOAD)[:500])  # half an answer, then nothing
                        await writer.drain()
                        await self.hold.wait()
                        return
                    writer.write(await vllm(path, 0, 0) or b"")
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            finally:
                writer.close()

    async with Server(vllm) as fast, Half(vllm) as slow, Scraper(timeout_s=1.0) as scraper:
        batch = batch_for(scraper)
        assert batch is not None
        try:
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            got = await run(batch, [job(fast.url, "fast"), job(slow.url, "slow")], wait_s=0.3)
            assert set(got) == {"fast"} and got["fast"].ok  # the fast one at once
            assert batch.pending("slow") and loop.time() - t0 < 1.0
            got = await run(batch, [job(fast.url, "fast"), job(slow.url, "slow")], wait_s=0.3)
            assert set(got) == {"fast"}
            for _ in range(10):  # until the slow one is a timeout
                got = await run(batch, [job(slow.url, "slow")], wait_s=0.3)
                if got:
                    break
        finally:
            await batch.aclose()
    result = got["slow"]
    assert not result.ok and result.error is not None
    assert "no answer within the timeout" in result.error and "within 1 s" in result.error
    assert result.elapsed_s >= 1.0
    assert slow.connections == 1
    assert [p.partition("?")[0] for p in slow.paths] == ["/health", "/load", "/metrics/"]


async def test_a_server_whose_filtered_page_says_nothing_is_asked_for_the_whole_page() -> None:
    async def answer(path: str, conn: int, n: int) -> bytes | None:
        if path.startswith("/metrics/?"):
            return ok(b"# nothing\n")  # a multiprocess registry answers it empty
        if path == "/metrics":
            return ok(PAYLOAD)
        return await vllm(path, conn, n)

    async with Server(answer) as srv, Scraper(timeout_s=5) as scraper:
        first, second = await twice(scraper, srv.url)
        # the scraper shares what the batch learned
        assert scraper.metrics_url(srv.url, False) == srv.url + "/metrics"
    assert first.ok and second.ok and first.metrics.preemptions_total == 2.0
    assert first.server_load == 3
    asked = [p.partition("?")[0] for p in srv.paths]
    assert asked == ["/health", "/load", "/metrics/"] + ["/health", "/load", "/metrics"] * 2


async def test_a_load_answer_that_is_no_count_is_unknown_and_the_scrape_goes_on() -> None:
    async def answer(path: str, conn: int, n: int) -> bytes | None:
        if path == "/load":
            return ok(json.dumps({"server_load": "many"}).encode())
        return await vllm(path, conn, n)

    async with Server(answer) as srv, Scraper(timeout_s=5) as scraper:
        batch = batch_for(scraper)
        assert batch is not None
        try:
            got = (await run(batch, [job(srv.url)]))["a"]
        finally:
            await batch.aclose()
    assert got.ok and got.server_load is None
    assert got.load_error == f"{srv.url}/load sent server_load 'many', not a count"


async def test_a_kept_alive_connection_closed_between_runs_is_let_go_and_replaced() -> None:
    closed = asyncio.Event()

    class ClosesWhenIdle(Server):
        async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            for _ in range(3):
                head = await reader.readuntil(b"\r\n\r\n")
                path = head.split(b" ", 2)[1].decode()
                self.paths.append(path)
                writer.write(await vllm(path, 0, 0) or b"")
            await writer.drain()
            writer.close()  # an idle timeout: closed with no word, between two scrapes
            closed.set()

    async with ClosesWhenIdle(vllm) as srv, Scraper(timeout_s=5) as scraper:
        batch = batch_for(scraper)
        assert batch is not None
        try:
            first = (await run(batch, [job(srv.url)]))["a"]
            await closed.wait()
            await asyncio.sleep(0.05)
            second = (await run(batch, [job(srv.url)]))["a"]
        finally:
            await batch.aclose()
    assert first.ok and second.ok and second.server_load == 3
    assert srv.connections == 2


class _Trickle(socket.socket):
    """A socket whose `send` takes at most 7 bytes: every request goes out in pieces, as it
    does when a server reads slower than the daemon writes (a full send buffer)."""

    def send(self, data: bytes, *args: int) -> int:  # type: ignore[override]
        return super().send(bytes(data[:7]), *args)


async def test_a_request_the_socket_takes_a_few_bytes_at_a_time_is_sent_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import vsup.telemetry.batch as batch_module

    monkeypatch.setattr(batch_module.socket, "socket", _Trickle)
    async with Server(vllm) as srv, Scraper(timeout_s=5) as scraper:
        # the second on the kept-alive socket: its writes wait for room again, then answers
        first, second = await twice(scraper, srv.url)
    for got in (first, second):
        assert got.ok and got.server_load == 3 and got.health_status == 200
        assert got.metrics.preemptions_total == 2.0
    assert srv.connections == 1
    assert [p.partition("?")[0] for p in srv.paths] == ["/health", "/load", "/metrics/"] * 2
