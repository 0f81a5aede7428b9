"""The daemon's per-poll scrapes of plain-http vLLM servers, from one worker thread.

Every second the daemon asks each live instance for `/health`, `/load` (load-tracking
instances only) and its filtered `/metrics/` page, pipelined on one kept-alive connection
(scrape.py says why each). Done with asyncio that is a task, a timer and a stream's callbacks
per instance and second; here one worker thread drives every server's non-blocking socket
with one selector (epoll) per poll: it writes each instance's request bytes, reads the answers
as they come, parses them (`scrape._read_page`: the same figures as `Scraper.scrape`) and hands
the finished `ScrapeResult`s to the event loop in a few batches, where the monitor feeds them
to telemetry. What it saves: docs/benchmarks.md (`benchmarks/overhead.py`).

Semantics, the same as `Scraper.scrape` run by a task per instance:
- `run(jobs, wait_s)` starts an exchange for each job whose instance has none pending and
  returns once every exchange has finished or `wait_s` has passed. An exchange still pending
  then (a slow server) is not sent again: it goes on in the next `run`, and is a timeout once
  it is older than `timeout_s` ("no answer within the timeout", as the scraper says).
- Connecting is bounded by min(timeout, 1 s); a refused connection is an error at once.
- A kept-alive connection that the server had closed (no byte of an answer, or a reset) is
  tried again once on a new connection; a server that closes after some of the answers gets
  the rest asked again on a new connection.
- A filtered page that shows no vLLM series (or 404/405) makes the server be asked for the
  whole page, at once and from then on (shared with the `Scraper`).
Results of one `run` are delivered on the event loop (`deliver`, through
`call_soon_threadsafe`) at most every `FLUSH_S` while the run waits, and all before `run`
returns. The thread blocks; the event loop never does.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import selectors
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from vsup.telemetry import httpget
from vsup.telemetry.metrics import EMPTY
from vsup.telemetry.scrape import (
    Scraper,
    ScrapeResult,
    _describe,
    _join,
    _load_answer,
)

# How long finished results may wait in the thread for others before they go to the loop.
FLUSH_S = 0.05
# How long the thread lets answers gather between two selects while some are still due.
COALESCE_S = 0.005
_RECV = 1 << 16
_HEAD_LIMIT = 64 << 10
_K = TypeVar("_K")  # what the caller identifies a job with (the monitor: its Target)


@dataclass(frozen=True)
class Job(Generic[_K]):
    """One instance's scrape: `key` is the caller's, `name` identifies the instance (one
    exchange pending per name)."""

    name: str
    key: _K
    base_url: str
    with_load: bool = False
    with_health: bool = False


class _Exchange:
    """One job's pipelined requests on one connection, and what has come back."""

    __slots__ = (
        "job",
        "urls",
        "metrics_url",
        "host",
        "port",
        "requests",
        "answers",
        "sock",
        "reused",
        "connecting",
        "out",
        "buf",
        "started",
        "connect_by",
        "whole",
        "base",
        "writing",
    )

    def __init__(
        self, job: Job[Any], urls: list[str], metrics_url: str, host: str, port: int
    ) -> None:
        self.job = job
        self.urls = urls
        self.metrics_url = metrics_url
        self.host = host
        self.port = port
        self.requests: list[bytes] = []
        self.answers: list[httpget.Response] = []
        self.sock: socket.socket | None = None
        self.reused = False
        self.connecting = False
        self.out = b""
        self.buf = bytearray()
        self.started = 0.0
        self.connect_by = 0.0
        self.whole = False  # asked for the whole /metrics page (the filter said nothing)
        self.base = 0  # answers in before the current connection
        self.writing = False  # its socket is registered for writing too (a partial send)


