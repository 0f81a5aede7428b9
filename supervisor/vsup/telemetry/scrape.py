"""Scraping vLLM servers: `/metrics`, `/load` and `/health`, many at once, never raising.

One `Scraper` per daemon keeps one connection per server alive and reuses it every poll instead
of a handshake per scrape. Plain-http servers (every vLLM vsup runs) go through `httpget`, a
small asyncio HTTP/1.1 client much cheaper in CPU than httpx (docs/benchmarks.md) and O(1)
per request whatever the number of servers (httpx's pool walks all its connections on every
request); https URLs (`vsup probe` of a remote server) go through httpx. Every request has its
own timeout; `scrape_all` runs the requests concurrently and reports each result as it lands
(`on_result`), so a slow or dead server delays nobody else. Results carry errors as text;
nothing here raises for a server that misbehaves.

`/load` (`{"server_load": N}`, vLLM's `--enable-server-load-tracking`: the API server's own
count of requests in flight) is read with the scrape when asked (`with_load`), and `/health`
too (`with_health`: the daemon's engine takes that answer as its check of a ready instance);
on a plain-http server the scrape's requests are written at once on one kept-alive connection
(HTTP/1.1 pipelining: vLLM's uvicorn answers them in order), which costs about half the CPU of
three round trips. Without the load flag vLLM answers 0 whatever runs, so /load is asked only
of servers started with it. `canary()` is stall detection's one request
to an idle server (telemetry/stall.py): a `max_tokens = 1` completion with a deadline.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any, TypeVar
from urllib.parse import urlencode

import httpx

from vsup.telemetry import httpget
from vsup.telemetry.metrics import EMPTY, SCRAPED_NAMES, VllmMetrics, parse_metrics

DEFAULT_TIMEOUT_S = 2.0
# A /metrics payload is ~50 KB; a server answering megabytes is not a vLLM to trust.
MAX_PAYLOAD_BYTES = 8 << 20
_R = TypeVar("_R")  # what one fetch returns: a ScrapeResult or a HealthResult
# Only the series vsup reads: prometheus_client's exposition (vLLM mounts it at `/metrics/`, its
# `/metrics` without the slash is prometheus-fastapi-instrumentator's page, which ignores the
# query) answers just the samples `name[]` names: ~4 KB instead of ~55 KB, less to parse here
# and less for the API server to render every second. A server whose filtered page shows no
# vLLM series (vLLM's multiprocess registry with several API servers answers it empty, an older
# server 404) is asked for the whole page from then on.
_FILTERED_METRICS = "/metrics/?" + urlencode([("name[]", n) for n in SCRAPED_NAMES])


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
    # `/load`'s requests in flight at the API server (asked with `with_load`); None: not
    # asked, or no usable answer (`load_error` says why)
    server_load: int | None = None
    load_error: str | None = None
    # `/health`'s HTTP status (asked with `with_health`); None: not asked, or no answer
    health_status: int | None = None


class CanaryOutcome(StrEnum):
    ANSWERED = "answered"  # HTTP 200 with a completion
    TIMED_OUT = "timed_out"  # connected, no answer within the deadline: a frozen engine
    FAILED = "failed"  # refused, an HTTP error, a bad answer: not a stall (see `error`)


@dataclass(frozen=True)
class CanaryResult:
    """One canary request (`Scraper.canary`)."""

    url: str
    outcome: CanaryOutcome
    status: int | None = None
    error: str | None = None
    elapsed_s: float = 0.0


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
        self.headers: Mapping[str, str] = self._headers
        self.max_body = MAX_PAYLOAD_BYTES
        self._fast = httpget.HttpGetter(self._headers, max_body=MAX_PAYLOAD_BYTES)
        self._client: httpx.AsyncClient | None = None
        self._whole_page: set[str] = set()  # servers that do not filter /metrics (above)

    @property
    def batchable(self) -> bool:
        """Whether a `ScrapeBatch` (telemetry/batch.py) may read for this scraper: not when
        requests go through a test transport."""
        return self._transport is None

    def metrics_url(self, base_url: str, keep_text: bool) -> str:
        """What to GET for `base_url`'s metrics: the filtered page, unless the server does
        not filter or the caller wants the whole payload."""
        if keep_text or base_url in self._whole_page:
            return _join(base_url, "/metrics")
        return _join(base_url, _FILTERED_METRICS)

    def filter_failed(self, base_url: str, keep_text: bool, result: ScrapeResult) -> bool:
        """Whether a filtered page said nothing vsup can use: the server is then asked for
        the whole page, now and from then on."""
        if keep_text or base_url in self._whole_page:
            return False
        if result.status in (404, 405) or (result.status == 200 and not result.metrics.vllm_seen):
            self._whole_page.add(base_url)
            return True
        return False

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
        with_load: bool = False,
        with_health: bool = False,
    ) -> ScrapeResult:
        """GET `base_url`/metrics and parse it; with `with_load`, `/load` first, and with
        `with_health`, `/health` before that (its status in `health_status`). On a plain-http
        server the requests go out together on one kept-alive connection (pipelined: one
        write, the answers read back to back). Only the series vsup reads are asked for
        (`_FILTERED_METRICS`). Never raises (except cancellation)."""
        result = await self._scrape(base_url, timeout_s, keep_text, with_load, with_health)
        if self.filter_failed(base_url, keep_text, result):
            result = await self._scrape(base_url, timeout_s, keep_text, with_load, with_health)
        return result

    async def _scrape(
        self,
        base_url: str,
        timeout_s: float | None,
        keep_text: bool,
        with_load: bool,
        with_health: bool,
    ) -> ScrapeResult:
        if not (with_load or with_health):
            return await self._metrics(base_url, timeout_s, keep_text)
        if self._transport is None and base_url.startswith("http://"):
            return await self._together(base_url, timeout_s, keep_text, with_load, with_health)
        health = await self.health(base_url, timeout_s=timeout_s) if with_health else None
        load, load_error = (
            await self.load(base_url, timeout_s=timeout_s) if with_load else (None, None)
        )
        result = await self._metrics(base_url, timeout_s, keep_text)
        return replace(
            result,
            server_load=load,
            load_error=load_error,
            health_status=health.status if health is not None else None,
        )

    async def _together(
        self,
        base_url: str,
        timeout_s: float | None,
        keep_text: bool,
        with_load: bool,
        with_health: bool,
    ) -> ScrapeResult:
        """`scrape` of a plain-http server: its GETs pipelined on one connection."""
        timeout = timeout_s or self.timeout_s
        urls = [_join(base_url, "/health")] if with_health else []
        if with_load:
            urls.append(_join(base_url, "/load"))
        url = _join(base_url, "/metrics")
        urls.append(self.metrics_url(base_url, keep_text))
        t0 = time.perf_counter()
        try:
            answers = await self._fast.get_all(urls, timeout, connect_timeout=min(timeout, 1.0))
        except httpget.HttpError as exc:
            return ScrapeResult(
                url,
                False,
                EMPTY,
                error=_describe(exc, url),
                elapsed_s=time.perf_counter() - t0,
                load_error=_describe(exc, urls[-2]) if with_load else None,
            )
        elapsed = time.perf_counter() - t0
        health_status = answers[0].status if with_health else None
        load, load_error = None, None
        if with_load:
            answer = answers[-2]
            load, load_error = _load_answer(urls[-2], answer.status, answer.body)
        result = self._metrics_answer(url, answers[-1].status, answers[-1].body, elapsed, keep_text)
        return replace(result, server_load=load, load_error=load_error, health_status=health_status)

    async def load(
        self, base_url: str, *, timeout_s: float | None = None
    ) -> tuple[int | None, str | None]:
        """`/load`'s `server_load` (requests in flight at the API server), or None and why.
        Never raises (except cancellation)."""
        url = _join(base_url, "/load")
        try:
            status, body = await self._get(url, timeout_s or self.timeout_s)
        except (httpx.HTTPError, httpget.HttpError) as exc:
            return None, _describe(exc, url)
        return _load_answer(url, status, body)

    async def served_model(
        self, base_url: str, *, headers: Mapping[str, str] | None = None
    ) -> str | None:
        """The first model id `/v1/models` lists (what a completion names), or None."""
        url = _join(base_url, "/v1/models")
        try:
            if self._transport is None and url.startswith("http://"):
                resp = await self._fast.request(
                    "GET", url, self.timeout_s, min(self.timeout_s, 1.0), headers=headers
                )
                status, body = resp.status, resp.body
            else:
                r = await self._httpx().get(url, headers=dict(headers or {}))
                status, body = r.status_code, r.content
            if status != 200:
                return None
            model = json.loads(body)["data"][0]["id"]
        except (httpx.HTTPError, httpget.HttpError, ValueError, KeyError, IndexError, TypeError):
            return None
        return model if isinstance(model, str) and model else None

    async def canary(
        self,
        base_url: str,
        model: str,
        timeout_s: float,
        *,
        rank: int | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> CanaryResult:
        """One `max_tokens = 1` completion of a one-character prompt, answered within
        `timeout_s` or not. `rank` pins a data-parallel rank (vLLM's `X-data-parallel-rank`
        header). Never raises (except cancellation)."""
        url = _join(base_url, "/v1/completions")
        body = json.dumps({"model": model, "prompt": ".", "max_tokens": 1}).encode()
        sent = dict(headers or {})
        if rank is not None:
            sent["X-data-parallel-rank"] = str(rank)
        t0 = time.perf_counter()
        try:
            status, answer = await self._post(url, body, sent, timeout_s)
        except (httpget.Timeout, httpx.TimeoutException) as exc:
            # connecting is bounded apart (1 s): a timeout after that is a server that took
            # the request and gave nothing back
            if isinstance(exc, httpx.ConnectTimeout):
                outcome = CanaryOutcome.FAILED
            else:
                outcome = CanaryOutcome.TIMED_OUT
            return CanaryResult(
                url, outcome, error=_describe(exc, url), elapsed_s=time.perf_counter() - t0
            )
        except (httpx.HTTPError, httpget.HttpError) as exc:
            return CanaryResult(
                url,
                CanaryOutcome.FAILED,
                error=_describe(exc, url),
                elapsed_s=time.perf_counter() - t0,
            )
        elapsed = time.perf_counter() - t0
        if status != 200:
            text = answer[:200].decode("utf-8", "replace")
            return CanaryResult(
                url,
                CanaryOutcome.FAILED,
                status=status,
                error=f"{url} answered HTTP {status}: {text}",
                elapsed_s=elapsed,
            )
        return CanaryResult(url, CanaryOutcome.ANSWERED, status=200, elapsed_s=elapsed)

    async def _post(
        self, url: str, body: bytes, headers: dict[str, str], timeout_s: float
    ) -> tuple[int, bytes]:
        """POST a JSON `body`: through the fast client for plain http (connecting bounded to
        1 s), else httpx. The status and the answer's bytes."""
        if self._transport is None and url.startswith("http://"):
            resp = await self._fast.post_json(
                url, body, timeout_s, connect_timeout=min(timeout_s, 1.0), headers=headers
            )
            return resp.status, resp.body
        r = await self._httpx().post(
            url,
            content=body,
            headers={**headers, "Content-Type": "application/json"},
            timeout=_timeout(timeout_s),
        )
        return r.status_code, r.content

    async def _metrics(
        self, base_url: str, timeout_s: float | None, keep_text: bool
    ) -> ScrapeResult:
        url = _join(base_url, "/metrics")
        t0 = time.perf_counter()
        try:
            status, body = await self._get(
                self.metrics_url(base_url, keep_text), timeout_s or self.timeout_s
            )
        except (httpx.HTTPError, httpget.HttpError) as exc:
            return ScrapeResult(
                url, False, EMPTY, error=_describe(exc, url), elapsed_s=time.perf_counter() - t0
            )
        return self._metrics_answer(url, status, body, time.perf_counter() - t0, keep_text)

    @staticmethod
    def _metrics_answer(
        url: str, status: int, body: bytes, elapsed: float, keep_text: bool, **extra: Any
    ) -> ScrapeResult:
        """The ScrapeResult of `/metrics`'s answer; `extra`: its other fields (`/load`'s and
        `/health`'s answers), set at once rather than by a `replace` after."""
        if status != 200:
            return ScrapeResult(
                url,
                False,
                EMPTY,
                status=status,
                error=f"{url} answered HTTP {status}",
                elapsed_s=elapsed,
                size_bytes=len(body),
                **extra,
            )
        return _read_page(url, body, elapsed, keep_text, **extra)

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


def _load_answer(url: str, status: int, body: bytes) -> tuple[int | None, str | None]:
    """`/load`'s answer: its `server_load`, or None and why."""
    if status != 200:
        return None, f"{url} answered HTTP {status}"
    try:
        value = json.loads(body)["server_load"]
    except (ValueError, KeyError, TypeError):
        return None, f"{url} sent no server_load: {body[:80]!r}"
    if isinstance(value, bool) or not isinstance(value, int):
        return None, f"{url} sent server_load {value!r}, not a count"
    return value, None


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


def _read_page(
    url: str, body: bytes, elapsed: float, keep_text: bool, **extra: Any
) -> ScrapeResult:
    """A /metrics page answered 200: refused when too big, else parsed (and timed); not ok
    without vllm:* metrics."""
    if len(body) > MAX_PAYLOAD_BYTES:
        return ScrapeResult(
            url,
            False,
            EMPTY,
            status=200,
            error=f"{url} sent {len(body)} bytes; not a vLLM /metrics page",
            elapsed_s=elapsed,
            size_bytes=len(body),
            **extra,
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
        **extra,
    )
