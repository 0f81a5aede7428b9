"""An async client for vllm-router's worker API and its Prometheus metrics.

vllm-router 0.1.17 (measured, not documented): `POST /add_worker?url=U` answers 200 once U
answers /health (it waits for that), 400 "already exists"; `POST /remove_worker?url=U` answers
200 at once, also for a URL it does not know; `GET /list_workers` -> `{"urls": [...]}`;
`GET /readiness` 200 with healthy workers, 503 with none; metrics on a port of their own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx

from vsup.telemetry.promtext import parse_sample

# /add_worker waits for the worker's /health: a ready instance answers in milliseconds, so a
# long wait means it is not ready after all.
ADD_TIMEOUT_S = 10.0


class RouterError(Exception):
    """The router refused or did not answer; the message says which call and why."""


@dataclass(frozen=True)
class RouterMetrics:
    """The router's own figures; counters are since the router started (None: not exposed)."""

    requests_total: float | None = None
    errors_total: float | None = None
    retries_total: float | None = None
    active_workers: float | None = None
    # worker URL -> requests the router sent it / its health (1 healthy, 0 not)
    worker_requests: dict[str, float] = field(default_factory=dict)
    worker_health: dict[str, float] = field(default_factory=dict)

    def worker_share(self) -> dict[str, float]:
        """Each worker's fraction of the requests sent so far (empty before the first)."""
        total = sum(self.worker_requests.values())
        if not total:
            return {}
        return {url: n / total for url, n in self.worker_requests.items()}


_SUMMED = {
    "vllm_router_requests_total": "requests_total",
    "vllm_router_request_errors_total": "errors_total",
    "vllm_router_retries_total": "retries_total",
    "vllm_router_active_workers": "active_workers",
}
_PER_WORKER = {
    "vllm_router_processed_requests_total": "worker_requests",
    "vllm_router_worker_health": "worker_health",
}


def parse_router_metrics(text: str) -> RouterMetrics:
    """The figures vsup shows, out of the router's /metrics text (other lines are skipped)."""
    sums: dict[str, float] = {}
    per_worker: dict[str, dict[str, float]] = {v: {} for v in _PER_WORKER.values()}
    for line in text.splitlines():
        if not line.startswith("vllm_router_"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name not in _SUMMED and name not in _PER_WORKER:
            continue
        try:
            sample = parse_sample(line)
        except ValueError:
            continue
        if name in _SUMMED:
            key = _SUMMED[name]
            sums[key] = sums.get(key, 0.0) + sample.value
        elif "worker" in sample.labels:
            table = per_worker[_PER_WORKER[name]]
            url = sample.labels["worker"]
            table[url] = table.get(url, 0.0) + sample.value
    return RouterMetrics(
        requests_total=sums.get("requests_total"),
        errors_total=sums.get("errors_total"),
        retries_total=sums.get("retries_total"),
        active_workers=sums.get("active_workers"),
        worker_requests=per_worker["worker_requests"],
        worker_health=per_worker["worker_health"],
    )


class RouterClient:
    """Calls to one running router. `await client.aclose()` when done."""

    def __init__(self, base_url: str, metrics_url: str | None = None, timeout_s: float = 5.0):
        self.base_url = base_url.rstrip("/")
        self.metrics_url = metrics_url
        self._http = httpx.AsyncClient(timeout=timeout_s)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _call(
        self, method: str, path: str, timeout: float | None = None, **kw: Any
    ) -> httpx.Response:
        url = f"{self.base_url}{path}"
        try:
            # no timeout given: the client's own (timeout=None would mean "wait forever")
            kwargs: dict[str, Any] = {"timeout": timeout} if timeout is not None else {}
            return await self._http.request(method, url, **kwargs, **kw)
        except httpx.HTTPError as exc:
            raise RouterError(f"{method} {url}: {type(exc).__name__}: {exc}") from exc

    async def list_workers(self) -> list[str]:
        """The worker URLs the router routes to now."""
        resp = await self._call("GET", "/list_workers")
        if resp.status_code != 200:
            raise RouterError(f"GET /list_workers: HTTP {resp.status_code}: {resp.text[:200]}")
        return list(resp.json().get("urls", []))

    async def add_worker(self, url: str, timeout_s: float = ADD_TIMEOUT_S) -> bool:
        """Route to `url` from now on. True when added, False when it was already there."""
        resp = await self._call("POST", "/add_worker", timeout=timeout_s, params={"url": url})
        if resp.status_code == 200:
            return True
        if resp.status_code == 400 and "already exists" in resp.text:
            return False
        raise RouterError(f"add worker {url}: HTTP {resp.status_code}: {resp.text[:200]}")

    async def remove_worker(self, url: str) -> None:
        """Send `url` no new request; requests it is running finish (the router keeps their
        connections)."""
        resp = await self._call("POST", "/remove_worker", params={"url": url})
        if resp.status_code != 200:
            raise RouterError(f"remove worker {url}: HTTP {resp.status_code}: {resp.text[:200]}")

    async def alive(self) -> bool:
        """Whether the router answers (`/liveness`; `/readiness` is 503 with no worker)."""
        try:
            resp = await self._call("GET", "/liveness", timeout=2.0)
        except RouterError:
            return False
        return resp.status_code == 200

    async def metrics(self) -> RouterMetrics:
        """The router's figures from its Prometheus port."""
        if not self.metrics_url:
            raise RouterError("no metrics URL: the router's metrics_port is not known")
        try:
            resp = await self._http.get(self.metrics_url)
        except httpx.HTTPError as exc:
            raise RouterError(f"GET {self.metrics_url}: {type(exc).__name__}: {exc}") from exc
        if resp.status_code != 200:
            raise RouterError(f"GET {self.metrics_url}: HTTP {resp.status_code}")
        return parse_router_metrics(resp.text)
