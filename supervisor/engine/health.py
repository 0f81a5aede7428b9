"""Readiness and liveness: one `GET /health` of a vLLM server.

vLLM refuses connections on its port until it is ready, answers 200 when ready and 503 once
its engine died (VLLM-FACTS.md). No "loading" state is exposed, so a refused connection while
starting is normal and a refused connection once ready is a failed check.
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx

DEFAULT_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class Health:
    ok: bool
    status: int | None  # the HTTP status, None when nothing answered
    error: str | None = None


def make_client() -> httpx.AsyncClient:
    """The engine's client for /health. `trust_env=False`: an HTTP(S)_PROXY in the daemon's
    environment must not route loopback checks through a proxy."""
    return httpx.AsyncClient(trust_env=False, limits=httpx.Limits(max_keepalive_connections=64))


async def check(
    client: httpx.AsyncClient, url: str, timeout_s: float = DEFAULT_TIMEOUT_S
) -> Health:
    """One health check; never raises (a failed check is an answer, not an error)."""
    try:
        resp = await client.get(url, timeout=timeout_s)
    except (httpx.HTTPError, httpx.InvalidURL, OSError, ValueError) as exc:
        return Health(False, None, f"{type(exc).__name__}: {exc}".rstrip(": "))
    return Health(resp.status_code == 200, resp.status_code)
