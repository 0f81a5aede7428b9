"""The append-only event journal `$VSUP_HOME/journal.jsonl`.

One JSON object a line: spawns, readiness, exits with their reasons, restarts, adoptions and
operator actions, each with a `seq` that keeps counting across daemon restarts (clients page
through `/v1/events?since=N` with it). Lines are written with one `write` on an O_APPEND file,
so a crash leaves at most a torn last line, which readers skip (as they skip a line whose
`seq` is not a number: an edited or foreign journal never makes `/v1/events` fail).

Append-safe on a full disk: `append` never raises. A write that fails (ENOSPC, EIO) keeps the
event in memory, queued in order; `write_error` says why, and every later `append` (and
`flush_pending`, which the daemon calls each second) retries the queue first. After a failed or
short write the next record starts with a newline, so a torn fragment stays on a line of its
own and never swallows the record after it; readers parse line by line and skip what does not
parse.

`replay` folds the journal into the last known process of each instance: a daemon whose state
file was lost or corrupted uses it to find instances still running.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vsup.clock import iso_utc
from vsup.journalevents import (
    ActionEvent,
    AdoptEvent,
    ExitEvent,
    JournalEvent,
    RestartScheduledEvent,
    SpawnEvent,
    as_event,
    decode,
)

# How many recent events are served from memory; older ones come from the file.
MEMORY_EVENTS = 2000
# Events kept for a retry while the journal cannot be written; the oldest go first beyond it.
MAX_PENDING = 10000
# The journal is rotated to journal.jsonl.1 past this size (one old generation is kept).
ROTATE_BYTES = 16 * 1024 * 1024
_TAIL_SCAN = 256 * 1024


class Journal:
    """Append events; read them back by sequence number."""

    def __init__(self, path: Path, clock_wall: Callable[[], float] | None = None) -> None:
        import time

        self.path = Path(path)
        self._wall = clock_wall or time.time
        self._lock = threading.Lock()
        self._recent: deque[dict[str, Any]] = deque(maxlen=MEMORY_EVENTS)
        self.skipped_lines = 0  # torn or garbled lines met while opening
        self.write_error: str | None = None  # why the last write failed; None once one works
        self.dropped = 0  # events lost because the pending queue overflowed
        self._pending: deque[bytes] = deque()
        # True when the file may end mid-line (a failed or short write): start with a newline.
        self._torn = False
        self._next = self._scan_last_seq() + 1
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    @property
    def next_seq(self) -> int:
        return self._next

    @property
    def pending(self) -> int:
        """Events waiting to be written (the disk refused them so far)."""
        return len(self._pending)

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                self._flush_locked()
                os.close(self._fd)
                self._fd = -1

    def append(self, event: JournalEvent) -> JournalEvent:
        """Write one event (its type's `to_json()`, a line) and return it with its `seq` and
        `t` (the journal's clock: the moment it was written)."""
        with self._lock:
            event = dataclasses.replace(event, seq=self._next, t=iso_utc(self._wall()))
            doc = event.to_json()
            line = json.dumps(doc, default=str, separators=(",", ":")) + "\n"
            self._next += 1
            self._recent.append(doc)
            if len(self._pending) >= MAX_PENDING:
                self._pending.popleft()
                self.dropped += 1
            self._pending.append(line.encode())
            self._flush_locked()
        return event

    def flush_pending(self) -> bool:
        """Retry events the disk refused; True when nothing is left pending."""
        with self._lock:
            self._flush_locked()
            return not self._pending

    def _flush_locked(self) -> None:
        if self._fd < 0:
            self._pending.clear()  # closed: nothing more is written (as before a close)
            return
        while self._pending:
            data = self._pending[0]
            if self._torn:
                data = b"\n" + data
            try:
                written = os.write(self._fd, data)
            except OSError as exc:
                self._torn = True  # part of it may be on disk
                self.write_error = f"cannot write {self.path}: {exc.strerror or exc}"
                return
            if written < len(data):
                # A short write on a nearly full disk: the rest is retried as a fresh record.
                self._torn = True
                self.write_error = f"cannot write {self.path}: short write (disk full?)"
                return
            self._torn = False
            self._pending.popleft()
        self.write_error = None
        self._maybe_rotate()

    def read(self, since: int = 0, limit: int = 1000) -> tuple[list[dict[str, Any]], int]:
        """Events with `seq >= since` (at most `limit`), and the `since` for the next call."""
        with self._lock:
            recent = list(self._recent)
            nxt = self._next
        if recent and since >= recent[0]["seq"]:
            events = [e for e in recent if e["seq"] >= since][:limit]
        else:
            events = [e for e in self.iter_file() if e["seq"] >= since][:limit]
        next_since = events[-1]["seq"] + 1 if events else nxt
        return events, next_since

    def iter_file(self) -> Iterator[dict[str, Any]]:
        """Every parseable event on disk, the rotated generation first."""
        for path in (self.path.with_name(self.path.name + ".1"), self.path):
            yield from _parse_lines(path)

    def iter_events(self) -> Iterator[JournalEvent]:
        """`iter_file`, each event as its type."""
        for doc in self.iter_file():
            yield decode(doc)

    def _scan_last_seq(self) -> int:
        if not self.path.exists():
            return 0
        size = self.path.stat().st_size
        with open(self.path, "rb") as fh:
            if size > _TAIL_SCAN:
                fh.seek(size - _TAIL_SCAN)
                fh.readline()  # a partial line
            data = fh.read()
        last = 0
        for raw in data.splitlines():
            event = parse_line(raw)
            if event is None:
                self.skipped_lines += 1
                continue
            last = max(last, event["seq"])
            self._recent.append(event)
        if data and not data.endswith(b"\n"):
            # A torn last line: the next event starts on a line of its own.
            self._torn = True
        return last

    def _maybe_rotate(self) -> None:
        try:
            if os.fstat(self._fd).st_size < ROTATE_BYTES:
                return
            os.replace(self.path, self.path.with_name(self.path.name + ".1"))
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        except OSError:
            return  # the old fd still writes (to the rotated file); retried at the next event
        os.close(self._fd)
        self._fd = fd


def _parse_lines(path: Path) -> Iterator[dict[str, Any]]:
    try:
        fh = open(path, "rb")
    except OSError:
        return
    with fh:
        for raw in fh:
            event = parse_line(raw)
            if event is not None:
                yield event


def parse_line(raw: bytes) -> dict[str, Any] | None:
    """One journal line as an event, or None. A line that a torn write of an older vsup ran
    into the next record still yields that record: parsing resyncs at its last `{"seq":`.
    Every event returned has an integer `seq` (a number written as a string, `"12"`, is read
    as 12; any other seq makes the line unreadable, like a torn one), so readers can compare
    and page by it."""
    try:
        event = json.loads(raw)
    except (ValueError, RecursionError):
        at = raw.rfind(b'{"seq":')
        if at <= 0:
            return None
        try:
            event = json.loads(raw[at:])
        except (ValueError, RecursionError):
            return None
    if not isinstance(event, dict):
        return None
    seq = event.get("seq")
    if isinstance(seq, str) and seq.strip().isdigit():
        event["seq"] = seq = int(seq)
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
        return None
    return event


@dataclass
class ReplayedInstance:
    """The last known process of one instance according to the journal."""

    name: str
    pid: int | None = None
    pgid: int | None = None
    create_time: float | None = None
    port: int | None = None
    run: int = 0
    restarts: int = 0
    running: bool = False
    last_exit: dict[str, Any] | None = None
    spec: dict[str, Any] | None = None
    last_seq: int = 0
    kinds: list[str] = field(default_factory=list)


def replay(
    events: Iterable[JournalEvent | Mapping[str, Any]], after_seq: int = 0
) -> dict[str, ReplayedInstance]:
    """Fold events (seq > after_seq) into each instance's last known process."""
    out: dict[str, ReplayedInstance] = {}
    for raw in events:
        ev = as_event(raw)
        name = ev.instance
        if ev.seq is None or ev.seq <= after_seq or name is None:
            continue
        rec = out.setdefault(name, ReplayedInstance(name))
        rec.last_seq = ev.seq
        rec.kinds.append(ev.kind)
        if isinstance(ev, (SpawnEvent, AdoptEvent)):
            _replay_start(rec, ev)
        elif isinstance(ev, ExitEvent) or ev.kind == "vanished":  # vanished: an older vsup's
            doc = ev.to_json()  # a `vanished` of an older vsup has no type: read its keys
            rec.running = False
            rec.last_exit = {
                k: doc.get(k) for k in ("code", "signal", "reason", "at", "log_excerpt")
            } | {"at": doc.get("at") or ev.t}
            rec.restarts = doc.get("restarts") or rec.restarts
        elif isinstance(ev, RestartScheduledEvent):
            rec.restarts = ev.restarts or rec.restarts
    return out


def _replay_start(rec: ReplayedInstance, ev: SpawnEvent | AdoptEvent) -> None:
    rec.pid = ev.pid if ev.pid is not None else rec.pid
    rec.pgid = ev.pgid if ev.pgid is not None else rec.pgid
    rec.create_time = ev.create_time if ev.create_time is not None else rec.create_time
    rec.port = ev.port if ev.port is not None else rec.port
    rec.run = ev.run or rec.run
    rec.restarts = ev.restarts or rec.restarts
    if isinstance(ev.spec, dict):
        rec.spec = ev.spec
    rec.running = True


@dataclass
class AppliedLayout:
    """The layout of the last `apply` the journal holds."""

    seq: int
    toml: str
    path: str | None
    name: str | None


def last_layout(events: Iterable[JournalEvent | Mapping[str, Any]]) -> AppliedLayout | None:
    """The layout of the last `apply` event that carries its text (None when there is none)."""
    found = None
    for raw in events:
        ev = as_event(raw)
        if not isinstance(ev, ActionEvent) or ev.action != "apply":
            continue
        if isinstance(ev.toml, str) and ev.seq is not None:
            found = AppliedLayout(
                seq=ev.seq,
                toml=ev.toml,
                path=ev.path if isinstance(ev.path, str) else None,
                name=ev.layout if isinstance(ev.layout, str) else None,
            )
    return found
