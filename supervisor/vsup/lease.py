"""The layout lease: a client that replaces the running layout for a while (`vsup bench`, and
`vsup tune` when it comes) writes down, before its first apply, who it is, what it replaced and
which layouts it may apply, in `$VSUP_HOME/layout-lease.json`; it removes the lease once the
original layout is back (or kept on purpose).

A lease left behind means a client died (SIGKILL, a crash, the node's OOM killer) with its own
layout still running: the daemon shows it as advice (`bench_abandoned`, control/benchprogress.py)
as long as one of the lease's layouts is the running one, and `vsup bench --restore` puts the
original back from it. A lease whose client still runs is that client's business; one whose
layouts no longer run (someone applied another layout since) is over and is ignored.

The client's identity is its pid and its start time (`/proc/PID/stat` field 22, clock ticks
since boot), so a reused pid is never taken for the client.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from vsup.fsutil import write_atomic

LEASE_NAME = "layout-lease.json"
VERSION = 1


@dataclass
class Lease:
    """Who replaced the running layout, what it replaced, what it may apply."""

    owner: str  # "bench"
    pid: int
    start_ticks: int | None  # the owner's start time (/proc/PID/stat), to tell a reused pid
    started_at: str  # ISO-8601 UTC
    # what ran before: {"toml", "path", "name", "serving": [..], "idle": [..],
    # "daemon_was_running": bool}
    original: dict[str, Any]
    layouts: list[dict[str, Any]] = field(default_factory=list)  # [{"name", "sha256"}]

    def alive(self) -> bool:
        """Whether the client that holds the lease still runs."""
        ticks = start_ticks(self.pid)
        return ticks is not None and (self.start_ticks is None or ticks == self.start_ticks)

    def holds(self, toml: str | None) -> bool:
        """Whether `toml` (the running layout's text) is one of the lease's layouts."""
        if toml is None:
            return False
        sha = layout_sha(toml)
        return any(lay.get("sha256") == sha for lay in self.layouts)

    def replaced_name(self) -> str:
        return str(self.original.get("name") or "(unnamed)") if self.original.get("toml") else ""

    def to_json(self) -> dict[str, Any]:
        return {"version": VERSION, **asdict(self)}

    @classmethod
    def from_json(cls, doc: Any) -> Lease | None:
        if not isinstance(doc, dict) or doc.get("version") != VERSION:
            return None
        try:
            return cls(
                owner=str(doc["owner"]),
                pid=int(doc["pid"]),
                start_ticks=None if doc.get("start_ticks") is None else int(doc["start_ticks"]),
                started_at=str(doc["started_at"]),
                original=dict(doc["original"]),
                layouts=[dict(x) for x in doc.get("layouts") or ()],
            )
        except (KeyError, TypeError, ValueError):
            return None


def lease_path(home: Path) -> Path:
    return Path(home) / LEASE_NAME


def read_lease(home: Path) -> Lease | None:
    """The lease in `home`, or None (none, or unreadable: a torn one is no lease)."""
    try:
        doc = json.loads(lease_path(home).read_text())
    except (OSError, ValueError):
        return None
    return Lease.from_json(doc)


def write_lease(home: Path, lease: Lease) -> None:
    """Write the lease atomically (0600: the original layout's text is in it)."""
    write_atomic(lease_path(home), json.dumps(lease.to_json(), indent=1) + "\n", mode=0o600)


def clear_lease(home: Path, pid: int | None = None) -> None:
    """Remove the lease (only `pid`'s, when given: a later client's is not ours to drop)."""
    if pid is not None:
        lease = read_lease(home)
        if lease is not None and lease.pid != pid:
            return
    with contextlib.suppress(FileNotFoundError):
        lease_path(home).unlink()


def layout_sha(toml: str) -> str:
    return hashlib.sha256(toml.encode("utf-8", errors="surrogatepass")).hexdigest()


def start_ticks(pid: int) -> int | None:
    """The start time of `pid` in clock ticks since boot, or None when it does not run (or is a
    zombie)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) is in parentheses and may hold spaces or parentheses
    fields = raw[raw.rfind(")") + 2 :].split()
    try:
        if fields[0] == "Z":
            return None
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def my_start_ticks() -> int | None:
    return start_ticks(os.getpid())
