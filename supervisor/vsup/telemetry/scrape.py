"""Scraping vLLM servers: `/metrics` and `/health`, many at once, never raising.

One `Scraper` per daemon keeps one connection per server alive and reuses it every poll instead
of a handshake per scrape. Plain-http servers (every vLLM vsup runs) go through `httpget`, a
small asyncio HTTP/1.1 client much cheaper in CPU than httpx (docs/benchmarks.md) and O(1)
per request whatever the number of servers (httpx's pool walks all its connections on every
request); https URLs (`vsup probe` of a remote server) go through httpx. Every request has its
own timeout; `scrape_all` runs the requests concurrently and reports each result as it lands
(`on_result`), so a slow or dead server delays nobody else. Results carry errors as text;
nothing here raises for a server that misbehaves.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

import httpx

from vsup.telemetry import httpget
from vsup.telemetry.metrics import EMPTY, VllmMetrics, parse_metrics

DEFAULT_TIMEOUT_S = 2.0
# A /metrics payload is ~50 KB; a server answering megabytes is not a vLLM to trust.
MAX_PAYLOAD_BYTES = 8 << 20
_R = TypeVar("_R")  # what one fetch returns: a ScrapeResult or a HealthResult


@dataclass(frozen=True)
class ScrapeResult:
    """One `/metrics` scrape. `ok` means HTTP 200 and a payload that was parsed."""

    url: str
    ok: bool
    metrics: VllmMetrics
    status: int | None = None  # HTTP status, None when no answer came
    error: str | None = None  # why not ok, for people
    elapsed_s: float = 0.0
    parse_ms: float = 0.0
    size_bytes: int = 0
    text: str | None = None  # the payload, only when asked for (`keep_text`)


@dataclass(frozen=True)
class HealthResult:
    """One `/health` probe. vLLM answers 200 when ready and 503 when its engine is dead;
    before it is ready the port refuses connections (`status` None)."""

    url: str
    ok: bool
    status: int | None = None
    error: str | None = None
    elapsed_s: float = 0.0


class Scraper:
    """The daemon's one HTTP client for vLLM servers. Use as an async context manager or call
    `aclose()`. `transport` (an `httpx.MockTransport`) sends every request through httpx
    instead; real use leaves it None."""

    def __init__(
        self,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        *,
        max_connections: int = 256,
        transport: httpx.AsyncBaseTransport | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.timeout_s = timeout_s
        self._max_connections = max_connections
        self._transport = transport
        self._headers = dict(headers or {})
        self._fast = httpget.HttpGetter(self._headers, max_body=MAX_PAYLOAD_BYTES)
        self._client: httpx.AsyncClient | None = None

    async def __aenter__(self) -> Scraper:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._fast.aclose()
        if self._client is not None:
            await self._client.aclose()

    def _httpx(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(
                timeout=_timeout(self.timeout_s),
                limits=httpx.Limits(
                    max_connections=self._max_connections,
                    max_keepalive_connections=self._max_connections,
                    keepalive_expiry=30.0,
                ),
                transport=self._transport,
                headers=self._headers,
                # vLLM is on this node; a proxy from the environment would only get in the way.
                trust_env=False,
                follow_redirects=False,
            )
        return self._client

    async def _get(self, url: str, timeout_s: float) -> tuple[int, bytes]:
        """(status, body) of a GET; raises httpget.HttpError or httpx.HTTPError."""
        if self._transport is None and url.startswith("http://"):
            resp = await self._fast.get(url, timeout_s, connect_timeout=min(timeout_s, 1.0))
            return resp.status, resp.body
        r = await self._httpx().get(url, timeout=_timeout(timeout_s))
        return r.status_code, r.content

    async def scrape(
        self,
        base_url: str,
        *,
        timeout_s: float | None = None,
        keep_text: bool = False,
    ) -> ScrapeResult:
        """GET `base_url`/metrics and parse it. Never raises (except cancellation)."""
        url = _join(base_url, "/metrics")
        t0 = time.perf_counter()
        try:
            status, body = await self._get(url, timeout_s or self.timeout_s)
        except (httpx.HTTPError, httpget.HttpError) as exc:
            return ScrapeResult(
                url, False, EMPTY, error=_describe(exc, url), elapsed_s=time.perf_counter() - t0
            )
        elapsed = time.perf_counter() - t0
        if status != 200:
            return ScrapeResult(
                url,
                False,
                EMPTY,
                status=status,
                error=f"{url} answered HTTP {status}",
                elapsed_s=elapsed,
                size_bytes=len(body),
            )
        if len(body) > MAX_PAYLOAD_BYTES:
            return ScrapeResult(
                url,
                False,
                EMPTY,
                status=200,
                error=f"{url} sent {len(body)} bytes; not a vLLM /metrics page",
                elapsed_s=elapsed,
                size_bytes=len(body),
            )
        text = body.decode("utf-8", errors="replace")
        p0 = time.perf_counter()
        metrics = parse_metrics(text)
        parse_ms = (time.perf_counter() - p0) * 1e3
        error = None
        if not metrics.vllm_seen:
            error = (
                f"{url} has no vllm:* metrics (not a vLLM server, or one started with "
                "--disable-log-stats)"
            )
        return ScrapeResult(
            url,
            error is None,
            metrics,
            status=200,
            error=error,
            elapsed_s=elapsed,
            parse_ms=parse_ms,
            size_bytes=len(body),
            text=text if keep_text else None,
        )

    async def health(self, base_url: str, *, timeout_s: float | None = None) -> HealthResult:
        """GET `base_url`/health. Never raises (except cancellation)."""
        url = _join(base_url, "/health")
        t0 = time.perf_counter()
        try:
            status, _body = await self._get(url, timeout_s or self.timeout_s)
        except (httpx.HTTPError, httpget.HttpError) as exc:
            return HealthResult(
                url, False, error=_describe(exc, url), elapsed_s=time.perf_counter() - t0
            )
        ok = status == 200
        return HealthResult(
            url,
            ok,
            status=status,
            error=None if ok else f"{url} answered HTTP {status}",
            elapsed_s=time.perf_counter() - t0,
        )

    async def scrape_all(
        self,
        targets: Mapping[str, str],
        on_result: Callable[[str, ScrapeResult], Awaitable[None] | None] | None = None,
    ) -> dict[str, ScrapeResult]:
        """Scrape every `name -> base_url` concurrently. `on_result(name, result)` (plain or
        async) is called as each one completes, so results of fast servers are used before slow
        ones time out. Returns every result once all are done (at most one timeout after the
        call). The scrapes never raise; an exception from `on_result` is the caller's bug and
        cancels the rest (it propagates in an ExceptionGroup)."""
        return await self._all(targets, self.scrape, on_result)

    async def health_all(
        self,
        targets: Mapping[str, str],
        on_result: Callable[[str, HealthResult], Awaitable[None] | None] | None = None,
    ) -> dict[str, HealthResult]:
        """`/health` of every `name -> base_url`, concurrently, like `scrape_all`."""
        return await self._all(targets, self.health, on_result)

    async def _all(
        self,
        targets: Mapping[str, str],
        fetch: Callable[[str], Awaitable[_R]],
        on_result: Callable[[str, _R], Awaitable[None] | None] | None,
    ) -> dict[str, _R]:
        results: dict[str, _R] = {}

        async def one(name: str, base_url: str) -> None:
            result = await fetch(base_url)
            results[name] = result
            if on_result is not None:
                out = on_result(name, result)
                if asyncio.iscoroutine(out):
                    await out

        async with asyncio.TaskGroup() as group:
            for name, base_url in targets.items():
                group.create_task(one(name, base_url))
        return results


def _timeout(seconds: float) -> httpx.Timeout:
    # Connecting to loopback is instant or refused; a long connect wait means a wedged host.
    return httpx.Timeout(seconds, connect=min(seconds, 1.0))


def _join(base_url: str, path: str) -> str:
    return base_url.rstrip("/") + path


def _describe(exc: httpx.HTTPError | httpget.HttpError, url: str) -> str:
    if isinstance(exc, httpget.ConnectFailed):
        return f"{url}: connection refused or unreachable ({exc})"
    if isinstance(exc, httpget.Timeout):
        return f"{url}: no answer within the timeout ({exc})"
    if isinstance(exc, httpget.TooLarge):
        return f"{url}: {exc}; not a vLLM /metrics page"
    if isinstance(exc, httpget.HttpError):
        return f"{url}: {exc}"
    if isinstance(exc, httpx.ConnectError):
        return f"{url}: connection refused or unreachable ({exc or type(exc).__name__})"
    if isinstance(exc, httpx.TimeoutException):
        return f"{url}: no answer within the timeout ({type(exc).__name__})"
    return f"{url}: {type(exc).__name__}: {exc}"
