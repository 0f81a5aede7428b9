"""Messages the dashboard's workers post: each carries one answer from the daemon.

High-rate ones replace a queued predecessor (toolong's `can_replace`), so a slow event loop
handles the latest snapshot once instead of a backlog.
"""

from __future__ import annotations

from textual.message import Message

from vsup.answers import History, InstanceConfig
from vsup.snapshot import StatusSnapshot


class SnapshotArrived(Message):
    """A status snapshot from the daemon."""

    def __init__(self, snapshot: StatusSnapshot) -> None:
        super().__init__()
        self.snapshot = snapshot

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, SnapshotArrived)


class DaemonUnreachable(Message):
    """The status call failed; the banner says why and the timer keeps retrying."""

    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, DaemonUnreachable)


class LogChunk(Message):
    """New log text of one instance's run (`reset` starts the view over)."""

    def __init__(self, name: str, previous: bool, text: str, reset: bool) -> None:
        super().__init__()
        self.name = name
        self.previous = previous
        self.text = text
        self.reset = reset


class ConfigArrived(Message):
    """An instance's effective config (`GET /v1/instances/{name}/config`)."""

    def __init__(self, name: str, config: InstanceConfig) -> None:
        super().__init__()
        self.name = name
        self.config = config


class HistoryArrived(Message):
    """An instance's recent metric history (`GET /v1/instances/{name}/history`)."""

    def __init__(self, name: str, history: History) -> None:
        super().__init__()
        self.name = name
        self.history = history
