"""Keep-alive HTTP/1.1 GETs to plain-http servers: what the daemon polls vLLM with, every second.

Why not httpx here: the daemon makes two requests per instance per second (/health and
/metrics), httpx's CPU per request is high even on a kept-alive loopback connection, and its
connection pool walks every pooled connection on every request (O(N) per request, O(N^2) per
poll), which made it most of the daemon's CPU at 64 instances. This client writes the request
line itself and reads the answer with asyncio streams, at a small fraction of that cost. The
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
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

DEFAULT_MAX_BODY = 8 << 20
MAX_IDLE_PER_HOST = 4
_HEAD_LIMIT = 64 << 10


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
        key = (host, port)
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
            return await self._attempt(key, url, host, port, request, body is None,
                                       connect_timeout or timeout)  # fmt: skip
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
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError as exc:
                if not exc.partial:
                    raise _Stale() from None
                raise ProtocolError("the server hung up in the middle of its answer") from None
            except (ConnectionResetError, BrokenPipeError):
                raise _Stale() from None
            except asyncio.LimitOverrunError:
                raise ProtocolError("the answer's headers are over 64 KiB") from None
            status, headers, version = _parse_head(head)
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
            return Response(status, body)
        finally:
            if keep and not self._closed:
                idle = self._idle.setdefault(key, [])
                if len(idle) < MAX_IDLE_PER_HOST:
                    idle.append(conn)
                else:
                    writer.close()
            else:
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


def _parse_head(head: bytes) -> tuple[int, dict[str, str], str]:
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
