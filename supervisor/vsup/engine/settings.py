"""The engine's settings: how long it waits for what, and how much of a run's log it keeps.

One frozen record, so the daemon, the tests and the benchmarks say which of them they change
(`EngineSettings(health_timeout_s=1.0)`), and the runner and teardown read them through
`host.settings`. The callables the engine asks (events out, GPU release, requests running, GPU
memory) are not settings: they are `Engine`'s own parameters.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from vsup.engine import health, stop
from vsup.engine.runlog import DEFAULT_KEEP, DEFAULT_MAX_BYTES


@dataclass(frozen=True)
class EngineSettings:
    """Every field has the daemon's default."""

    # the environment children start from (None: the daemon's, read at each spawn)
    base_env: Mapping[str, str] | None = None
    health_timeout_s: float = health.DEFAULT_TIMEOUT_S  # one /health check
    # after an exit of a GPU instance, how long the GPUs may still list its memory
    gpu_release_timeout_s: float = 60.0
    kill_wait_s: float = stop.KILL_WAIT_S  # after SIGKILL, how long a tree may take to go
    log_keep_runs: int = DEFAULT_KEEP  # run logs kept per instance
    log_max_bytes: int = DEFAULT_MAX_BYTES  # a run log's cap (one `.1` copy beside it)
    # spawns of an exit that recurs whatever vsup does (bad_args, ...) before the breaker trips
    deterministic_spawns: int = 1
    chores_interval_s: float = 5.0  # process tree rescan and log guard check, per instance
    memory_poll_s: float = 1.0  # a start waiting for GPU memory re-reads the figures so often
    stuck_poll_s: float = 1.0  # processes that outlived SIGKILL are looked for so often
