"""The layouts the daemon applied last, for `vsup rollback` (docs/canary.md, "Rollback").

The journal holds every apply with its TOML text, but it is rotated (16 MiB, one old generation
kept): on a busy node the layout before the running one can be gone from it. So the daemon also
keeps the texts of its last `KEEP` applies in `$VSUP_HOME/layouts.json` (mode 0600: a layout
may name secrets' variables; written atomically on each apply). Re-applying the text applied
last replaces its entry (newest time and seq) instead of adding one, so re-applying one file
does not push the older layouts out. A home without the file (a vsup older than it) starts
from the journal's applies.

`choose` is what `vsup rollback` goes back to: the newest kept layout whose text differs from
the running one (not simply the one before the newest: a layout applied twice would make that
the running one again), or the one a `seq` names.

A `vsup bench` (or `vsup tune`) applies its candidate layouts and then the original again: the
candidates are not kept (`bench_candidate`: the layout lease of a bench that still runs lists
them), so a rollback after a bench goes back to the layout before the original, not to the
bench's last candidate.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from vsup.fsutil import write_atomic
from vsup.journalevents import ActionEvent, JournalEvent, as_event
from vsup.lease import read_lease

log = logging.getLogger(__name__)

KEEP = 10  # applied layouts kept
FORMAT = 1


class NoLayout(ValueError):
    """No kept layout fits what was asked (the message says why, in words)."""


@dataclass(frozen=True)
class KeptLayout:
    """One applied layout: its text as applied, the journal `seq` and time `t` of its apply,
    the layout's `name` and the `path` it was applied from (None: applied without a file)."""

    seq: int
    toml: str
    t: str | None = None
    name: str | None = None
    path: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: Any) -> KeptLayout | None:
        """The entry of `doc`, or None when it is not one (a hand-edited or foreign file)."""
        if not isinstance(doc, Mapping):
            return None
        seq, toml = doc.get("seq"), doc.get("toml")
        if not isinstance(seq, int) or isinstance(seq, bool) or not isinstance(toml, str):
            return None

        def text(key: str) -> str | None:
            value = doc.get(key)
            return value if isinstance(value, str) else None

        return cls(seq=seq, toml=toml, t=text("t"), name=text("name"), path=text("path"))


def remember(kept: list[KeptLayout], new: KeptLayout, keep: int = KEEP) -> list[KeptLayout]:
    """`kept` (oldest first) with `new` applied: the newest `keep`; the same text as the newest
    entry replaces it."""
    out = list(kept)
    if out and out[-1].toml == new.toml:
        out.pop()
    out.append(new)
    return out[-keep:]


def choose(kept: Iterable[KeptLayout], running: str | None, seq: int | None = None) -> KeptLayout:
    """What `vsup rollback` applies: the kept layout `seq` names, else the newest one whose
    text is not the `running` one's. NoLayout says why there is none."""
    newest_first = sorted(kept, key=lambda k: k.seq, reverse=True)
    if seq is not None:
        for k in newest_first:
            if k.seq == seq:
                return k
        have = ", ".join(str(k.seq) for k in newest_first) or "none"
        raise NoLayout(f"no kept layout has seq {seq} (kept: {have}; `vsup rollback --list`)")
    if not newest_first:
        raise NoLayout("no layout was applied on this node yet, so there is none to go back to")
    for k in newest_first:
        if k.toml != running:
            return k
    raise NoLayout(
        "no previous layout: every kept layout is the running one "
        f"({len(newest_first)} kept; vsup keeps the last {KEEP} applied)"
    )


def bench_candidate(home: Path, toml: str) -> bool:
    """Whether `toml` is applied by a running bench (one of its layout lease's layouts)."""
    lease = read_lease(home)
    return lease is not None and lease.holds(toml) and lease.alive()


def journal_applies(
    events: Iterable[JournalEvent | Mapping[str, Any]],
) -> Iterable[KeptLayout]:
    """The journal's applies that carry their text, oldest first."""
    for raw in events:
        ev = as_event(raw)
        if isinstance(ev, ActionEvent) and ev.action == "apply" and ev.seq is not None:
            doc = {"seq": ev.seq, "toml": ev.toml, "t": ev.t, "name": ev.layout, "path": ev.path}
            kept = KeptLayout.from_json(doc)  # a garbled field is left out, as in the file
            if kept is not None:
                yield kept


class LayoutHistory:
    """`$VSUP_HOME/layouts.json`: read once (then kept in memory), rewritten on each apply.
    `journal_applies` gives the journal's applies for a home without the file."""

    def __init__(
        self, path: Path, journal_applies: Callable[[], Iterable[KeptLayout]] | None = None
    ) -> None:
        self.path = Path(path)
        self._journal_applies = journal_applies
        self._lock = threading.Lock()
        self._kept: list[KeptLayout] | None = None

    def entries(self) -> list[KeptLayout]:
        """The kept layouts, oldest first."""
        with self._lock:
            return list(self._load_locked())

    def record(self, new: KeptLayout) -> None:
        """Keep `new` (an apply just journaled) and write the file. A write that fails (a full
        disk) is logged; the apply stands and the layout stays in memory and the journal."""
        with self._lock:
            self._kept = remember(self._load_locked(), new)
            doc = {"format": FORMAT, "layouts": [k.to_json() for k in self._kept]}
            try:
                write_atomic(self.path, json.dumps(doc, indent=1) + "\n", mode=0o600)
            except OSError as exc:
                log.warning("cannot write %s: %s", self.path, exc)

    def _load_locked(self) -> list[KeptLayout]:
        if self._kept is None:
            self._kept = self._read()
        return self._kept

    def _read(self) -> list[KeptLayout]:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return self._from_journal()
        except OSError as exc:
            log.warning("cannot read %s: %s", self.path, exc)
            return self._from_journal()
        try:
            doc = json.loads(raw)
        except ValueError:
            log.warning("%s is not JSON; the kept layouts start from the journal", self.path)
            return self._from_journal()
        items = doc.get("layouts") if isinstance(doc, dict) else None
        found = [k for k in map(KeptLayout.from_json, items or []) if k is not None]
        return sorted(found, key=lambda k: k.seq)[-KEEP:]

    def _from_journal(self) -> list[KeptLayout]:
        out: list[KeptLayout] = []
        for k in self._journal_applies() if self._journal_applies else ():
            out = remember(out, k)
        return out
