"""The control API's answers as types: what `Client` and `AsyncClient` return for each route
but status (a `StatusSnapshot`, snapshot.py) and the journal (`events`: an `EventPage` of
vsup.journalevents).

One frozen dataclass per answer, read from the route's JSON with `from_json`: keys a newer
daemon adds are ignored, a key the answer needs and the daemon did not send is `BadAnswer`,
naming the route and the key. The wire does not change: control/api.py and the daemon's
service (control/service.py) still shape the JSON; these types are the clients' reading of it.
A leaf module (stdlib and the snapshot): the CLI, the dashboard and the bench import it
without the control package.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import types
import typing
from dataclasses import dataclass, field
from typing import Any

from vsup.snapshot import BenchStatus, StatusSnapshot

_T = typing.TypeVar("_T")


class BadAnswer(ValueError):
    """A daemon's answer that is not the shape its route promises (a key missing, a value of
    another type): which route, and which key."""


def decode(cls: type[_T], doc: Any, route: str) -> _T:
    """`cls` from the JSON object `doc` that `route` answered (e.g. `POST /v1/apply`)."""
    try:
        value: _T = _decoder(typing.cast(Any, cls))(doc, "")
    except BadAnswer as exc:
        raise BadAnswer(f"the daemon's answer to {route} {exc}") from None
    return value


# -- the daemon and its layout


@dataclass(frozen=True)
class Ping:
    """`GET /v1/ping`: which daemon answers (`vsup daemon` prints it as JSON)."""

    pid: int
    version: str
    home: str

    @classmethod
    def from_json(cls, doc: Any) -> Ping:
        return decode(cls, doc, "GET /v1/ping")

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = to_json(self)
        return doc


@dataclass(frozen=True)
class LayoutAnswer:
    """`GET /v1/layout`: the running layout's file, text and name (None before any apply)."""

    path: str | None
    toml: str | None
    name: str | None

    @classmethod
    def from_json(cls, doc: Any) -> LayoutAnswer:
        return decode(cls, doc, "GET /v1/layout")


@dataclass(frozen=True)
class Problem:
    """One diagnostic of an apply (`vsup.diagnostics.Diagnostic.to_json`): `text` is its one
    line, `FILE:LINE: error: instance 'x': key 'port': message`."""

    message: str = ""
    severity: str = "error"
    text: str | None = None
    file: str | None = None
    line: int | None = None
    instance: str | None = None
    key: str | None = None
    table: str | None = None
    others: tuple[str, ...] = ()

    def __str__(self) -> str:
        return self.text or self.message


@dataclass(frozen=True)
class SpecChange:
    """One key of an instance's spec that an apply changes (layout/changes.py), old -> new
    (secrets masked by the daemon)."""

    key: str
    old: Any = None
    new: Any = None


@dataclass(frozen=True)
class PullTarget:
    """A hub model an apply pulls before its instances start (pull/targets.py, docs/pull.md)."""

    model: str
    revision: str | None = None
    cache_dir: str | None = None
    load_format: str | None = None
    token_env: str | None = None
    instances: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """`org/model`, with `@revision` when it is not `main`."""
        return self.model + (f"@{self.revision}" if self.revision not in (None, "main") else "")


@dataclass(frozen=True)
class ApplyPlan:
    """What an apply does (or did), by instance name in layout order (engine's `ApplyPlan`):
    `rolling` is the part of `restart` that restarts in waves; `router` the router's action
    (start|restart|update|stop|unchanged, None without one); `changes` per instance the keys
    that change; `pull` the models pulled first."""

    start: tuple[str, ...] = ()
    restart: tuple[str, ...] = ()
    stop: tuple[str, ...] = ()
    unchanged: tuple[str, ...] = ()
    update: tuple[str, ...] = ()
    rolling: tuple[str, ...] = ()
    router: str | None = None
    changes: dict[str, tuple[SpecChange, ...]] = field(default_factory=dict)
    pull: tuple[PullTarget, ...] = ()

    @property
    def empty(self) -> bool:
        """No instance at all (not even unchanged ones)."""
        return not (self.start or self.restart or self.stop or self.update or self.unchanged)

    def to_json(self) -> dict[str, Any]:
        """The plan's JSON, as the daemon sent it (the keys this client knows)."""
        doc: dict[str, Any] = to_json(self)
        return doc


