"""Keep-alive HTTP/1.1 GETs to plain-http servers: what the daemon polls vLLM with, every second.

Why not httpx here: the daemon makes up to three requests per instance per second (/health,
/load and /metrics, pipelined: `get_all`), httpx's CPU per request is high even on a kept-alive
loopback connection, and its connection pool walks every pooled connection on every request
(O(N) per request, O(N^2) per poll), which made it most of the daemon's CPU at 64 instances.
This client writes the request line itself and reads the answer with asyncio streams, at a
small fraction of that cost. The
figures before and after: docs/benchmarks.md ("What the benchmarks changed",
`benchmarks/overhead.py`).

It does only what vLLM's endpoints need: GET (and a JSON POST: the stall canary),
`Content-Length` or chunked bodies (or a body until the server closes), keep-alive with one
pool of idle connections per host:port, a retry on a fresh connection when a kept-alive one
turns out closed (GETs only), a cap on the body size, one deadline per request. Errors are
`HttpError` subclasses carrying a message for people.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import urlsplit

DEFAULT_MAX_BODY = 8 << 20
MAX_IDLE_PER_HOST = 4
_HEAD_LIMIT = 64 << 10
_GETS_MAX = 4096  # remembered GET requests (a few per server)
_T = TypeVar("_T")


class HttpError(Exception):
    """A request that got no usable answer."""


class ConnectFailed(HttpError):
    """Nothing accepted the connection (refused, unreachable, or connecting timed out)."""


class Timeout(HttpError):
    """Connected, but no whole answer within the deadline."""


class ProtocolError(HttpError):
    """The answer was not HTTP/1.x as expected (or the server hung up mid-answer)."""


class TooLarge(HttpError):
    """The body passed the size cap."""


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes


_Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class _Stale(Exception):
    """A kept-alive connection that the server had closed before this request."""


class HttpGetter:
    """GETs over kept-alive connections. One per component (not thread-safe; asyncio only).

    `headers` are sent with every request (e.g. an Authorization header).
    """

    def __init__(
        self, headers: Mapping[str, str] | None = None, max_body: int = DEFAULT_MAX_BODY
    ) -> None:
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self._extra = extra
        self.max_body = max_body
        self._idle: dict[tuple[str, int], list[_Conn]] = {}
        self._closed = False
        # A GET's bytes by URL: the daemon asks the same few URLs of every server each second,
        # and building a request (urlsplit, formatting) was a tenth of a scrape's CPU.
        self._gets: dict[str, tuple[str, int, bytes]] = {}

    async def get(self, url: str, timeout: float, connect_timeout: float | None = None) -> Response:
        """GET `url` (http:// only). Raises HttpError; `timeout` bounds the whole request."""
        return await self.request("GET", url, timeout, connect_timeout)

    async def post_json(
        self,
        url: str,
        body: bytes,
        timeout: float,
        connect_timeout: float | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Response:
        """POST a JSON `body` to `url` (the canary's one completion). Never retried on a new
        connection once sent: a POST that reached the server must not run twice."""
        return await self.request("POST", url, timeout, connect_timeout, body, headers)

    async def request(
        self,
        method: str,
        url: str,
        timeout: float,
        connect_timeout: float | None = None,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Response:
        """One request over a kept-alive connection. Raises HttpError."""
        if method == "GET" and body is None and not headers:
            host, port, request = self._get_bytes(url)
        else:
            host, port, request = self._encode(method, url, body, headers)
        return await self._deadline(
            url,
            timeout,
            self._attempt(
                (host, port), url, host, port, request, body is None, connect_timeout or timeout
            ),  # fmt: skip
        )

    async def get_all(
        self, urls: Sequence[str], timeout: float, connect_timeout: float | None = None
    ) -> list[Response]:
        """GET every URL of one server (same host and port) in order, the requests written
        at once on one kept-alive connection (HTTP/1.1 pipelining: one write and the answers
        read back to back, instead of a round trip each). Raises HttpError when the
        connection fails; a server that closes the connection after an answer gets the rest
        asked again, one by one. `timeout` bounds the whole call."""
        if not urls:
            return []
        encoded = [self._get_bytes(url) for url in urls]
        host, port = encoded[0][0], encoded[0][1]
        if any((h, p) != (host, port) for h, p, _r in encoded):
            raise HttpError(f"{urls[0]}: get_all asks one server; got {', '.join(urls)}")
        return await self._deadline(
            urls[0],
            timeout,
            self._attempt_all(
                urls, host, port, [r for _h, _p, r in encoded], connect_timeout or timeout
            ),  # fmt: skip
        )

    def get_bytes(self, url: str) -> tuple[str, int, bytes]:
        """(host, port, the request's bytes) of a GET of `url` without extra headers,
        remembered by URL (telemetry/batch.py writes them itself). Raises HttpError."""
        return self._get_bytes(url)

    def _get_bytes(self, url: str) -> tuple[str, int, bytes]:
        """`_encode` of a GET without extra headers, remembered by URL."""
        encoded = self._gets.get(url)
        if encoded is None:
            if len(self._gets) >= _GETS_MAX:
                self._gets.clear()
            encoded = self._gets[url] = self._encode("GET", url, None, None)
        return encoded

    def _encode(
        self, method: str, url: str, body: bytes | None, headers: Mapping[str, str] | None
    ) -> tuple[str, int, bytes]:
        """(host, port, the request's bytes); raises HttpError for a URL this client cannot
        ask."""
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise HttpError(f"{url}: only http://HOST[:PORT]/PATH URLs are supported here")
        host, port = parts.hostname, parts.port or 80
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        netloc = f"[{host}]" if ":" in host else host
        extra = self._extra + "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        if body is not None:
            extra += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        request = (
            f"{method} {path} HTTP/1.1\r\nHost: {netloc}:{port}\r\nUser-Agent: vsup\r\n"
            f"Accept: */*\r\n{extra}\r\n"
        ).encode("latin-1") + (body or b"")
        return host, port, request

    async def _deadline(self, url: str, timeout: float, work: Awaitable[_T]) -> _T:
        """Await `work` within `timeout` (HttpGetter.Timeout after it)."""
        # One deadline for the whole request: a timer that cancels this task, as
        # asyncio.timeout() does, without its machinery (a fifth of a kept-alive GET's CPU
        # here, and the daemon makes three a second per instance).
        task = asyncio.current_task()
        assert task is not None
        cancelling = task.cancelling()
        expired = False

        def expire() -> None:
            nonlocal expired
            expired = True
            task.cancel()

        timer = asyncio.get_running_loop().call_later(timeout, expire)
        try:
            return await work
        except asyncio.CancelledError:
            if expired and task.uncancel() <= cancelling:
                raise Timeout(f"{url}: no answer within {timeout:g} s") from None
            raise
        except TimeoutError:  # connecting took longer than connect_timeout
            raise Timeout(f"{url}: no answer within {timeout:g} s") from None
        finally:
            timer.cancel()

    async def _attempt(
        self,
        key: tuple[str, int],
        url: str,
        host: str,
        port: int,
        request: bytes,
        reuse: bool,
        connect_timeout: float,
    ) -> Response:
        # A POST goes on a fresh connection (`reuse` False): a kept-alive one the server closed
        # meanwhile would need a retry, and a retried POST may run twice.
        conn = self._take(key) if reuse else None
        if conn is not None:
            try:
                return await self._exchange(key, conn, request)
            except _Stale:
                pass  # the server closed it while idle: one try on a new connection
        conn = await self._connect(host, port, connect_timeout)
        try:
            return await self._exchange(key, conn, request)
        except _Stale as exc:
            raise ProtocolError(
                f"{url}: the server closed the connection without answering"
            ) from exc

    async def _attempt_all(
        self,
        urls: Sequence[str],
        host: str,
        port: int,
        requests: list[bytes],
        connect_timeout: float,
    ) -> list[Response]:
        key = (host, port)
        conn = self._take(key)
        if conn is not None:
            try:
                return await self._pipelined(key, conn, urls, requests, connect_timeout)
            except _Stale:
                pass  # the server closed it while idle: one try on a new connection
        conn = await self._connect(host, port, connect_timeout)
        try:
            return await self._pipelined(key, conn, urls, requests, connect_timeout)
        except _Stale as exc:
            raise ProtocolError(
                f"{urls[0]}: the server closed the connection without answering"
            ) from exc

    async def _pipelined(
        self,
        key: tuple[str, int],
        conn: _Conn,
        urls: Sequence[str],
        requests: list[bytes],
        connect_timeout: float,
    ) -> list[Response]:
        reader, writer = conn
        keep = False
        out: list[Response] = []
        try:
            try:
                writer.write(b"".join(requests))
            except (ConnectionResetError, BrokenPipeError):
                raise _Stale() from None
            for _ in requests:
                try:
                    response, keep = await self._read_answer(reader)
                except _Stale:
                    if not out:
                        raise
                    keep = False  # it closed after an answer: the rest are asked again
                    break
                out.append(response)
                if not keep:
                    break
        finally:
            self._release(key, conn, keep)
        for url in urls[len(out) :]:
            # the server ended the connection after an answer: the rest one by one
            request = requests[len(out)]
            out.append(
                await self._attempt(key, url, key[0], key[1], request, True, connect_timeout)
            )
        return out

    async def aclose(self) -> None:
        self._closed = True
        for conns in self._idle.values():
            for _r, w in conns:
                w.close()
        self._idle.clear()

    # -- internals ------------------------------------------------------------------------

    def _take(self, key: tuple[str, int]) -> _Conn | None:
        conns = self._idle.get(key)
        while conns:
            reader, writer = conns.pop()
            # the server closed it while it was idle
            if reader.at_eof() or writer.is_closing():
                writer.close()
                continue
            return reader, writer
        return None

    async def _connect(self, host: str, port: int, timeout: float) -> _Conn:
        try:
            async with asyncio.timeout(timeout):
                return await asyncio.open_connection(host, port, limit=_HEAD_LIMIT)
        except TimeoutError:
            raise ConnectFailed(f"connecting to {host}:{port} took over {timeout:g} s") from None
        except OSError as exc:
            raise ConnectFailed(
                f"connection to {host}:{port} refused or unreachable ({exc.strerror or exc})"
            ) from None

    async def _exchange(self, key: tuple[str, int], conn: _Conn, request: bytes) -> Response:
        reader, writer = conn
        keep = False
        try:
            try:
                writer.write(request)
            except (ConnectionResetError, BrokenPipeError):
                raise _Stale() from None
            response, keep = await self._read_answer(reader)
            return response
        finally:
            self._release(key, conn, keep)

    async def _read_answer(self, reader: asyncio.StreamReader) -> tuple[Response, bool]:
        """One answer off the connection, and whether the connection may be used again.
        Raises _Stale when the server closed the connection before the answer began."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as exc:
            if not exc.partial:
                raise _Stale() from None
            raise ProtocolError("the server hung up in the middle of its answer") from None
        except (ConnectionResetError, BrokenPipeError):
            raise _Stale() from None
        except asyncio.LimitOverrunError:
            raise ProtocolError("the answer's headers are over 64 KiB") from None
        status, headers, version = parse_head(head)
        try:
            body, until_eof = await self._body(reader, headers)
        except asyncio.IncompleteReadError:
            raise ProtocolError("the server hung up in the middle of its answer") from None
        except (ConnectionError, ValueError) as exc:
            raise ProtocolError(f"bad answer body ({exc})") from None
        conn_hdr = headers.get("connection", "").lower()
        keep = not until_eof and (
            "keep-alive" in conn_hdr if version == "HTTP/1.0" else "close" not in conn_hdr
        )
        return Response(status, body), keep

    def _release(self, key: tuple[str, int], conn: _Conn, keep: bool) -> None:
        """Back to the idle pool when it may be used again, else closed."""
        writer = conn[1]
        if keep and not self._closed:
            idle = self._idle.setdefault(key, [])
            if len(idle) < MAX_IDLE_PER_HOST:
                idle.append(conn)
                return
        writer.close()

    async def _body(
        self, reader: asyncio.StreamReader, headers: dict[str, str]
    ) -> tuple[bytes, bool]:
        if "chunked" in headers.get("transfer-encoding", "").lower():
            parts: list[bytes] = []
            size = 0
            while True:
                line = await reader.readuntil(b"\r\n")
                n = int(line.split(b";", 1)[0].strip(), 16)
                if n == 0:
                    # trailers, then the blank line
                    while (await reader.readuntil(b"\r\n")) != b"\r\n":
                        pass
                    return b"".join(parts), False
                size += n
                if size > self.max_body:
                    raise TooLarge(f"the answer is over {self.max_body} bytes")
                parts.append(await reader.readexactly(n))
                await reader.readexactly(2)
        length = headers.get("content-length")
        if length is not None:
            n = int(length)
            if n > self.max_body:
                raise TooLarge(f"the answer is {n} bytes, over {self.max_body}")
            return (await reader.readexactly(n) if n else b""), False
        chunks, size = [], 0
        while chunk := await reader.read(1 << 16):
            size += len(chunk)
            if size > self.max_body:
                raise TooLarge(f"the answer is over {self.max_body} bytes")
            chunks.append(chunk)
        return b"".join(chunks), True


def parse_head(head: bytes) -> tuple[int, dict[str, str], str]:
    """(status, headers by lower-case name, HTTP version) of an answer's head (through the
    blank line). Raises ProtocolError."""
    lines = head.decode("latin-1").split("\r\n")
    first = lines[0].split(" ", 2)
    if len(first) < 2 or not first[0].startswith("HTTP/1.") or not first[1].isdigit():
        raise ProtocolError(f"not an HTTP/1.x answer: {lines[0][:80]!r}")
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return int(first[1]), headers, first[0]