class ScrapeBatch:
    """Scrapes of many plain-http servers from one worker thread (see the module doc). Made by
    `batch_for(scraper)`; one `run` at a time (the monitor's poll); `close()` when done."""

    def __init__(self, scraper: Scraper) -> None:
        self.timeout_s = scraper.timeout_s
        self._scraper = scraper
        self._encoder = httpget.HttpGetter(scraper.headers, max_body=scraper.max_body)
        self.max_body = scraper.max_body
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="vsup-scrape")
        # Every socket is registered once, for reading (a new one for writing until it
        # connects), and stays so while it is kept alive: which exchange it serves is
        # `_owner`'s, not the selector's data, so taking an idle socket or putting one back
        # costs no epoll_ctl and no SelectorKey rebuilt (selectors' `modify` with new data).
        self._sel = selectors.DefaultSelector()
        self._owner: dict[socket.socket, _Exchange] = {}
        self._idle: dict[tuple[str, int], socket.socket] = {}
        self._pending: dict[str, _Exchange] = {}
        self._done: list[tuple[Job[Any], ScrapeResult]] = []
        self._closed = False

    def pending(self, name: str) -> bool:
        """Whether `name`'s exchange is still under way (between runs)."""
        return name in self._pending

    @property
    def busy(self) -> bool:
        """Whether an exchange is still under way (the next `run` goes on with it)."""
        return bool(self._pending)

    async def run(
        self,
        jobs: Sequence[Job[_K]],
        wait_s: float,
        deliver: Callable[[list[tuple[Job[_K], ScrapeResult]]], None],
        drop: Iterable[str] = (),
    ) -> None:
        """Scrape `jobs` (those whose name has no exchange pending) and go on with the pending
        ones, for up to `wait_s`; `deliver(results)` is called on the event loop with each
        batch of finished ones. `drop`: names whose pending exchange is abandoned (the
        instance was forgotten)."""
        loop = asyncio.get_running_loop()

        def hand(results: list[tuple[Job[Any], ScrapeResult]]) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(deliver, results)

        await loop.run_in_executor(self._executor, self._run, list(jobs), wait_s, hand, list(drop))

    async def aclose(self) -> None:
        """Close every connection (in the worker thread, after a run in flight)."""
        if self._closed:
            return
        self._closed = True
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._close_all)
        self._executor.shutdown(wait=False)

    # -- the worker thread --------------------------------------------------------------------

    def _run(
        self,
        jobs: list[Job[Any]],
        wait_s: float,
        hand: Callable[[list[tuple[Job[Any], ScrapeResult]]], None],
        drop: list[str],
    ) -> None:
        for name in drop:
            ex = self._pending.pop(name, None)
            if ex is not None:
                self._close_sock(ex)
        t0 = time.monotonic()
        end = t0 + wait_s
        # answers that came in since the last run first: their servers get this run's job
        if self._pending:
            self._wait(0.0)
        for job in jobs:
            if job.name not in self._pending:
                self._start(job, t0)
        held_since: float | None = None
        while True:
            now = time.monotonic()
            self._expire(now)
            if self._done:
                if held_since is None:
                    held_since = now
                if not self._pending or now - held_since >= FLUSH_S:
                    out, self._done = self._done, []
                    hand(out)
                    held_since = None
            if not self._pending or now >= end:
                break
            wake = end
            if held_since is not None:
                wake = min(wake, held_since + FLUSH_S)
            for ex in self._pending.values():
                wake = min(wake, ex.connect_by if ex.connecting else ex.started + self.timeout_s)
            if self._wait(max(0.0, wake - now)) and self._pending:
                # answers trickle in (the servers share the node's cores): let a few more
                # arrive before the next select, so one wake-up reads many of them
                time.sleep(min(COALESCE_S, max(0.0, wake - time.monotonic())))
        if self._done:
            out, self._done = self._done, []
            hand(out)

    def _wait(self, timeout: float) -> bool:
        """Handle what is ready within `timeout`; whether anything was."""
        ready = self._sel.select(timeout)
        for key, events in ready:
            sock: socket.socket = key.fileobj  # type: ignore[assignment]
            ex = self._owner.get(sock)
            if ex is None:
                self._idle_event(sock)
                continue
            if ex.sock is not sock or ex.job.name not in self._pending:
                continue
            try:
                if ex.connecting:
                    self._connected(ex)
                elif events & selectors.EVENT_WRITE and ex.out:
                    self._send(ex)
                elif events & selectors.EVENT_READ:
                    self._read(ex)
            except httpget.HttpError as exc:
                self._fail(ex, exc)
        return bool(ready)

    def _idle_event(self, sock: socket.socket) -> None:
        """An idle kept-alive socket turned readable: the server closed it (or sent what
        nobody asked for). It is let go; the next exchange with that server connects anew."""
        held = [key for key, idle in self._idle.items() if idle is sock]
        if not held:
            return  # taken by an exchange since the select: its own read will see the close
        for key in held:
            del self._idle[key]
        self._unregister(sock)
        sock.close()

    def _start(self, job: Job[Any], now: float) -> None:
        base = job.base_url
        urls = [_join(base, "/health")] if job.with_health else []
        if job.with_load:
            urls.append(_join(base, "/load"))
        metrics_url = _join(base, "/metrics")
        urls.append(self._scraper.metrics_url(base, False))
        try:
            encoded = [self._encoder.get_bytes(u) for u in urls]
        except httpget.HttpError as exc:
            self._finish_error(job, metrics_url, urls, exc, 0.0)
            return
        host, port = encoded[0][0], encoded[0][1]
        ex = _Exchange(job, urls, metrics_url, host, port)
        ex.requests = [r for _h, _p, r in encoded]
        ex.started = now
        self._pending[job.name] = ex
        try:
            self._open(ex, reuse=True)
        except httpget.HttpError as exc:
            self._fail(ex, exc)

    def _open(self, ex: _Exchange, reuse: bool) -> None:
        """Put the exchange's unanswered requests on a connection: a kept-alive one when
        `reuse` and one is idle, else a new one."""
        ex.buf = bytearray()
        ex.base = len(ex.answers)
        ex.out = b"".join(ex.requests[len(ex.answers) :])
        sock = self._idle.pop((ex.host, ex.port), None) if reuse else None
        if sock is not None:
            ex.sock, ex.reused, ex.connecting, ex.writing = sock, True, False, False
            # an idle socket stays registered for reading: this changes only whose it is
            self._owner[sock] = ex
            self._send(ex)
            return
        sock = socket.socket(socket.AF_INET6 if ":" in ex.host else socket.AF_INET)
        sock.setblocking(False)
        ex.sock, ex.reused, ex.connecting, ex.writing = sock, False, True, True
        ex.connect_by = time.monotonic() + min(self.timeout_s, 1.0)
        try:
            code = sock.connect_ex((ex.host, ex.port))
        except OSError as exc:  # e.g. a host name that does not resolve
            code = exc.errno or errno.EHOSTUNREACH
        if code not in (0, errno.EINPROGRESS):
            _raise_refused(ex, code)
        self._sel.register(sock, selectors.EVENT_WRITE)
        self._owner[sock] = ex

    def _connected(self, ex: _Exchange) -> None:
        assert ex.sock is not None
        code = ex.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if code:
            _raise_refused(ex, code)
        ex.connecting, ex.writing = False, False
        ex.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sel.modify(ex.sock, selectors.EVENT_READ)
        self._send(ex)

    def _send(self, ex: _Exchange) -> None:
        assert ex.sock is not None
        try:
            n = ex.sock.send(ex.out)
        except BlockingIOError:
            n = 0
        except OSError:
            self._stale(ex)
            return
        if n:
            ex.out = ex.out[n:]
        if bool(ex.out) != ex.writing:  # the rest waits until the socket takes more
            ex.writing = bool(ex.out)
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if ex.writing else 0)
            self._sel.modify(ex.sock, events)

    def _read(self, ex: _Exchange) -> None:
        assert ex.sock is not None
        try:
            chunk = ex.sock.recv(_RECV)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""  # reset: as closed
        if chunk:
            ex.buf += chunk
        while len(ex.answers) < len(ex.requests):
            answer = _answer(ex.buf, not chunk, self.max_body)
            if answer is None:
                break
            response, keep, used = answer
            del ex.buf[:used]
            ex.answers.append(response)
            if not keep and len(ex.answers) < len(ex.requests):
                self._close_sock(ex)  # the server ends here: the rest on a new connection
                self._open(ex, reuse=False)
                return
            if len(ex.answers) == len(ex.requests):
                self._answered(ex, keep)
                return
        if not chunk:
            if ex.buf:
                raise httpget.ProtocolError("the server hung up in the middle of its answer")
            self._stale(ex)

    def _stale(self, ex: _Exchange) -> None:
        """The connection closed before the next answer began: the unanswered requests go
        again on a new connection when it was a kept-alive one or answered some of them
        first; a new connection that closes without answering is an error."""
        again = ex.reused or len(ex.answers) > ex.base
        self._close_sock(ex)
        if not again:
            raise httpget.ProtocolError(
                f"{ex.urls[len(ex.answers)]}: the server closed the connection without answering"
            )
        self._open(ex, reuse=False)

    def _answered(self, ex: _Exchange, keep: bool) -> None:
        sock = ex.sock
        assert sock is not None
        ex.sock = None
        key = (ex.host, ex.port)
        if keep and not ex.buf and not self._closed and key not in self._idle:
            # kept for the next run, still registered for reading (no epoll_ctl a run): if
            # the server closes it meanwhile, `_wait` sees it and lets it go
            self._idle[key] = sock
            del self._owner[sock]
            if ex.writing:
                ex.writing = False
                self._sel.modify(sock, selectors.EVENT_READ)
        else:
            self._unregister(sock)
            sock.close()
        del self._pending[ex.job.name]
        elapsed = time.monotonic() - ex.started
        job = ex.job
        answers = ex.answers
        health_status = answers[0].status if job.with_health else None
        load, load_error = None, None
        if job.with_load:
            answer = answers[-2]
            load, load_error = _load_answer(ex.urls[-2], answer.status, answer.body)
        last = answers[-1]
        result = Scraper._metrics_answer(
            ex.metrics_url,
            last.status,
            last.body,
            elapsed,
            False,
            server_load=load,
            load_error=load_error,
            health_status=health_status,
        )
        if not ex.whole and self._scraper.filter_failed(job.base_url, False, result):
            # the filtered page said nothing vsup can use: the whole page, now
            ex.whole = True
            ex.urls[-1] = self._scraper.metrics_url(job.base_url, False)
            _h, _p, request = self._encoder.get_bytes(ex.urls[-1])
            ex.requests[-1] = request
            ex.answers = []
            self._pending[job.name] = ex
            self._open(ex, reuse=True)
            return
        self._done.append((job, result))

    def _expire(self, now: float) -> None:
        for ex in [e for e in self._pending.values() if _overdue(e, now, self.timeout_s)]:
            if ex.connecting and now >= ex.connect_by:
                exc: httpget.HttpError = httpget.ConnectFailed(
                    f"connecting to {ex.host}:{ex.port} took over {min(self.timeout_s, 1.0):g} s"
                )
            else:
                exc = httpget.Timeout(f"{ex.urls[0]}: no answer within {self.timeout_s:g} s")
            self._fail(ex, exc)

    def _fail(self, ex: _Exchange, exc: httpget.HttpError) -> None:
        self._pending.pop(ex.job.name, None)
        self._close_sock(ex)
        self._finish_error(ex.job, ex.metrics_url, ex.urls, exc, time.monotonic() - ex.started)

    def _finish_error(
        self,
        job: Job[Any],
        metrics_url: str,
        urls: list[str],
        exc: httpget.HttpError,
        elapsed: float,
    ) -> None:
        self._done.append(
            (
                job,
                ScrapeResult(
                    metrics_url,
                    False,
                    EMPTY,
                    error=_describe(exc, metrics_url),
                    elapsed_s=elapsed,
                    load_error=_describe(exc, urls[-2]) if job.with_load else None,
                ),
            )
        )

    def _unregister(self, sock: socket.socket) -> None:
        self._owner.pop(sock, None)
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(sock)

    def _close_sock(self, ex: _Exchange) -> None:
        sock, ex.sock = ex.sock, None
        if sock is not None:
            self._unregister(sock)
            sock.close()

    def _close_all(self) -> None:
        for ex in self._pending.values():
            self._close_sock(ex)
        self._pending.clear()
        for sock in self._idle.values():
            self._unregister(sock)
            sock.close()
        self._idle.clear()
        self._sel.close()


