"""What the dashboard needs from the daemon: the control API as an async Protocol.

`vsup.control.client.AsyncClient` (docs/ARCHITECTURE.md, "Control API") satisfies it;
tests and benchmarks use `tests/support/memory.py`'s `MemoryClient`, which serves injected
snapshots. The dashboard never talks to anything else.

Answers are the routes' JSON documents (dicts). `status()` may return the JSON document or an
already parsed `StatusSnapshot`; `as_snapshot` accepts both. A failed call raises: a 4xx
answer as an exception whose `str()` is the daemon's `error` message, an unreachable daemon
as any other exception (the dashboard shows its text in the banner and keeps retrying).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from vsup.snapshot import StatusSnapshot


@runtime_checkable
class DashboardClient(Protocol):
    """The control-API calls the dashboard makes, one per route."""

    async def status(self) -> StatusSnapshot | dict[str, Any]:
        """GET /v1/status: the status document (schema 1)."""
        ...

    async def layout(self) -> dict[str, Any]:
        """GET /v1/layout: `{"path", "toml", "name"}` of the running layout."""
        ...

    async def apply(
        self, toml: str, path: str | None = None, dry_run: bool = False
    ) -> dict[str, Any]:
        """POST /v1/apply.

        Returns `{"plan": {"start","restart","stop","unchanged"}, "errors", "warnings"}`."""
        ...

    async def action(self, action: str, names: list[str], all: bool = False) -> dict[str, Any]:
        """POST /v1/actions (start|stop|restart|drain|sleep|wake|swap):
        `{"done": [...], "errors": [...]}`. `swap` names two instances: the first sleeps, then
        the second wakes; `sleep` uses the instance's own `sleep.level`.

        `names` is a list because AsyncClient's parameter is one (a Sequence here would be
        wider than what it accepts)."""
        ...

    async def logs(
        self, name: str, previous: bool = False, offset: int | None = None, tail: int | None = None
    ) -> dict[str, Any]:
        """GET /v1/instances/{name}/logs: `{"run", "path", "offset", "text", "eof"}`;
        `offset` is where the next read starts."""
        ...

    async def config(self, name: str) -> dict[str, Any]:
        """GET /v1/instances/{name}/config.

        Returns `{"argv", "env" (secrets masked), "cache_config", "spec"}`."""
        ...

    async def history(self, name: str) -> dict[str, Any]:
        """GET /v1/instances/{name}/history: `{"t", "kv_cache_usage", "generation_tokens_per_s",
        "preemptions_per_min"}` over the last minutes."""
        ...

    async def save(self, path: str) -> dict[str, Any]:
        """POST /v1/save: writes the running layout atomically; refuses an invalid one."""
        ...


def as_snapshot(answer: StatusSnapshot | dict[str, Any]) -> StatusSnapshot:
    """The snapshot from a `status()` answer, parsed if it is the JSON document."""
    if isinstance(answer, StatusSnapshot):
        return answer
    return StatusSnapshot.from_json(answer)


def answer_errors(answer: dict[str, Any]) -> list[str]:
    """The `errors` of an apply/action/save answer as strings. Entries may be strings,
    diagnostics (`{"text": "FILE:LINE: error: instance 'x': key 'port': ...", ...}`) or
    action failures (`{"name", "error"}`)."""
    out = []
    for err in answer.get("errors") or ():
        if isinstance(err, dict):
            if err.get("text") or err.get("message"):
                out.append(str(err.get("text") or err.get("message")))
            elif err.get("name") and err.get("error"):
                out.append(f"{err['name']}: {err['error']}")
            else:
                out.append(str(err.get("error") or err))
        else:
            out.append(str(err))
    return out


def is_missing(exc: BaseException) -> bool:
    """A 404 answer: e.g. an instance with no log yet, or no previous run."""
    return getattr(exc, "status", None) == 404
