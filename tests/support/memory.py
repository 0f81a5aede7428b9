"""An in-memory control client: serves injected snapshots, logs and configs, records calls.

This is the dashboard's injection boundary (memray's and Harlequin's tests work the same
way): tests, snapshot tests and the render/idle benchmarks drive the real dashboard with it
instead of a daemon. It answers with the control API's JSON shapes (docs/ARCHITECTURE.md)
read as the HTTP client reads them (vsup.answers), and nothing in it stands in for vLLM.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vsup.answers import (
    ActionAnswer,
    ApplyAnswer,
    History,
    InstanceConfig,
    LayoutAnswer,
    LogChunk,
    SaveAnswer,
    decode,
)
from vsup.fsutil import write_atomic
from vsup.snapshot import StatusSnapshot


class DaemonError(Exception):
    """A 4xx answer: `str()` is the daemon's `error` message, `status` the HTTP status."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Call:
    method: str
    args: dict[str, Any]


@dataclass
class MemoryClient:
    """Serves `snapshot` (or whatever `source()` returns) from `status()`.

    `unreachable` set to a message makes every call raise `ConnectionError` (the daemon is
    gone). Logs are kept per instance and run: `logs_current[name]`, `logs_previous[name]`.
    `validate(toml_text, path) -> (errors, warnings)` is used by `apply` and `save`, as the
    daemon does; without it every layout is accepted.
    """

    snapshot: StatusSnapshot | None = None
    source: Callable[[], StatusSnapshot] | None = None
    layout_toml: str = ""
    layout_path: str = "/srv/vsup/layout.toml"
    logs_current: dict[str, str] = field(default_factory=dict)
    logs_previous: dict[str, str] = field(default_factory=dict)
    configs: dict[str, dict[str, Any]] = field(default_factory=dict)
    histories: dict[str, dict[str, list[Any]]] = field(default_factory=dict)
    validate: Callable[[str, str], tuple[list[str], list[str]]] | None = None
    as_json: bool = False  # status() through its JSON document and back, as over HTTP
    unreachable: str | None = None
    calls: list[Call] = field(default_factory=list)

    def _record(self, method: str, **args: Any) -> None:
        self.calls.append(Call(method, args))
        if self.unreachable is not None:
            raise ConnectionError(self.unreachable)

    def calls_to(self, method: str) -> list[dict[str, Any]]:
        """The arguments of every call to `method`, in order."""
        return [c.args for c in self.calls if c.method == method]

    def _known(self, name: str) -> None:
        snap = self.source() if self.source else self.snapshot
        if snap is None or snap.instance(name) is None:
            raise DaemonError(f"unknown instance {name!r}", status=404)

    async def status(self) -> StatusSnapshot:
        self._record("status")
        snap = self.source() if self.source else self.snapshot
        if snap is None:
            raise ConnectionError("no snapshot injected")
        if self.as_json:
            return StatusSnapshot.from_json(json.loads(json.dumps(snap.to_json())))
        return snap

    async def layout(self) -> LayoutAnswer:
        self._record("layout")
        name = None
        if self.layout_toml:
            name = tomllib.loads(self.layout_toml).get("layout", {}).get("name")
        return LayoutAnswer(path=self.layout_path, toml=self.layout_toml, name=name)

    async def apply(self, toml: str, path: str | None = None, dry_run: bool = False) -> ApplyAnswer:
        self._record("apply", toml=toml, path=path, dry_run=dry_run)
        errors, warnings = (
            self.validate(toml, path or self.layout_path) if self.validate else ([], [])
        )
        plan = _plan(self.layout_toml, toml)
        if not errors and not dry_run:
            self.layout_toml = toml
            if path:
                self.layout_path = path
        problems = [{"severity": "error", "message": e, "text": e} for e in errors]
        notes = [{"severity": "warning", "message": w, "text": w} for w in warnings]
        doc = {
            "plan": plan,
            "errors": problems,
            "warnings": notes,
            "applied": not (dry_run or errors),
        }
        return decode(ApplyAnswer, doc, "POST /v1/apply")

    async def action(self, action: str, names: Sequence[str], all: bool = False) -> ActionAnswer:
        self._record("action", action=action, names=list(names), all=all)
        for name in names:
            self._known(name)
        return ActionAnswer(done=tuple(names), errors=())

    async def logs(
        self, name: str, previous: bool = False, offset: int | None = None, tail: int | None = None
    ) -> LogChunk:
        self._record("logs", name=name, previous=previous, offset=offset, tail=tail)
        self._known(name)
        logs = self.logs_previous if previous else self.logs_current
        if name not in logs:
            which = "previous run" if previous else "log yet"
            raise DaemonError(f"instance {name!r} has no {which}", status=404)
        text = logs[name]
        data = text.encode()
        start = offset if offset is not None else 0
        if tail is not None and offset is None:
            start = max(0, len(data) - tail)
        chunk = data[start:]
        return LogChunk(
            run=None,
            path=f"logs/{name}.log",
            offset=start + len(chunk),
            text=chunk.decode(errors="replace"),
            eof=True,
            start=start,
            size=len(data),
        )

    async def config(self, name: str) -> InstanceConfig:
        self._record("config", name=name)
        self._known(name)
        doc = self.configs.get(name, {"argv": [], "env": {}, "cache_config": {}, "spec": {}})
        return decode(InstanceConfig, doc, f"GET /v1/instances/{name}/config")

    async def history(self, name: str) -> History:
        self._record("history", name=name)
        self._known(name)
        empty: dict[str, list[Any]] = {
            "t": [],
            "kv_cache_usage": [],
            "generation_tokens_per_s": [],
            "preemptions_per_min": [],
        }
        return decode(History, self.histories.get(name, empty), f"GET /v1/instances/{name}/history")

    async def rollout(self, action: str) -> dict[str, Any]:
        self._record("rollout", action=action)
        return {"ended": True, "action": action}

    async def save(self, path: str) -> SaveAnswer:
        self._record("save", path=path)
        if self.validate:
            errors, _ = self.validate(self.layout_toml, path)
            if errors:
                raise DaemonError("refusing to save an invalid layout: " + "; ".join(errors))
        from vsup.layout.model import loads_layout
        from vsup.layout.store import layout_text

        # the daemon's writer: the file's comments and formatting kept where it can
        target = Path(path)
        saved = layout_text(loads_layout(self.layout_toml), target, keep_from=self.layout_toml)
        write_atomic(target, saved.text)
        return SaveAnswer(path=str(target), kept_format=saved.kept, format_lost=saved.lost)


