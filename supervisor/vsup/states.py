"""The names of an instance's states and exit reasons (and a rollout's states), and the sets of
states code asks about.

A leaf module (stdlib only), so the engine, the snapshot, the daemon, the CLI and the dashboard
all compare against the same members: `inst.state == State.READY`, never `== "ready"`
(`tests/unit/test_state_literals.py` fails on a state compared with a string literal). Both
enums are `StrEnum`s: a member equals its string, which is what the status JSON, the journal
and the state file carry (`snapshot.STATES` and `snapshot.EXIT_REASONS` are derived from them),
so a state read back from JSON compares equal to its member and nothing on the wire changes.
The moves between states are the engine's (`vsup.engine.states.TRANSITIONS`).
"""

from __future__ import annotations

from enum import StrEnum


class State(StrEnum):
    """An instance's (or the router's) state; vsup.engine.lifecycle says what each means."""

    STOPPED = "stopped"
    STARTING = "starting"
    READY = "ready"
    UNHEALTHY = "unhealthy"
    BACKOFF = "backoff"
    STOPPING = "stopping"
    FAILED = "failed"


class ExitReason(StrEnum):
    """Why a run ended (vsup.engine.exitreason says what decides each)."""

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
# A process runs (spawned or adopted, not yet being stopped).
RUNNING = frozenset({S.STARTING, S.READY, S.UNHEALTHY})
# The server is past its start-up: it answers (ready) or answered until just now (unhealthy),
# so its /metrics figures mean something and it counts as serving for `vsup up` and benches.
SERVING = frozenset({S.READY, S.UNHEALTHY})
# No process and none wanted: nothing happens until a person (or an apply) starts it.
IDLE = frozenset({S.STOPPED, S.FAILED})
# Where a start ends: it serves, it gave up, or it was stopped meanwhile.
DONE_STARTING = frozenset({S.READY, S.FAILED, S.STOPPED})


class RolloutState(StrEnum):
    """Where a rolling apply is (status JSON `rollout.state`; vsup.engine.rollout)."""

    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"  # a wave ended with an instance not ready; later waves were not started
    SUPERSEDED = "superseded"  # another apply replaced it (its pending instances were re-planned)
    CANCELLED = "cancelled"  # the engine shut down
    INTERRUPTED = "interrupted"  # its daemon ended (killed) before it did; found by the next one
    ROLLED_BACK = "rolled_back"  # its canary failed the gate and went back to the old spec


class CanaryState(StrEnum):
    """Where a rollout's canary is (status JSON `rollout.canary_state`; docs/canary.md)."""

    WATCHING = "watching"  # the first wave runs the new spec beside the old; the gate watches
    PASSED = "passed"
    FAILED = "failed"  # rolled back to the old spec (the rollout ends rolled_back)


class PullState(StrEnum):
    """Where a hub model's pull is (status JSON `pulls[].state`; docs/pull.md)."""

    PULLING = "pulling"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


class SleepState(StrEnum):
    """Where an instance that uses vLLM's sleep mode is (status JSON `sleep.state`; docs/sleep.md).

    Orthogonal to `State`: a sleeping server is a live, healthy process (`ready`) that holds
    almost no GPU memory and must get no request (vLLM holds a request sent to a sleeping
    server until the client gives up)."""

    AWAKE = "awake"
    FALLING_ASLEEP = "falling_asleep"  # out of the router, its requests ending, then /sleep
    ASLEEP = "asleep"
    WAKING = "waking"  # /wake_up sent (level 2: weights reloaded), not yet answering
    # adopted from an earlier daemon and the server has not said yet (its engine busy, e.g. with
    # a sleep that daemon asked for): out of the router until it does
    UNKNOWN = "unknown"


class FileState(StrEnum):
    """Where one file of a pull is (vsup.pull.progress)."""

    WAITING = "waiting"
    FETCHING = "fetching"
    DONE = "done"
    CACHED = "cached"
    FAILED = "failed"


class NodeOutcome(StrEnum):
    """Where a node stands after a fleet rollout (vsup.fleet.rollout)."""

    APPLIED = "applied"
    FAILED = "failed"
    UNTOUCHED = "untouched"