@dataclass(frozen=True)
class ApplyAnswer:
    """`POST /v1/apply`: the plan (None when the layout was refused), its errors and warnings,
    and whether it was applied (False for a dry run)."""

    plan: ApplyPlan | None
    errors: tuple[Problem, ...]
    warnings: tuple[Problem, ...] = ()
    applied: bool = False

    @classmethod
    def from_json(cls, doc: Any) -> ApplyAnswer:
        return decode(cls, doc, "POST /v1/apply")


# -- actions


@dataclass(frozen=True)
class ActionError:
    """An instance an action failed on, and why."""

    error: str
    name: str | None = None

    def __str__(self) -> str:
        return f"{self.name}: {self.error}" if self.name else self.error


@dataclass(frozen=True)
class SleepResult:
    """What a sleep, a wake or a swap did (engine/sleep.py). A sleep or wake: `instance`,
    `took_s`, `level`/`held_bytes` (sleep), `already` (nothing to do), `cold` (a wake that
    started it), `group_slept` (a wake whose swap-group member slept first); a swap: `slept`,
    `woke` and `took_s`."""

    instance: str | None = None
    took_s: float | None = None
    level: int | None = None
    held_bytes: int | None = None
    already: bool = False
    cold: bool = False
    group_slept: tuple[SleepResult, ...] = ()
    slept: SleepResult | None = None
    woke: SleepResult | None = None
    # seconds per step (engine/sleep.py, journalevents.PHASE_NAMES); None from an older daemon
    phases: dict[str, float] | None = None


@dataclass(frozen=True)
class ActionAnswer:
    """`POST /v1/actions`: the instances done, those not waited for (`pending`), the failures;
    a sleep, wake or swap done carries its `result`."""

    done: tuple[str, ...]
    errors: tuple[ActionError, ...]
    pending: tuple[str, ...] = ()
    result: SleepResult | None = None

    @classmethod
    def from_json(cls, doc: Any) -> ActionAnswer:
        return decode(cls, doc, "POST /v1/actions")


# -- an instance's log, config and history


@dataclass(frozen=True)
class LogChunk:
    """A part of a run's log (`GET /v1/instances/{name}/logs`, `/v1/router/logs`): `offset` is
    where the next read starts, `eof` whether it reached the end, `start`/`size` where this
    part starts and how long the file is."""

    run: int | None
    path: str
    offset: int
    text: str
    eof: bool
    start: int | None = None
    size: int | None = None

    @classmethod
    def from_json(cls, doc: Any) -> LogChunk:
        return decode(cls, doc, "GET logs")


@dataclass(frozen=True)
class InstanceConfig:
    """`GET /v1/instances/{name}/config`: the argv, the environment (secrets masked), the cache
    config vLLM reported (None until it does) and the spec as the layout has it."""

    argv: tuple[str, ...]
    env: dict[str, str]
    cache_config: dict[str, Any] | None = None
    spec: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, doc: Any) -> InstanceConfig:
        return decode(cls, doc, "GET config")


@dataclass(frozen=True)
class History:
    """`GET /v1/instances/{name}/history`: the last minutes of the telemetry the dashboard
    draws, one value per poll (None where it was not known)."""

    t: tuple[float, ...] = ()
    kv_cache_usage: tuple[float | None, ...] = ()
    generation_tokens_per_s: tuple[float | None, ...] = ()
    preemptions_per_min: tuple[float | None, ...] = ()

    @classmethod
    def from_json(cls, doc: Any) -> History:
        return decode(cls, doc, "GET history")


# -- save, shutdown, bench progress


@dataclass(frozen=True)
class SaveAnswer:
    """`POST /v1/save`: the path asked for, the file written (a symlink's target), the
    instances still on an older spec, and whether the file's comments were kept."""

    path: str
    written: str | None = None
    outdated: tuple[str, ...] = ()
    kept_format: bool = False
    format_lost: str | None = None  # what of the comments could not be kept, in words

    @classmethod
    def from_json(cls, doc: Any) -> SaveAnswer:
        return decode(cls, doc, "POST /v1/save")


@dataclass(frozen=True)
class ShutdownAnswer:
    """`POST /v1/shutdown`: the instances being stopped; `already` when a shutdown was under
    way."""

    stopping: tuple[str, ...]
    already: bool = False

    @classmethod
    def from_json(cls, doc: Any) -> ShutdownAnswer:
        return decode(cls, doc, "POST /v1/shutdown")


