"""A pull as people read it (`vsup status`, `vsup up`, `vsup pull`, the dashboard): sizes,
durations, the one line of status JSON's `pulls[]` and the mark on an instance's state.
Stdlib only: the dashboard, the CLI and the pull package share it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vsup.states import PullState


def human_bytes(n: float | None) -> str:
    """`1.5 GiB`, `312 MiB`, `12.0 KiB`, `512 B` (None: `?`)."""
    if n is None:
        return "?"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024:
            if unit == "B":
                return f"{int(value)} B"
            return f"{value:.1f} {unit}" if value < 100 else f"{value:.0f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB" if value < 100 else f"{value:.0f} TiB"


def duration(s: float | None) -> str:
    """`42s`, `3m05s`, `2h07m` (None: `?`)."""
    if s is None:
        return "?"
    s = int(round(s))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def _get(p: Any, key: str) -> Any:
    return p.get(key) if isinstance(p, Mapping) else getattr(p, key, None)


def label(p: Any) -> str:
    """`org/name` or `org/name@rev` (the default branch is left out)."""
    rev = _get(p, "revision")
    return _get(p, "model") + ("" if rev in (None, "main") else f"@{rev}")


def percent(p: Any) -> str | None:
    total, done = _get(p, "bytes_total"), _get(p, "bytes_done")
    if not total:
        return None
    return f"{min(100, int(100 * (done or 0) / total))}%"


def pull_line(p: Any) -> str:
    """`PULL org/name for a, b: 12.1 GiB/28.0 GiB (43%), 85.0 MiB/s, ETA 3m12s, 2/5 files` or
    `PULL FAILED org/name for a, b (unauthorized): ...` (a status JSON `pulls[]` object or a
    snapshot.PullStatus)."""
    who = ", ".join(_get(p, "instances") or ())
    head = f"{label(p)}" + (f" for {who}" if who else "")
    state = _get(p, "state")
    if state == PullState.FAILED:
        return f"PULL FAILED {head} ({_get(p, 'reason')}): {_get(p, 'message')}"
    if state == PullState.CANCELLED:
        return f"PULL CANCELLED {head}: {_get(p, 'message')}"
    if state == PullState.DONE:
        return f"PULLED {head}: {human_bytes(_get(p, 'bytes_total'))} in {_get(p, 'snapshot')}"
    total = _get(p, "bytes_total")
    if not total:
        return f"PULL {head}: asking the hub which files to fetch"
    parts = [f"PULL {head}: {human_bytes(_get(p, 'bytes_done'))}/{human_bytes(total)}"]
    pct = percent(p)
    if pct:
        parts[0] += f" ({pct})"
    rate, eta = _get(p, "rate_bps"), _get(p, "eta_s")
    if rate:
        parts.append(f"{human_bytes(rate)}/s")
    if rate and eta is not None:
        parts.append(f"ETA {duration(eta)}")
    if _get(p, "files_total"):
        parts.append(f"{_get(p, 'files_done') or 0}/{_get(p, 'files_total')} files")
    return ", ".join(parts)


def state_mark(p: Any) -> str | None:
    """What an instance's state cell adds for its pull: `pulling 43%`, `pull failed`."""
    if p is None:
        return None
    state = _get(p, "state")
    if state == PullState.PULLING:
        pct = percent(p)
        return f"pulling {pct}" if pct else "pulling"
    if state == PullState.FAILED:
        return "pull failed"
    return None
