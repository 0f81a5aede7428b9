"""The scraper against real loopback HTTP servers: keep-alive, timeouts, dead and slow
servers, concurrency that lets a fast server's result through before a slow one answers, vLLM's
`/load` read beside `/metrics`, and the stall canary's one completion."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from vsup.telemetry.scrape import CanaryOutcome, Scraper

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "vllm-0.32-cpu"
PAYLOAD = (FIX / "metrics_load.txt").read_bytes()

Handler = Callable[[str], Awaitable[tuple[int, bytes]]]


class HttpServer:
    """A tiny HTTP/1.1 server with keep-alive that counts the connections it accepted."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.requests: list[str] = []
        self.posts: list[tuple[str, dict[str, str], bytes]] = []  # (path, headers, body)
        self.request_seen = asyncio.Event()
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task] = set()

    async def __aenter__(self) -> HttpServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    @property
    def url(self) -> str:
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                path = head.split(b" ", 2)[1].decode()
                headers = {}
                for line in head.decode("latin-1").split("\r\n")[1:]:
                    name, sep, value = line.partition(":")
                    if sep:
                        headers[name.strip().lower()] = value.strip()
                if head.startswith(b"POST "):
                    body = await reader.readexactly(int(headers.get("content-length", 0)))
                    self.posts.append((path, headers, body))
                self.requests.append(path)
                self.request_seen.set()
                status, body = await self.handler(path)
                writer.write(
                    f"HTTP/1.1 {status} X\r\nContent-Length: {len(body)}\r\n"
                    "Content-Type: text/plain\r\n\r\n".encode()
                    + body
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()


def paths(server: HttpServer) -> list[str]:
    """The paths the server was asked for, the `/metrics` page however it was asked."""
    return [p.partition("?")[0].rstrip("/") or "/" for p in server.requests]


async def vllm_like(path: str) -> tuple[int, bytes]:
    if path.partition("?")[0].rstrip("/") == "/metrics":  # a server that does not filter
        return 200, PAYLOAD
    if path == "/health":
        return 200, b""
    if path == "/load":  # vLLM with --enable-server-load-tracking
        return 200, b'{"server_load":7}'
    if path == "/v1/models":
        return 200, b'{"object":"list","data":[{"id":"tiny","object":"model"}]}'
    if path == "/v1/completions":
        return 200, b'{"choices":[{"text":"x"}],"usage":{"completion_tokens":1}}'
    return 404, b"not found"


def refused_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


async def test_scrape_parses_the_payload_and_reuses_one_connection() -> None:
    async with HttpServer(vllm_like) as server, Scraper(timeout_s=5) as scraper:
        results = [await scraper.scrape(server.url) for _ in range(3)]
        health = await scraper.health(server.url)
    assert all(r.ok and r.status == 200 for r in results)
    assert results[0].metrics.preemptions_total == 2.0
    assert results[0].size_bytes == len(PAYLOAD) and results[0].text is None
    assert health.ok and health.status == 200
    assert server.connections == 1  # keep-alive: four requests, one TCP connection
    assert paths(server) == ["/metrics"] * 3 + ["/health"]


async def test_keep_text_returns_the_payload() -> None:
    async with HttpServer(vllm_like) as server, Scraper() as scraper:
        result = await scraper.scrape(server.url + "/", keep_text=True)
    assert result.text == PAYLOAD.decode()


async def test_a_dead_server_is_an_error_result_not_an_exception() -> None:
    url = refused_url()
    async with Scraper(timeout_s=2) as scraper:
        result = await scraper.scrape(url)
        health = await scraper.health(url)
    assert result.error is not None
    assert not result.ok and result.status is None and "refused" in result.error
    assert result.metrics.kv_cache_usage is None
    assert not health.ok and health.status is None


async def test_a_server_that_never_answers_times_out() -> None:
    never = asyncio.Event()

    async def hang(path: str) -> tuple[int, bytes]:
        await never.wait()
        return 200, b""

    async with HttpServer(hang) as server, Scraper(timeout_s=0.2) as scraper:
        result = await scraper.scrape(server.url)
        never.set()
    assert not result.ok and result.status is None
    assert result.error is not None
    assert "no answer within the timeout" in result.error


@pytest.mark.parametrize("status", [500, 503, 404])
async def test_http_errors_are_reported_with_their_status(status: int) -> None:
    async def fail(path: str) -> tuple[int, bytes]:
        return status, b"engine dead"

    async with HttpServer(fail) as server, Scraper() as scraper:
        result = await scraper.scrape(server.url)
        health = await scraper.health(server.url)
    assert result.error is not None
    assert not result.ok and result.status == status and str(status) in result.error
    assert not health.ok and health.status == status


async def test_a_server_without_vllm_metrics_is_not_ok() -> None:
    async def python_only(path: str) -> tuple[int, bytes]:
        return 200, b"process_start_time_seconds 1.7e9\npython_info 1.0\n"

    async with HttpServer(python_only) as server, Scraper() as scraper:
        result = await scraper.scrape(server.url)
    assert not result.ok and result.status == 200
    assert result.error is not None
    assert "--disable-log-stats" in result.error
    assert result.metrics.process_start_time_s == 1.7e9


async def test_a_slow_server_does_not_hold_back_the_others() -> None:
    release = asyncio.Event()
    order: list[str] = []

    async def slow(path: str) -> tuple[int, bytes]:
        await release.wait()
        return 200, PAYLOAD

    async with (
        HttpServer(vllm_like) as fast,
        HttpServer(slow) as laggard,
        Scraper(timeout_s=30) as scraper,
    ):

        async def on_result(name: str, result) -> None:
            order.append(name)
            if name == "fast":
                # The slow server holds its request unanswered while the fast result is in.
                await laggard.request_seen.wait()
                assert not release.is_set()
                release.set()

        results = await scraper.scrape_all(
            {"slow": laggard.url, "fast": fast.url, "dead": refused_url()}, on_result
        )
    assert order.index("fast") < order.index("slow")
    assert results["fast"].ok and results["slow"].ok and not results["dead"].ok


async def test_health_all_reports_every_server() -> None:
    async def engine_dead(path: str) -> tuple[int, bytes]:
        return 503, b""

    async with HttpServer(vllm_like) as up, HttpServer(engine_dead) as dead, Scraper() as s:
        seen: list[str] = []
        results = await s.health_all(
            {"up": up.url, "dead": dead.url, "gone": refused_url()},
            lambda name, _r: seen.append(name),
        )
    assert results["up"].ok and results["dead"].status == 503 and results["gone"].status is None
    assert sorted(seen) == ["dead", "gone", "up"]


async def test_with_load_reads_load_then_metrics_on_the_same_connection() -> None:
    async with HttpServer(vllm_like) as server, Scraper(timeout_s=5) as scraper:
        results = [await scraper.scrape(server.url, with_load=True) for _ in range(2)]
        plain = await scraper.scrape(server.url)
    assert [(r.ok, r.server_load, r.load_error) for r in results] == [(True, 7, None)] * 2
    assert plain.server_load is None  # not asked: a server without the flag answers 0 always
    assert paths(server) == ["/load", "/metrics", "/load", "/metrics", "/metrics"]
    assert server.connections == 1


@pytest.mark.parametrize(
    ("status", "body", "why"),
    [
        (404, b'{"detail":"Not Found"}', "HTTP 404"),
        (200, b"<html>", "no server_load"),
        (200, b'{"server_load": "3"}', "not a count"),
        (200, b'{"server_load": true}', "not a count"),
    ],
)
async def test_a_load_answer_that_is_no_count_is_unknown_and_the_scrape_goes_on(
    status: int, body: bytes, why: str
) -> None:
    async def odd_load(path: str) -> tuple[int, bytes]:
        return (status, body) if path == "/load" else await vllm_like(path)

    async with HttpServer(odd_load) as server, Scraper() as scraper:
        result = await scraper.scrape(server.url, with_load=True)
    assert result.ok and result.metrics.preemptions_total == 2.0
    assert result.server_load is None and why in (result.load_error or "")


async def test_the_canary_is_one_max_tokens_1_completion_with_the_rank_and_key() -> None:
    async with HttpServer(vllm_like) as server, Scraper() as scraper:
        auth = {"Authorization": "Bearer k"}
        model = await scraper.served_model(server.url, headers=auth)
        answered = await scraper.canary(server.url, "tiny", 5.0, rank=1, headers=auth)
        plain = await scraper.canary(server.url, "tiny", 5.0)
    assert model == "tiny"
    assert answered.outcome == CanaryOutcome.ANSWERED and answered.status == 200
    assert plain.outcome == CanaryOutcome.ANSWERED
    (path, headers, body), (_p, plain_headers, _b) = server.posts
    assert path == "/v1/completions"
    assert json.loads(body) == {"model": "tiny", "prompt": ".", "max_tokens": 1}
    assert headers["x-data-parallel-rank"] == "1" and headers["authorization"] == "Bearer k"
    assert headers["content-type"] == "application/json"
    assert "x-data-parallel-rank" not in plain_headers


async def test_a_canary_without_an_answer_times_out_and_a_refused_one_fails() -> None:
    never = asyncio.Event()

    async def frozen_engine(path: str) -> tuple[int, bytes]:
        if path == "/v1/completions":
            await never.wait()  # the API server took it; the engine never answers
        return await vllm_like(path)

    async def no_key(path: str) -> tuple[int, bytes]:
        return 401, b'{"error":"Unauthorized"}'

    async with (
        HttpServer(frozen_engine) as frozen,
        HttpServer(no_key) as locked,
        Scraper() as scraper,
    ):
        lost = await scraper.canary(frozen.url, "tiny", 0.3)
        refused = await scraper.canary(locked.url, "tiny", 5.0)
        gone = await scraper.canary(refused_url(), "tiny", 5.0)
        model = await scraper.served_model(locked.url)
        never.set()
    assert lost.outcome == CanaryOutcome.TIMED_OUT and "no answer" in (lost.error or "")
    assert refused.outcome == CanaryOutcome.FAILED and refused.status == 401
    assert "Unauthorized" in (refused.error or "")
    assert gone.outcome == CanaryOutcome.FAILED and gone.status is None
    assert model is None


def _filtered(page: bytes, names: set[str]) -> bytes:
    """The page as prometheus_client answers a `name[]` query (tests/programs/vllm_emulator.py
    does the same): the samples named, with their families' HELP and TYPE lines."""
    from tests.programs.vllm_emulator import only_samples

    return only_samples(page, names)


async def test_only_the_series_vsup_reads_are_asked_for_and_read_the_same() -> None:
    from urllib.parse import parse_qs

    from vsup.telemetry.metrics import SCRAPED_NAMES, parse_metrics

    async def filtering(path: str) -> tuple[int, bytes]:
        route, _, query = path.partition("?")
        if route == "/metrics/":
            return 200, _filtered(PAYLOAD, set(parse_qs(query)["name[]"]))
        return await vllm_like(path)

    async with HttpServer(filtering) as server, Scraper(timeout_s=5) as scraper:
        result = await scraper.scrape(server.url, with_load=True, with_health=True)
        again = await scraper.scrape(server.url)
    route, _, query = server.requests[-1].partition("?")
    assert route == "/metrics/" and parse_qs(query)["name[]"] == list(SCRAPED_NAMES)
    assert result.ok and again.ok and result.server_load == 7 and result.health_status == 200
    assert result.size_bytes < len(PAYLOAD) / 5  # ~4 KB of ~55 KB
    assert result.metrics == parse_metrics(PAYLOAD.decode())  # nothing vsup reads is lost
    assert result.url.endswith("/metrics")  # people read the page's name, not the query


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (404, b'{"detail":"Not Found"}'),  # a server with no prometheus_client mount
        (200, b""),  # vLLM's multiprocess registry (several API servers) answers a query empty
    ],
)
async def test_a_server_that_does_not_filter_is_asked_for_the_whole_page(
    status: int, body: bytes
) -> None:
    async def no_filter(path: str) -> tuple[int, bytes]:
        if path.startswith("/metrics/?"):
            return status, body
        return await vllm_like(path)

    async with HttpServer(no_filter) as server, Scraper(timeout_s=5) as scraper:
        first = await scraper.scrape(server.url, with_load=True)
        second = await scraper.scrape(server.url, with_load=True)
    assert first.ok and second.ok and first.metrics.preemptions_total == 2.0
    asked = [p if not p.startswith("/metrics/?") else "filtered" for p in server.requests]
    assert asked == ["/load", "filtered", "/load", "/metrics", "/load", "/metrics"]
