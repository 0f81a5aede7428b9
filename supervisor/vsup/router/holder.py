"""Wake on request: the router's worker for a model none of whose instances is awake.

While every instance of a model sleeps (or falls asleep, or wakes), the router's worker for
that model is a `Holder`: a small HTTP endpoint in the daemon (127.0.0.1, an ephemeral port,
plain asyncio streams) that answers the router's `/health` and `/v1/models` (the router learns
the worker's model from it) and holds each request it gets: it asks the engine to wake an
instance (`wake`, one wake at a time per model), then forwards the held requests to it byte for
byte (a streamed answer streams through). Once the instance is awake the router routes to vLLM
again and the holder leaves it: Python is off the path of requests to awake models.

Bounds (`[router] hold_s`, `hold_queue`): a held request waits at most `hold_s`, then gets
REFUSED_STATUS (507) with `Retry-After` and a JSON body that says why; a request beyond
`hold_queue` held ones gets the same at once; a client that goes away is dropped from the
queue; a wake that fails ends every held request at once with its reason. A request for a
model this holder does not stand for gets vLLM's own 404 (`The model ... does not exist.`). No
engine code here: the engine hands `wake` in (engine/routing.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("vsup.router")

# The status of a refusal. Not 503: vllm-router 0.1.17 retries a worker's 500, 502, 503 and 504
# (retry-max-retries times) and counts each toward the worker's circuit breaker, which opens
# after 5 or 6 and then fails every request for the model with its own text/plain 503 "No
# available workers" until it closes; 408 and 429 it retries too (each retry would be held
# again). Any other status it passes through with its headers and body, once (measured,
# docs/sleep.md). 507 is a server-side condition (clients that retry 5xx retry it, honouring
# Retry-After) that the router leaves alone.
REFUSED_STATUS = 507
HEAD_LIMIT = 64 * 1024  # request line + headers
BODY_LIMIT = 64 * 1024 * 1024  # a request body (prompts can be long)
CONNECT_TIMEOUT_S = 10.0  # to the woken vLLM
# The headers a hop owns: the forwarded request gets its own (Connection: close).
_HOP = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "host",
    "content-length",
}


class Refusal(Exception):
    """A held request ends without vLLM's answer: REFUSED_STATUS, `why` and Retry-After."""

    def __init__(self, why: str, retry_after_s: int, kind: str) -> None:
        super().__init__(why)
        self.why = why
        self.retry_after_s = retry_after_s
        self.kind = kind  # timeout | full | wake_failed


@dataclass
class HoldCounts:
    """What a holder did since the daemon started (the status and the journal say it)."""

    held: int = 0  # held now
    total: int = 0  # ever held
    forwarded: int = 0  # sent on to an awake vLLM
    timed_out: int = 0  # waited hold_s
    full: int = 0  # refused: hold_queue were held
    dropped: int = 0  # the client went away while held
    failed: int = 0  # ended by a wake that failed
    not_found: int = 0  # asked for another model (404)


@dataclass
class HoldQueue:
    """The bounds of one model's held requests, apart from any I/O (unit-tested alone).

    `admit` takes a request in or raises `Refusal` (full); `wait` returns the base URL to
    forward to once the current wake succeeds, or raises `Refusal` (its wake failed, or
    `hold_s` passed); `leave` counts how a request left. The wake itself is `start_wake`'s
    coroutine, one at a time: requests that arrive while it runs wait for the same one."""

    hold_s: float
    capacity: int
    counts: HoldCounts = field(default_factory=HoldCounts)
    # the requests of the wake under way (or just ended): what the journal says of it
    episode: HoldCounts | None = None
    _wake: asyncio.Future[str] | None = None

    def _count(self, how: str) -> None:
        for c in (self.counts, self.episode):
            if c is not None:
                setattr(c, how, getattr(c, how) + 1)

    def admit(self) -> None:
        if self.counts.held >= self.capacity:
            self._count("full")
            raise Refusal(
                f"{self.counts.held} requests are already held for this model's wake "
                f"(hold_queue = {self.capacity}): try again shortly",
                max(1, round(self.hold_s / 4)),
                "full",
            )
        self.counts.held += 1
        self.counts.total += 1

    def leave(self, how: str) -> None:
        """A held request left the queue: forwarded, timed_out, dropped or failed."""
        self.counts.held = max(0, self.counts.held - 1)
        self._count(how)

    def ended(self) -> HoldCounts | None:
        """The episode of a wake that is over and whose requests all left (once), else None."""
        if self.episode is None or self.waking or self.counts.held:
            return None
        episode, self.episode = self.episode, None
        return episode

    @property
    def waking(self) -> bool:
        return self._wake is not None and not self._wake.done()

    def start_wake(self, wake: Callable[[], Awaitable[str]]) -> asyncio.Future[str]:
        """The wake under way, or a new one: a future of the URL to forward to."""
        if self._wake is None or self._wake.done():
            self.episode = HoldCounts(held=self.counts.held)
            self._wake = asyncio.ensure_future(wake())
            # nobody may be left to read it (every held request gone): retrieve the outcome
            self._wake.add_done_callback(lambda f: f.cancelled() or f.exception())
        return self._wake

    async def wait(self, wake: Callable[[], Awaitable[str]], waited_s: float = 0.0) -> str:
        """The URL to forward to, once a wake succeeded; Refusal when it fails or hold_s
        (less `waited_s` already spent) passes."""
        fut = self.start_wake(wake)
        left = max(0.0, self.hold_s - waited_s)
        try:
            return await asyncio.wait_for(asyncio.shield(fut), left)
        except TimeoutError:
            raise Refusal(
                f"the model was not awake within hold_s = {self.hold_s:g} s (its wake goes on)",
                max(1, round(self.hold_s / 4)),
                "timeout",
            ) from None
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the wake failed: every request waiting for it ends now
            raise Refusal(f"the model could not be woken: {exc}", 5, "wake_failed") from exc


