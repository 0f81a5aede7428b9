"""Which recorded processes still live: what `vsup down` checks without a daemon to ask."""

from __future__ import annotations

from pathlib import Path

from vsup import paths
from vsup.control.state import StateFile
from vsup.engine import proc


def process_matches(pid: int | None, create_time: float | None) -> bool:
    """Whether `pid` is alive and is the very process that started at `create_time` (the
    engine's identity check: start times within `proc.SAME_PROCESS_S`, so a reused pid is
    never taken for the process recorded)."""
    if not pid or pid <= 0:
        return False
    info = proc.read_stat(pid)
    if info is None or info.state == proc.ZOMBIE:
        return False
    return create_time is None or proc.same_process(info.create_time, create_time)


def recorded_live_instances(home: Path) -> list[str]:
    """Instances the state file says are running and whose process is alive."""
    result = StateFile(paths.state_path(home)).load_quietly()
    if result is None:
        return []
    return [
        name
        for name, rec in result.instances.items()
        if rec.pid and process_matches(rec.pid, rec.create_time)
    ]
