"""A sleeping instance as people read it (`vsup status`, the dashboard): the words for its
sleep state and the one line of detail. Stdlib only, like pullview and routerview: the CLI,
the dashboard and the Prometheus export share the words.

A sleeper is a live, healthy vLLM server (its `state` stays `ready`) that holds almost no GPU
memory and must get no request (docs/sleep.md); `InstanceStatus.sleep` is None for an
instance without sleep mode.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vsup.states import SleepState

if TYPE_CHECKING:  # `vsup status --json` imports this module: no snapshot parsing needed there
    from vsup.snapshot import SleepStatus

# SleepState -> what the state column says (level and ellipsis added by `state_word`).
_WORDS: dict[str, str] = {
    SleepState.AWAKE: "awake",
    SleepState.FALLING_ASLEEP: "falling asleep",
    SleepState.ASLEEP: "asleep",
    SleepState.WAKING: "waking",
    SleepState.UNKNOWN: "sleep unknown",
}
# Sleep levels in words: what a wake has to do.
LEVEL_WORDS: dict[int, str] = {1: "weights in host RAM", 2: "weights dropped"}


def sleeping(s: SleepStatus | None) -> bool:
    """Whether it serves nothing because of sleep mode (asleep, or on its way in or out)."""
    return s is not None and s.state != SleepState.AWAKE


def state_word(s: SleepStatus, ellipsis: str = "…", short: bool = False) -> str:
    """`asleep L1`, `falling asleep…`, `waking…`, `awake` (an unknown state: as it came);
    `short` (a table cell): `sleeping…` for falling asleep."""
    word = _WORDS.get(s.state, str(s.state).replace("_", " "))
    if short and s.state == SleepState.FALLING_ASLEEP:
        word = "sleeping"
    if s.state == SleepState.ASLEEP:
        return f"{word} L{s.level}"
    if s.state in (SleepState.FALLING_ASLEEP, SleepState.WAKING):
        return word + ellipsis
    return word


def _duration(seconds: float | None) -> str:
    """`0.8s` below a minute (sleeps and wakes take seconds), `3m05s`, `2h07m`."""
    if seconds is None:
        return "?"
    if seconds < 60:
        return f"{seconds:.1f}s"
    s = int(round(seconds))
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def detail_parts(s: SleepStatus) -> list[str]:
    """The pieces of the detail line, most important first: where it is and since when, its
    level and group, what the last sleep and wake took, what it keeps, the idle countdown,
    and why the last sleep or wake failed."""
    head = _WORDS.get(s.state, str(s.state).replace("_", " "))  # its level follows
    if s.since_s is not None:
        head += f" for {_duration(s.since_s)}"
    parts = [head]
    level = f"level {s.level}"
    if s.level in LEVEL_WORDS:
        level += f" ({LEVEL_WORDS[s.level]})"
    parts.append(level)
    if s.group:
        parts.append(f"swap group {s.group}")
    took = []
    if s.last_sleep_s is not None:
        took.append(f"sleep {_duration(s.last_sleep_s)}")
    if s.last_wake_s is not None:
        took.append(f"wake {_duration(s.last_wake_s)}")
    if took:
        parts.append("last " + ", ".join(took))
    if s.held_bytes is not None and s.state != SleepState.AWAKE:
        parts.append(f"keeps {_gib(s.held_bytes)} of GPU memory")
    if s.kept_growth_bytes:
        grew = "+" if s.kept_growth_bytes > 0 else "-"
        parts.append(
            f"kept {grew}{_gib(abs(s.kept_growth_bytes))} since its first sleep "
            f"({len(s.kept_bytes)} sleeps)"
        )
    if s.idle_sleep_in_s is not None and s.state == SleepState.AWAKE:
        parts.append(f"idle sleep in {_duration(s.idle_sleep_in_s)}")
    if s.error:
        parts.append(f"last error: {s.error}")
    return parts


def detail_line(s: SleepStatus) -> str:
    """`asleep for 2m10s · level 1 (weights in host RAM) · swap group g0 · last sleep 1.2s,
    wake 0.9s · keeps 1.7 GiB of GPU memory`."""
    return " · ".join(detail_parts(s))
