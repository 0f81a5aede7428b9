"""What someone who reaches a router's port can do with vllm-router's open worker API: add a
server of their own as a worker (`POST /add_worker`) and see how many requests it gets. Shared
by the engine's and the daemon's router tests (docs/router.md, "Workers vsup did not add").

`ForeignServer` is an in-process asyncio HTTP server on 127.0.0.1 that answers `/health` and
completions (body text "intruder", so a client can tell who answered) and counts them;
`stream()` sends completions through the router one after another and notes who answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

import httpx

FOREIGN_TEXT = "intruder"


class ForeignServer:
    """A worker nobody asked for. `hits`: the completions it answered."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.hits = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> ForeignServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.split(b"\r\n")
                parts = lines[0].decode("latin-1").split(" ")
                path = parts[1].split("?", 1)[0] if len(parts) > 1 else "/"
                length = 0
                for line in lines[1:]:
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                if length:
                    await reader.readexactly(length)
                if path == "/health":
                    status, body = "200 OK", b""
                elif path in ("/v1/completions", "/v1/chat/completions"):
                    self.hits += 1
                    status = "200 OK"
                    body = (
                        b'{"id":"cmpl-x","object":"text_completion","model":"m","choices":'
                        b'[{"index":0,"text":"' + FOREIGN_TEXT.encode() + b'",'
                        b'"finish_reason":"length"}],'
                        b'"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}'
                    )
                else:
                    status, body = "404 Not Found", b'{"detail":"Not Found"}'
                writer.write(
                    f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\n"
                    f"content-length: {len(body)}\r\n\r\n".encode()
                    + body
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()


@dataclass
class Stream:
    """Completions sent through the router: who answered each, and when (monotonic)."""

    sent: int = 0
    failed: int = 0
    foreign: list[float] = field(default_factory=list)  # when the intruder answered
    stop: asyncio.Event = field(default_factory=asyncio.Event)


async def stream(base_url: str, model: str, state: Stream, pause_s: float = 0.0) -> None:
    """Send completions one at a time until `state.stop` is set."""
    body = {"model": model, "prompt": "hello", "max_tokens": 1}
    async with httpx.AsyncClient(timeout=30) as http:
        while not state.stop.is_set():
            state.sent += 1
            try:
                resp = await http.post(f"{base_url}/v1/completions", json=body)
            except httpx.HTTPError:
                state.failed += 1
                continue
            if resp.status_code != 200:
                state.failed += 1
            elif FOREIGN_TEXT in resp.text:
                state.foreign.append(time.monotonic())
            if pause_s:
                await asyncio.sleep(pause_s)


async def add_worker(base_url: str, url: str) -> int:
    """`POST /add_worker?url=...` as anyone could send it; the HTTP status."""
    async with httpx.AsyncClient(timeout=30) as http:
        resp = await http.post(f"{base_url}/add_worker", params={"url": url})
        return resp.status_code


async def listed(base_url: str) -> list[str]:
    async with httpx.AsyncClient(timeout=10) as http:
        resp = await http.get(f"{base_url}/list_workers")
        return list(resp.json().get("urls", []))
