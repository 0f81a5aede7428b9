"""The daemon's state file: what a daemon started after a crash needs to re-adopt instances.

`$VSUP_HOME/state.json` holds, per instance, the pid, its start time (psutil `create_time`,
which tells a live instance from a reused pid), the process group, port, run number, restarts,
last exit and the spec it runs, plus the running layout's path and text. It is written
atomically (temp file + fsync + rename) and the previous good file is kept as `state.json.bak`,
so a torn or corrupted file costs at most one step of history - and the journal replays that.
A file that does not parse is moved aside (`state.json.corrupt-<time>`) and reported, never fatal.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from vsup.fsutil import write_atomic
from vsup.layout.spec import InstanceSpec, RestartPolicy, SleepSpec, SpanRole

STATE_VERSION = 1


@dataclass
class InstanceRecord:
    """What the state file keeps about one instance."""

    name: str
    spec: dict[str, Any]
    state: str = "stopped"
    pid: int | None = None
    create_time: float | None = None  # psutil.Process(pid).create_time()
    pgid: int | None = None
    port: int | None = None
    run: int = 0
    restarts: int = 0
    last_exit: dict[str, Any] | None = None
    descendants: dict[str, float] = field(default_factory=dict)  # pid -> create_time
    adopted: bool = False  # this run was taken over from an earlier daemon
    failed_why: str | None = None  # state `failed`: why (Lifecycle.failed_why)


@dataclass
class DaemonState:
    """The whole state file."""

    layout_path: str | None = None
    layout_toml: str | None = None
    layout_name: str | None = None
    instances: dict[str, InstanceRecord] = field(default_factory=dict)
    written_at: float | None = None
    daemon_pid: int | None = None
    journal_seq: int = 0  # the journal's next seq when this was written (replay starts there)
    # the router (engine/routing.py `adopt_record`): its spec and process, None without one
    router: dict[str, Any] | None = None
    # the latest rolling apply (engine/rollout.py `Rollout.to_record`), None before one: a
    # daemon killed in the middle of one leaves it `running` here for the next to report
    rollout: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "written_at": self.written_at,
            "daemon_pid": self.daemon_pid,
            "journal_seq": self.journal_seq,
            "layout": {
                "path": self.layout_path,
                "toml": self.layout_toml,
                "name": self.layout_name,
            },
            "instances": {name: asdict(rec) for name, rec in self.instances.items()},
            "router": self.router,
            "rollout": self.rollout,
        }

    @classmethod
    def from_json(cls, doc: Any) -> DaemonState:
        """Parse a state document; raises ValueError naming what is wrong."""
        if not isinstance(doc, dict):
            raise ValueError("the top level is not an object")
        if doc.get("version") != STATE_VERSION:
            raise ValueError(f"version {doc.get('version')!r} (expected {STATE_VERSION})")
        layout = doc.get("layout") or {}
        if not isinstance(layout, dict):
            raise ValueError("'layout' is not an object")
        raw = doc.get("instances")
        if not isinstance(raw, dict):
            raise ValueError("'instances' is not an object")
        instances = {}
        for name, rec in raw.items():
            instances[name] = _record(name, rec)
        return cls(
            layout_path=_opt(layout.get("path"), str, "layout.path"),
            layout_toml=_opt(layout.get("toml"), str, "layout.toml"),
            layout_name=_opt(layout.get("name"), str, "layout.name"),
            instances=instances,
            written_at=_opt(doc.get("written_at"), (int, float), "written_at"),
            daemon_pid=_opt(doc.get("daemon_pid"), int, "daemon_pid"),
            journal_seq=_opt(doc.get("journal_seq", 0), int, "journal_seq") or 0,
            router=_opt(doc.get("router"), dict, "router"),
            rollout=_opt(doc.get("rollout"), dict, "rollout"),
        )


def _opt(value: Any, types: Any, key: str) -> Any:
    if value is not None and (not isinstance(value, types) or isinstance(value, bool)):
        raise ValueError(f"{key!r} has the wrong type ({type(value).__name__})")
    return value


def _record(name: str, rec: Any) -> InstanceRecord:
    if not isinstance(rec, dict):
        raise ValueError(f"instance {name!r} is not an object")
    where = f"instances.{name}"
    spec = rec.get("spec")
    if not isinstance(spec, dict):
        raise ValueError(f"{where}.spec is missing")
    try:
        spec_from_dict(spec)  # fail here, not at adoption, on a spec the engine cannot run
    except ValueError as exc:
        raise ValueError(f"{where}.spec: {exc}") from None
    last_exit = rec.get("last_exit")
    if last_exit is not None and not isinstance(last_exit, dict):
        raise ValueError(f"{where}.last_exit is not an object")
    descendants = rec.get("descendants") or {}
    if not isinstance(descendants, dict) or not all(
        isinstance(v, (int, float)) for v in descendants.values()
    ):
        raise ValueError(f"{where}.descendants is not an object of start times")
    return InstanceRecord(
        name=name,
        spec=spec,
        state=_opt(rec.get("state", "stopped"), str, f"{where}.state"),
        pid=_opt(rec.get("pid"), int, f"{where}.pid"),
        create_time=_opt(rec.get("create_time"), (int, float), f"{where}.create_time"),
        pgid=_opt(rec.get("pgid"), int, f"{where}.pgid"),
        port=_opt(rec.get("port"), int, f"{where}.port"),
        run=_opt(rec.get("run", 0), int, f"{where}.run") or 0,
        restarts=_opt(rec.get("restarts", 0), int, f"{where}.restarts") or 0,
        last_exit=last_exit,
        descendants={str(k): float(v) for k, v in descendants.items()},
        adopted=bool(rec.get("adopted", False)),
        failed_why=_opt(rec.get("failed_why"), str, f"{where}.failed_why"),
    )


def spec_to_dict(spec: InstanceSpec) -> dict[str, Any]:
    """An InstanceSpec as plain JSON data (tuples become lists)."""
    doc = asdict(spec)
    doc["args"] = dict(spec.args)
    doc["env"] = dict(spec.env)
    return json.loads(json.dumps(doc))


def spec_from_dict(doc: dict[str, Any]) -> InstanceSpec:
    """The inverse of `spec_to_dict`; raises ValueError on a document it cannot rebuild."""
    try:
        data = dict(doc)
        restart = data.pop("restart", None) or {}
        data["command"] = tuple(data["command"])
        data["gpus"] = tuple(int(g) for g in data.get("gpus") or ())
        data["profiles"] = tuple(data.get("profiles") or ())
        data["args"] = dict(data.get("args") or {})
        data["env"] = {str(k): str(v) for k, v in (data.get("env") or {}).items()}
        known = set(InstanceSpec.__dataclass_fields__)
        data = {k: v for k, v in data.items() if k in known}
        sleep = data.pop("sleep", None)
        span = data.pop("span", None)
        return InstanceSpec(
            restart=RestartPolicy(**restart),
            sleep=SleepSpec(**sleep) if sleep is not None else None,
            span=SpanRole.from_json(span) if span is not None else None,
            **data,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"cannot rebuild the instance spec ({type(exc).__name__}: {exc})") from exc


@dataclass
class LoadResult:
    state: DaemonState | None  # None when there was nothing usable
    source: str  # "state" | "backup" | "none"
    problem: str | None = None  # set when the state file was missing parts or corrupt
    moved_to: Path | None = None  # where a corrupt file was moved


class StateFile:
    """Atomic reads and writes of `$VSUP_HOME/state.json` with a `.bak` of the last good one."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.backup = self.path.with_name(self.path.name + ".bak")

    def load(self) -> LoadResult:
        """Read the state; fall back to the backup when the file is corrupt or truncated."""
        problem = None
        moved = None
        if self.path.exists():
            try:
                return LoadResult(self._read(self.path), "state")
            except (OSError, ValueError) as exc:
                moved = self._move_aside()
                problem = f"state file {self.path} is unreadable ({exc})"
                if moved:
                    problem += f"; moved to {moved.name}"
        if self.backup.exists():
            try:
                state = self._read(self.backup)
            except (OSError, ValueError) as exc:
                note = f"backup {self.backup} is unreadable too ({exc})"
                problem = f"{problem}; {note}" if problem else note
                return LoadResult(None, "none", problem, moved)
            if problem is None:
                # A crash between the backup link and the rename leaves only the backup.
                problem = f"state file {self.path} is missing; using the backup"
            else:
                problem += "; using the backup"
            return LoadResult(state, "backup", problem, moved)
        return LoadResult(None, "none", problem, moved)

    def load_quietly(self) -> DaemonState | None:
        """The state (or its backup) for a quick look by a client; changes nothing on disk."""
        for path in (self.path, self.backup):
            try:
                return self._read(path)
            except (OSError, ValueError):
                continue
        return None

    def save(self, state: DaemonState) -> None:
        """Write `state` atomically; the file it replaces becomes the backup."""
        state.written_at = time.time()
        data = json.dumps(state.to_json(), indent=1, sort_keys=True).encode()
        if self.path.exists():
            # Link then rename: there is always a state.json, and the .bak is the last good one
            # (a write that fails on a full disk leaves both as they were).
            bak_tmp = self.backup.with_name(self.backup.name + ".tmp")
            try:
                bak_tmp.unlink(missing_ok=True)
                os.link(self.path, bak_tmp)
                os.replace(bak_tmp, self.backup)
            except OSError:
                pass  # a backup is a nicety; the new state must still be written
        write_atomic(self.path, data, mode=0o600)

    def _read(self, path: Path) -> DaemonState:
        text = path.read_bytes()
        try:
            doc = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"not JSON: {exc}") from exc
        return DaemonState.from_json(doc)

    def _move_aside(self) -> Path | None:
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        dest = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
        try:
            os.replace(self.path, dest)
            return dest
        except OSError:
            return None
