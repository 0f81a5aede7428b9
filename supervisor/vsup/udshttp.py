"""HTTP/1.1 over a unix socket with the standard library only: the CLI's way to the daemon
(`control.client.JsonClient`, and `vsup status`'s own fast path, which must not import the
client's typed answers). httpx and http.client cost ~0.2 s and ~0.03 s of CPU to import, each
CLI command; this module costs nothing beyond `socket`."""

from __future__ import annotations

import socket
from typing import Any


class BrokenAnswer(Exception):
    """The daemon's answer ended or broke off before it was whole."""


def unix_request(path: str, request: bytes, timeout: float) -> tuple[int, bytes]:
    """One HTTP/1.1 exchange on a connection of its own to the unix socket `path`: (status,
    body). The standard library's sockets, not httpx or http.client (~0.2 s and ~0.03 s of
    CPU to import, each CLI command). FileNotFoundError/ConnectionError when nothing listens,
    TimeoutError past `timeout`, BrokenAnswer for an answer cut short."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(path)
        try:
            sock.sendall(request)
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise BrokenAnswer(f"the request could not be sent ({exc})") from exc
        reader = sock.makefile("rb")
        try:
            status_line = reader.readline(65536)
            parts = status_line.split(None, 2)
            if len(parts) < 2 or not parts[0].startswith(b"HTTP/"):
                raise BrokenAnswer(f"not an HTTP answer: {status_line[:80]!r}")
            status = int(parts[1])
            headers: dict[str, str] = {}
            while True:
                line = reader.readline(65536)
                if line in (b"\r\n", b"\n"):
                    break
                if not line:
                    raise BrokenAnswer("the answer's headers broke off")
                key, _, value = line.decode("latin-1").partition(":")
                headers[key.strip().lower()] = value.strip()
            return status, _read_body(reader, headers)
        except ConnectionResetError as exc:
            raise BrokenAnswer(str(exc)) from exc
        except ValueError as exc:
            raise BrokenAnswer(f"a malformed answer ({exc})") from exc
        finally:
            reader.close()


def _read_body(reader: Any, headers: dict[str, str]) -> bytes:
    if "content-length" in headers:
        n = int(headers["content-length"])
        body: bytes = reader.read(n)
        if len(body) != n:
            raise BrokenAnswer(f"the answer broke off after {len(body)} of {n} bytes")
        return body
    if headers.get("transfer-encoding", "").lower() == "chunked":
        out = bytearray()
        while True:
            size_line = reader.readline(65536)
            if not size_line:
                raise BrokenAnswer("a chunked answer broke off")
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                reader.readline(65536)
                return bytes(out)
            chunk = reader.read(size)
            if len(chunk) != size:
                raise BrokenAnswer("a chunked answer broke off")
            out += chunk
            reader.readline(65536)
    rest: bytes = reader.read()  # Connection: close: the answer ends with the connection
    return rest
