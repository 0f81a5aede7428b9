"""What the dashboard needs from the daemon: the control API as an async Protocol.

`vsup.control.client.AsyncClient` (docs/ARCHITECTURE.md, "Control API") satisfies it;
tests and benchmarks use `tests/support/memory.py`'s `MemoryClient`, which serves injected
snapshots. The dashboard never talks to anything else.

Answers are typed (vsup.answers; status a `StatusSnapshot`). A failed call raises: a 4xx
answer as an exception whose `str()` is the daemon's `error` message, an unreachable daemon
as any other exception (the dashboard shows its text in the banner and keeps retrying).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from vsup.answers import (
    ActionAnswer,
    ApplyAnswer,
    History,
    InstanceConfig,
    LayoutAnswer,
    LogChunk,
    SaveAnswer,
)
from vsup.snapshot import StatusSnapshot


@runtime_checkable
class DashboardClient(Protocol):
    """The control-API calls the dashboard makes, one per route."""

    async def status(self) -> StatusSnapshot:
        """GET /v1/status: the status document (schema 1)."""
        ...

    async def layout(self) -> LayoutAnswer:
        """GET /v1/layout: the running layout's path, text and name."""
        ...

    async def apply(self, toml: str, path: str | None = None, dry_run: bool = False) -> ApplyAnswer:
        """POST /v1/apply: the plan (what starts, restarts, stops), errors and warnings."""
        ...

    async def action(self, action: str, names: list[str], all: bool = False) -> ActionAnswer:
        """POST /v1/actions (start|stop|restart|drain|sleep|wake|swap): what was done, the
        errors. `swap` names two instances: the first sleeps, then the second wakes; `sleep`
        uses the instance's own `sleep.level`.

        `names` is a list because AsyncClient's parameter is one (a Sequence here would be
        wider than what it accepts)."""
        ...

    async def logs(
        self, name: str, previous: bool = False, offset: int | None = None, tail: int | None = None
    ) -> LogChunk:
        """GET /v1/instances/{name}/logs: a part of the log; `offset` is where the next read
        starts."""
        ...

    async def config(self, name: str) -> InstanceConfig:
        """GET /v1/instances/{name}/config: argv, env (secrets masked), cache config, spec."""
        ...

    async def history(self, name: str) -> History:
        """GET /v1/instances/{name}/history: the telemetry over the last minutes."""
        ...

    async def save(self, path: str) -> SaveAnswer:
        """POST /v1/save: writes the running layout atomically; refuses an invalid one."""
        ...

    async def rollout(self, action: str) -> dict[str, Any]:
        """POST /v1/rollout: end a canary's watch, `promote` or `abort` (409: none watched)."""
        ...


def answer_errors(answer: ApplyAnswer | ActionAnswer) -> list[str]:
    """The `errors` of an apply or action answer as lines: a diagnostic's text
    (`FILE:LINE: error: instance 'x': key 'port': ...`) or an action's `name: error`."""
    return [str(err) for err in answer.errors]


def is_missing(exc: BaseException) -> bool:
    """A 404 answer: e.g. an instance with no log yet, or no previous run."""
    return getattr(exc, "status", None) == 404
