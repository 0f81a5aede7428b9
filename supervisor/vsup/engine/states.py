"""The names of an instance's states and exit reasons, and the moves between states.

A leaf module (stdlib and snapshot only), like supervisord's `states.py`: `Lifecycle` checks
every change of state against `TRANSITIONS`, so a move nobody planned is a bug that shows at
once instead of a state the dashboard cannot explain. Both enums are `StrEnum`s: their
members are the strings the status JSON, the journal and the state file carry
(snapshot.STATES, snapshot.EXIT_REASONS), so nothing on the wire changes.
"""

from __future__ import annotations

from enum import StrEnum


class State(StrEnum):
    STOPPED = "stopped"
    STARTING = "starting"
    READY = "ready"
    UNHEALTHY = "unhealthy"
    BACKOFF = "backoff"
    STOPPING = "stopping"
    FAILED = "failed"


class ExitReason(StrEnum):
    OOM = "oom"
    KV_CACHE_TOO_SMALL = "kv_cache_too_small"
    PORT_IN_USE = "port_in_use"
    BAD_ARGS = "bad_args"
    MODEL_NOT_FOUND = "model_not_found"
    ENGINE_DEAD = "engine_dead"
    KILLED = "killed"
    STARTUP_TIMEOUT = "startup_timeout"
    UNHEALTHY = "unhealthy"
    STOPPED = "stopped"
    UNKNOWN = "unknown"
    GPU_MEMORY_INSUFFICIENT = "gpu_memory_insufficient"
    STALLED = "stalled"  # restart.on_stall: work and no token for stall_after_s


S = State
# The states a process runs in.
RUNNING = (S.STARTING, S.READY, S.UNHEALTHY)

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