def layout_validation(node_gpus: int | None) -> Callable[[str, str], tuple[list[str], list[str]]]:
    """The daemon's check of a layout it is asked to apply or save: the layout package's
    rules (the same as `vsup validate`), against a node with `node_gpus` GPUs."""
    from vsup.tui.validation import layout_rules

    def check(toml_text: str, path: str) -> tuple[list[str], list[str]]:
        verdict = layout_rules(toml_text, path, node_gpus)
        return verdict.errors, verdict.warnings

    return check


def _instances(toml_text: str) -> Mapping[str, dict[str, Any]]:
    if not toml_text.strip():
        return {}
    doc = tomllib.loads(toml_text)
    return {i.get("name"): i for i in doc.get("instance", [])}


def _plan(old_toml: str, new_toml: str) -> dict[str, list[str]]:
    """The apply plan by instance table: what starts, restarts, stops or stays."""
    old, new = _instances(old_toml), _instances(new_toml)
    old_doc = tomllib.loads(old_toml) if old_toml.strip() else {}
    new_doc = tomllib.loads(new_toml) if new_toml.strip() else {}
    shared_changed = {k: v for k, v in old_doc.items() if k != "instance"} != {
        k: v for k, v in new_doc.items() if k != "instance"
    }
    plan: dict[str, list[str]] = {"start": [], "restart": [], "stop": [], "unchanged": []}
    for name, table in new.items():
        if name not in old:
            plan["start"].append(name)
        elif table != old[name] or shared_changed:
            plan["restart"].append(name)
        else:
            plan["unchanged"].append(name)
    plan["stop"] = [n for n in old if n not in new]
    return plan
