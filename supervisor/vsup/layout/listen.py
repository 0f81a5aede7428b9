"""`HOST:PORT` addresses (`[layout] metrics_listen`): the one parser validation, the layout
model and the daemon's Prometheus exporter share."""

from __future__ import annotations

import re

# A bracketed IPv6 address, or a host name / IPv4 address; an unbracketed IPv6 address is
# refused: its last `:` cannot be told from the port's.
_LISTEN = re.compile(r"\[([0-9A-Fa-f:.]+)\]:(\d{1,5})|([A-Za-z0-9.-]+):(\d{1,5})")
EXAMPLE = '"127.0.0.1:9400"'


def parse_listen(value: str) -> tuple[str, int]:
    """`"127.0.0.1:9400"` -> ("127.0.0.1", 9400); `"[::1]:9400"` -> ("::1", 9400).

    Raises ValueError saying what to write for anything else (a missing host or port, an
    unbracketed IPv6 address, a port outside 1-65535)."""
    text = str(value).strip()
    m = _LISTEN.fullmatch(text)
    if not m:
        raise ValueError(
            f"metrics_listen {value!r} is not HOST:PORT: write e.g. {EXAMPLE} (IPv6 in "
            'brackets: "[::1]:9400")'
        )
    host = m.group(1) or m.group(3)
    port = int(m.group(2) or m.group(4))
    if not 1 <= port <= 65535:
        raise ValueError(f"metrics_listen {value!r}: port {port} is out of range: use 1-65535")
    return host, port


def listen_address(value: object) -> tuple[str, int] | None:
    """The (host, port) of a well-formed address, else None (for views that do not report)."""
    if not isinstance(value, str):
        return None
    try:
        return parse_listen(value)
    except ValueError:
        return None


def format_listen(address: tuple[str, int]) -> str:
    """("::1", 9400) -> "[::1]:9400"; ("127.0.0.1", 9400) -> "127.0.0.1:9400"."""
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
