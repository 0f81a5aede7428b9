"""The control API over a forwarded unix socket, in a few lines of asyncio.

Why not `control.client.AsyncClient` (httpx): importing httpx costs ~0.3 s of CPU here (it
pulls rich and click in for its command line), more than a warm `vsup fleet status` of sixteen
nodes needs in all (docs/fleet.md, "Measured"). One request per connection: each is a new SSH
channel through the node's ControlMaster, no handshake. The TUI's node dashboard does use
AsyncClient on the same socket (Textual is heavier still).

Same contract as the control client: a refusal raises `ControlError` (`.status`, `.body`),
nothing answering raises `DaemonUnavailable`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from vsup.answers import ApplyAnswer, BadAnswer, decode
from vsup.control.errors import ControlError, DaemonUnavailable

MAX_BODY = 64 * 2**20


class NodeClient:
    """`NodeClient(socket)`: the routes the fleet uses, awaitable."""

    def __init__(self, socket: Path | str, timeout: float = 30.0) -> None:
        self.socket = str(socket)
        self.timeout = timeout

    async def aclose(self) -> None:
        """Nothing is kept open between requests."""

    async def request(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        timeout: float | None = None,
    ) -> Any:
        """One request; the JSON answer. TimeoutError when it takes longer than `timeout`."""
        return await asyncio.wait_for(self._request(method, path, body), timeout or self.timeout)

    async def _request(self, method: str, path: str, body: dict[str, Any] | None) -> Any:
        data = b"" if body is None else json.dumps(body).encode()
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: vsup\r\nConnection: close\r\n"
            f"Accept: application/json\r\nContent-Length: {len(data)}\r\n"
        )
        if body is not None:
            head += "Content-Type: application/json\r\n"
        try:
            reader, writer = await asyncio.open_unix_connection(self.socket)
        except (FileNotFoundError, ConnectionError, OSError) as exc:
            raise DaemonUnavailable(f"nothing answers on {self.socket} ({exc})") from exc
        try:
            writer.write(head.encode() + b"\r\n" + data)
            await writer.drain()
            status_line, payload = await self._read_answer(reader)
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()
        return self._answer(status_line, payload)

    async def _read_answer(self, reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
        """The answer's status line and body; DaemonUnavailable when it breaks off."""
        try:
            status_line = await reader.readline()
            if not status_line:
                raise DaemonUnavailable(f"{self.socket} closed without an answer")
            headers: dict[str, str] = {}
            while True:
                line = await reader.readline()
                if line in (b"\r\n", b"\n", b""):
                    break
                key, _, value = line.decode("latin-1").partition(":")
                headers[key.strip().lower()] = value.strip()
            return status_line, await self._body(reader, headers)
        except (ConnectionError, asyncio.IncompleteReadError) as exc:
            raise DaemonUnavailable(f"{self.socket}: the answer broke off ({exc})") from exc

    def _answer(self, status_line: bytes, payload: bytes) -> Any:
        """The JSON document answered; a ControlError for an HTTP error status (its `error`
        as the message), DaemonUnavailable when it is not HTTP."""
        try:
            status = int(status_line.split()[1])
        except (IndexError, ValueError):
            raise DaemonUnavailable(
                f"{self.socket}: not an HTTP answer: {status_line[:80]!r}"
            ) from None
        try:
            doc = json.loads(payload) if payload else {}
        except ValueError:
            doc = {"error": payload.decode(errors="replace").strip() or f"HTTP {status}"}
        if status >= 400:
            message = doc.get("error") if isinstance(doc, dict) else None
            raise ControlError(
                message or f"HTTP {status}",
                status=status,
                body=doc if isinstance(doc, dict) else {},
            )
        return doc

    @staticmethod
    async def _body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
        if "content-length" in headers:
            n = int(headers["content-length"])
            if n > MAX_BODY:
                raise DaemonUnavailable(f"an answer of {n} bytes is over {MAX_BODY}")
            return await reader.readexactly(n)
        if headers.get("transfer-encoding", "").lower() == "chunked":
            out = bytearray()
            while True:
                size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    await reader.readline()
                    return bytes(out)
                out += await reader.readexactly(size)
                await reader.readline()
                if len(out) > MAX_BODY:
                    raise DaemonUnavailable(f"an answer over {MAX_BODY} bytes")
        return await reader.read(MAX_BODY)

    # -- routes (docs/ARCHITECTURE.md, "Control API") -----------------------------------------

    async def ping(self) -> dict[str, Any]:
        return await self.request("GET", "/v1/ping")

    async def status(self) -> dict[str, Any]:
        return await self.request("GET", "/v1/status")

    async def layout(self) -> dict[str, Any]:
        return await self.request("GET", "/v1/layout")

    async def layouts(self) -> dict[str, Any]:
        """The node's kept layouts, newest first, and its running layout's text."""
        return await self.request("GET", "/v1/layouts")

    async def apply(
        self,
        toml: str,
        path: str | None = None,
        dry_run: bool = False,
        rollback_of: int | None = None,
    ) -> ApplyAnswer:
        """The node's apply answer, typed (vsup.answers); one of another shape is a
        ControlError (502) naming the key. `rollback_of`: the kept layout a rollback applies
        (journaled with the apply)."""
        body: dict[str, Any] = {"toml": toml, "path": path, "dry_run": dry_run}
        if rollback_of is not None:
            body["rollback_of"] = rollback_of
        doc = await self.request("POST", "/v1/apply", body, timeout=max(self.timeout, 120))
        try:
            return decode(ApplyAnswer, doc, "POST /v1/apply")
        except BadAnswer as exc:
            raise ControlError(f"{exc} (a vsup of another version?)", status=502) from None

    async def shutdown(self, stop_instances: bool = True) -> dict[str, Any]:
        """`{"stopping": [..]}`: the daemon stops its instances (or not), then exits."""
        body = {"stop_instances": stop_instances}
        return await self.request("POST", "/v1/shutdown", body, timeout=max(self.timeout, 60))

    async def events(self, since: int = 0, limit: int | None = None) -> dict[str, Any]:
        params: dict[str, Any] = {"since": since}
        if limit is not None:
            params["limit"] = limit
        return await self.request("GET", f"/v1/events?{urlencode(params)}")