def _overdue(ex: _Exchange, now: float, timeout_s: float) -> bool:
    if ex.connecting and now >= ex.connect_by:
        return True
    return now >= ex.started + timeout_s


def _raise_refused(ex: _Exchange, code: int) -> None:
    """Raise ConnectFailed for a connect that failed with errno `code`."""
    raise httpget.ConnectFailed(
        f"connection to {ex.host}:{ex.port} refused or unreachable ({os.strerror(code)})"
    )


def _answer(buf: bytearray, eof: bool, max_body: int) -> tuple[httpget.Response, bool, int] | None:
    """The first whole answer in `buf`: (response, keep-alive, bytes used), or None while it
    is not all there. `eof`: the server closed (a body without a length ends there). Raises
    httpget.HttpError for an answer that is not HTTP/1.x, too big or malformed."""
    head_end = buf.find(b"\r\n\r\n")
    if head_end < 0:
        if len(buf) > _HEAD_LIMIT:
            raise httpget.ProtocolError("the answer's headers are over 64 KiB")
        return None
    status, headers, version = httpget.parse_head(bytes(buf[: head_end + 4]))
    pos = head_end + 4
    until_eof = False
    try:
        if "chunked" in headers.get("transfer-encoding", "").lower():
            parts: list[bytes] = []
            size = 0
            while True:
                line_end = buf.find(b"\r\n", pos)
                if line_end < 0:
                    return None
                n = int(bytes(buf[pos:line_end]).split(b";", 1)[0].strip(), 16)
                pos = line_end + 2
                if n == 0:
                    # trailers, then the blank line
                    while True:
                        line_end = buf.find(b"\r\n", pos)
                        if line_end < 0:
                            return None
                        blank = line_end == pos
                        pos = line_end + 2
                        if blank:
                            break
                    body = b"".join(parts)
                    break
                size += n
                if size > max_body:
                    raise httpget.TooLarge(f"the answer is over {max_body} bytes")
                if len(buf) < pos + n + 2:
                    return None
                parts.append(bytes(buf[pos : pos + n]))
                pos += n + 2
        elif (length := headers.get("content-length")) is not None:
            n = int(length)
            if n > max_body:
                raise httpget.TooLarge(f"the answer is {n} bytes, over {max_body}")
            if len(buf) < pos + n:
                return None
            body = bytes(buf[pos : pos + n])
            pos += n
        else:
            if len(buf) - pos > max_body:
                raise httpget.TooLarge(f"the answer is over {max_body} bytes")
            if not eof:
                return None
            body = bytes(buf[pos:])
            pos = len(buf)
            until_eof = True
    except ValueError as exc:
        raise httpget.ProtocolError(f"bad answer body ({exc})") from None
    conn_hdr = headers.get("connection", "").lower()
    keep = not until_eof and (
        "keep-alive" in conn_hdr if version == "HTTP/1.0" else "close" not in conn_hdr
    )
    return httpget.Response(status, body), keep, pos


def batch_for(scraper: Scraper) -> ScrapeBatch | None:
    """A `ScrapeBatch` sharing `scraper`'s headers, timeout and whole-page servers; None when
    its requests go through a test transport."""
    return ScrapeBatch(scraper) if scraper.batchable else None
