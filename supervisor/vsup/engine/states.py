"""The moves between an instance's states (the names themselves live in the leaf `vsup.states`,
re-exported here for the engine's modules).

Like supervisord's `states.py`: `Lifecycle` checks every change of state against `TRANSITIONS`,
so a move nobody planned is a bug that shows at once instead of a state the dashboard cannot
explain.
"""

from __future__ import annotations

from vsup.states import DONE_STARTING, IDLE, RUNNING, SERVING, ExitReason, State

__all__ = [
    "DONE_STARTING",
    "IDLE",
    "RUNNING",
    "SERVING",
    "TRANSITIONS",
    "ExitReason",
    "IllegalTransition",
    "State",
    "check_transition",
]

S = State

# from -> the states it may move to (lifecycle.py's docstring says which call makes each move).
# `failed` is reachable from everywhere: a runner that breaks fails its instance whatever the
# state; `stopped` too, as the end of any stop or a clean exit.
TRANSITIONS: dict[State, frozenset[State]] = {
    S.STOPPED: frozenset({S.STARTING, S.FAILED}),
    S.STARTING: frozenset({S.READY, S.STOPPING, S.BACKOFF, S.FAILED, S.STOPPED}),
    S.READY: frozenset({S.UNHEALTHY, S.STOPPING, S.BACKOFF, S.FAILED, S.STOPPED}),
    S.UNHEALTHY: frozenset({S.STOPPING, S.BACKOFF, S.FAILED, S.STOPPED}),
    S.BACKOFF: frozenset({S.STARTING, S.STOPPING, S.FAILED, S.STOPPED}),
    S.STOPPING: frozenset({S.STOPPED, S.STARTING, S.FAILED}),
    S.FAILED: frozenset({S.STARTING, S.STOPPED}),
}


class IllegalTransition(RuntimeError):
    """A move the table does not allow: a bug in the engine."""

    def __init__(self, old: State, new: State) -> None:
        super().__init__(f"illegal state change {old} -> {new}")
        self.old, self.new = old, new


def check_transition(old: State, new: State) -> None:
    """Raise IllegalTransition unless `old -> new` is in TRANSITIONS (staying is always fine)."""
    if old != new and new not in TRANSITIONS[old]:
        raise IllegalTransition(old, new)