@dataclass(frozen=True)
class BenchProgressAnswer:
    """`POST /v1/bench/progress`: the bench as the daemon now shows it."""

    bench: BenchStatus | None

    @classmethod
    def from_json(cls, doc: Any) -> BenchProgressAnswer:
        return decode(cls, doc, "POST /v1/bench/progress")


def status_from_json(doc: Any) -> StatusSnapshot:
    """`GET /v1/status`: the snapshot (snapshot.py's decoder), BadAnswer when it is not one."""
    try:
        return StatusSnapshot.from_json(doc)
    except ValueError as exc:
        raise BadAnswer(f"the daemon's answer to GET /v1/status: {exc}") from None


def to_json(value: Any) -> Any:
    """An answer (or part of one) as JSON data: objects in field order, tuples as lists."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple | list):
        return [to_json(v) for v in value]
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    return value


# -- the decoder: one function per type, made once


def _at(where: str, key: str | int) -> str:
    return f"{where}[{key}]" if isinstance(key, int) else (f"{where}.{key}" if where else key)


def _type_error(where: str, want: str, value: Any) -> BadAnswer:
    place = f"'{where}'" if where else "the answer"
    return BadAnswer(f"has {place} as {type(value).__name__}, not {want}")


@functools.cache
def _decoder(hint: Any) -> Any:
    """A function `(value, where) -> typed value` for the type `hint`."""
    origin = typing.get_origin(hint)
    if origin is typing.Union or origin is types.UnionType:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        inner = _decoder(args[0]) if len(args) == 1 else _any
        return lambda v, w: None if v is None else inner(v, w)
    if origin is tuple:
        item = _decoder(typing.get_args(hint)[0])

        def tuple_of(v: Any, w: str) -> tuple[Any, ...]:
            if v is None:
                return ()
            if not isinstance(v, list | tuple):
                raise _type_error(w, "a list", v)
            return tuple(item(x, _at(w, i)) for i, x in enumerate(v))

        return tuple_of
    if origin is dict:
        value_hint = typing.get_args(hint)[1]
        val = _decoder(value_hint)

        def dict_of(v: Any, w: str) -> dict[str, Any]:
            if not isinstance(v, dict):
                raise _type_error(w, "an object", v)
            return {str(k): val(x, _at(w, str(k))) for k, x in v.items()}

        return dict_of
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if hint is BenchStatus:
            return _bench
        return _dataclass_decoder(hint)
    if hint in (str, int, float, bool):
        return _scalar(hint)
    return _any


def _any(v: Any, w: str) -> Any:
    return v


def _scalar(kind: type) -> Any:
    want = {str: "a string", int: "an integer", float: "a number", bool: "true or false"}[kind]

    def scalar(v: Any, w: str) -> Any:
        ok = isinstance(v, kind) and not (isinstance(v, bool) and kind is not bool)
        if kind is float and isinstance(v, int) and not isinstance(v, bool):
            ok = True
        if not ok:
            raise _type_error(w, want, v)
        return v

    return scalar


def _bench(v: Any, w: str) -> BenchStatus:
    if not isinstance(v, dict):
        raise _type_error(w, "an object", v)
    try:
        return StatusSnapshot.decode_part(BenchStatus, v)
    except (KeyError, TypeError, ValueError) as exc:
        raise BadAnswer(f"has no bench report in '{w}': {exc}") from None


def _dataclass_decoder(cls: type) -> Any:
    # the fields' decoders are made at the first decode: a type may hold itself (SleepResult)
    parts: list[tuple[str, bool, Any]] = []

    def decode_object(v: Any, w: str) -> Any:
        if not parts:
            hints = typing.get_type_hints(cls, vars(sys.modules[cls.__module__]))
            parts[:] = [
                (f.name, _required(f), _decoder(hints[f.name])) for f in dataclasses.fields(cls)
            ]
        if not isinstance(v, dict):
            raise _type_error(w, "an object", v)
        values = {}
        for name, required, dec in parts:
            if name in v:
                values[name] = dec(v[name], _at(w, name))
            elif required:
                raise BadAnswer(f"lacks the key '{_at(w, name)}'")
        return cls(**values)

    return decode_object


def _required(f: dataclasses.Field[Any]) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
