"""Errors the control API turns into HTTP answers; the client turns them back into exceptions."""

from __future__ import annotations

from collections.abc import Iterable


class ControlError(Exception):
    """A request the daemon refused: `status` is the HTTP status, `message` says why."""

    status = 400

    def __init__(self, message: str, status: int | None = None, body: dict | None = None) -> None:
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        self.body = body or {}


class BadRequest(ControlError):
    status = 400


class UnknownInstances(ControlError):
    """One or more instance names that the running layout does not have."""

    status = 404

    def __init__(self, names: Iterable[str], known: Iterable[str] = ()) -> None:
        self.names = sorted(set(names))
        known = sorted(known)
        listed = ", ".join(self.names)
        hint = f" (instances: {', '.join(known)})" if known else " (no instance is configured)"
        super().__init__(f"unknown instance{'s' if len(self.names) > 1 else ''}: {listed}{hint}")


class Conflict(ControlError):
    """The request is valid but cannot run now (e.g. the daemon is shutting down)."""

    status = 409


class DaemonUnavailable(Exception):
    """No daemon answers on the socket, and none could be started."""