@dataclass
class _Request:
    method: str
    target: str
    version: str
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k.lower() == name), None)


class BadRequest(Exception):
    pass


async def read_request(reader: asyncio.StreamReader) -> _Request | None:
    """One HTTP/1.1 request off `reader` (None: the peer closed before sending one)."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise BadRequest("the request ended inside its headers") from exc
    except asyncio.LimitOverrunError as exc:
        raise BadRequest("request headers too long") from exc
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3:
        raise BadRequest(f"not an HTTP request line: {lines[0][:80]!r}")
    headers = []
    for line in lines[1:]:
        if not line:
            continue
        k, sep, v = line.partition(":")
        if not sep:
            raise BadRequest(f"bad header line {line[:80]!r}")
        headers.append((k.strip(), v.strip()))
    req = _Request(parts[0], parts[1], parts[2], headers, b"")
    if (req.header("transfer-encoding") or "").lower() == "chunked":
        chunks = []
        size = 0
        while True:
            n = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if n == 0:
                await reader.readuntil(b"\r\n")
                break
            size += n
            if size > BODY_LIMIT:
                raise BadRequest("request body too large")
            chunks.append(await reader.readexactly(n))
            await reader.readexactly(2)
        req.body = b"".join(chunks)
    else:
        n = int(req.header("content-length") or 0)
        if n > BODY_LIMIT:
            raise BadRequest("request body too large")
        req.body = await reader.readexactly(n) if n else b""
    return req


def _response(status: int, reason: str, doc: Any, extra: dict[str, str] | None = None) -> bytes:
    body = json.dumps(doc).encode()
    head = [
        f"HTTP/1.1 {status} {reason}",
        "content-type: application/json",
        f"content-length: {len(body)}",
        "connection: close",
        *(f"{k}: {v}" for k, v in (extra or {}).items()),
    ]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def not_found(model: str, served: str) -> bytes:
    """vLLM's own answer for a model it does not serve (vLLM 0.32: vllm/entrypoints/serve/
    engine/serving.py `_check_model`, ErrorResponse), `served` being the name it serves."""
    doc = {
        "error": {
            "message": f"The model `{model}` does not exist. Valid aliases: {served}.",
            "type": "NotFoundError",
            "param": "model",
            "code": 404,
        }
    }
    return _response(404, "Not Found", doc)


def refused(r: Refusal, model: str) -> bytes:
    doc = {
        "error": {
            "message": f"model `{model}`: {r.why}",
            "type": "ServiceUnavailableError",
            "param": "model",
            "code": REFUSED_STATUS,
            "vsup": r.kind,
        }
    }
    extra = {"retry-after": str(r.retry_after_s)}
    return _response(REFUSED_STATUS, "Insufficient Storage", doc, extra)


class Holder:
    """One model's holding endpoint (see the module doc). `wake()` wakes an instance of the
    model and returns the base URL to forward to (raises with the reason when it cannot)."""

    def __init__(
        self,
        model: str,
        wake: Callable[[], Awaitable[str]],
        hold_s: float,
        capacity: int,
        names: tuple[str, ...] = (),
        on_change: Callable[[], None] | None = None,
        on_end: Callable[[HoldCounts, str | None], None] | None = None,
    ) -> None:
        self.model = model
        self.names = {model, *names}  # what a request may ask for (the served name, the path)
        self._wake = wake
        self.queue = HoldQueue(hold_s, capacity)
        self.on_change = on_change or (lambda: None)
        # a wake's requests all left: (their counts, the wake's error or None)
        self.on_end = on_end or (lambda _counts, _error: None)
        self._server: asyncio.Server | None = None
        self.port: int | None = None
        self.last_error: str | None = None
        self._tasks: set[asyncio.Task] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def set_bounds(self, hold_s: float, capacity: int) -> None:
        self.queue.hold_s, self.queue.capacity = hold_s, capacity

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._serve, "127.0.0.1", 0, limit=HEAD_LIMIT, reuse_address=True
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
            for task in list(self._tasks):
                task.cancel()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            while True:
                try:
                    req = await read_request(reader)
                except (BadRequest, ValueError, asyncio.IncompleteReadError) as exc:
                    writer.write(_response(400, "Bad Request", {"error": {"message": str(exc)}}))
                    break
                if req is None:
                    break
                if not await self._one(req, reader, writer):
                    break
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            if task is not None:
                self._tasks.discard(task)
            with contextlib.suppress(Exception):
                writer.close()

    async def _one(
        self, req: _Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        """Answer one request; True when the connection may carry another."""
        path = req.target.split("?", 1)[0]
        if req.method == "GET" and path in ("/health", "/liveness", "/readiness"):
            writer.write(_keepalive(200, "OK", b""))
            await writer.drain()
            return True
        if req.method == "GET" and path == "/v1/models":
            doc = {"object": "list", "data": [{"id": self.model, "object": "model"}]}
            writer.write(_keepalive(200, "OK", json.dumps(doc).encode()))
            await writer.drain()
            return True
        if req.method != "POST" or path.endswith("/render") or path == "/tokenize":
            # vllm-router asks a worker to render (then tokenize) a prompt before it sends
            # the request: not worth a wake, and the router goes on without it
            writer.write(_response(404, "Not Found", {"detail": "Not Found"}))
            await writer.drain()
            return False
        asked = _model_of(req.body)
        if asked is not None and asked not in self.names:
            self.queue.counts.not_found += 1
            writer.write(not_found(asked, self.model))
            await writer.drain()
            return False
        await self._hold(req, reader, writer)
        return False

    async def _hold(
        self, req: _Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        q = self.queue
        try:
            q.admit()
        except Refusal as r:
            writer.write(refused(r, self.model))
            await writer.drain()
            return
        self.on_change()
        how = "forwarded"
        try:
            waiter = asyncio.ensure_future(q.wait(self._woken))
            gone = asyncio.ensure_future(reader.read(1))  # b"": the client went away
            try:
                await asyncio.wait((waiter, gone), return_when=asyncio.FIRST_COMPLETED)
            finally:
                if not waiter.done():
                    waiter.cancel()
                    how = "dropped"
                gone.cancel()
            if how == "dropped":
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await waiter
                return
            try:
                target = waiter.result()
            except Refusal as r:
                how = "timed_out" if r.kind == "timeout" else "failed"
                self.last_error = r.why
                writer.write(refused(r, self.model))
                await writer.drain()
                return
            await forward(req, target, writer)
        except asyncio.CancelledError:
            how = "dropped"
            raise
        finally:
            q.leave(how)
            self.on_change()
            self._maybe_ended()

    async def _woken(self) -> str:
        try:
            return await self._wake()
        finally:
            # requests that all left before the wake ended: its end is said now
            asyncio.get_running_loop().call_soon(self._maybe_ended)

    def _maybe_ended(self) -> None:
        episode = self.queue.ended()
        if episode is not None:
            fut = self.queue._wake
            error = None
            if fut is not None and fut.done() and not fut.cancelled() and fut.exception():
                error = str(fut.exception())
            self.on_end(episode, error)


def _keepalive(status: int, reason: str, body: bytes) -> bytes:
    head = f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
    return (head + f"content-length: {len(body)}\r\n\r\n").encode() + body


def _model_of(body: bytes) -> str | None:
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    model = doc.get("model") if isinstance(doc, dict) else None
    return model if isinstance(model, str) else None


async def forward(req: _Request, base_url: str, writer: asyncio.StreamWriter) -> None:
    """Send `req` to `base_url` (http://host:port) and copy its answer to `writer` byte for
    byte until vLLM closes (the request says Connection: close): a stream streams through."""
    hostport = base_url.split("://", 1)[-1].rstrip("/")
    host, _, port = hostport.rpartition(":")
    r, w = await asyncio.wait_for(asyncio.open_connection(host, int(port)), CONNECT_TIMEOUT_S)
    try:
        lines = [f"{req.method} {req.target} HTTP/1.1", f"host: {hostport}"]
        lines += [f"{k}: {v}" for k, v in req.headers if k.lower() not in _HOP]
        lines += [f"content-length: {len(req.body)}", "connection: close"]
        w.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + req.body)
        await w.drain()
        while chunk := await r.read(65536):
            writer.write(chunk)
            await writer.drain()
    finally:
        w.close()
        with contextlib.suppress(Exception):
            await w.wait_closed()
