"""The journal's events, one frozen dataclass per kind (`journal.jsonl`, GET /v1/events).

Each type knows its `kind` and its fields; `to_json()` is the journal's JSON object (a line of
`journal.jsonl`, an item of `/v1/events`): the envelope `seq`, `t`, `kind`, `instance` (or
`router`: the router's events carry its port), then the kind's fields in their order. A field
with a default (`None`) is left out while it is None, as the emit sites always did; one without
a default is always written (a `null` there means "unknown", e.g. a `drain` whose running
requests could not be read).

`decode(doc)` reads one back: a field the line lacks is None, a key this vsup does not know
is kept in `extra` (written back by `to_json`), and a kind it does not know (a newer daemon's)
becomes an `UnknownEvent` that still says itself with its fields. Nothing is validated: an
edited or foreign journal never makes a reader fail.

`describe(urls)` is what `vsup events`, `vsup fleet events` and the dashboard print: the
event in words, made safe for a terminal (termtext.printable), or None for an event other
events already say (a `state` change, the engine's echo of an operator's action).

A leaf module: the engine emits these, the control daemon journals them, the CLI and the TUI
read them.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self, TypeVar

from vsup import pullview
from vsup.states import ExitReason, RolloutState
from vsup.termtext import printable

ENVELOPE = ("seq", "t", "kind", "instance", "router")
Urls = Mapping[str, str]  # router worker URL -> instance name (router events hold URLs)


@dataclass(frozen=True, kw_only=True)
class JournalEvent:
    """What every event has: whose it is, when, its place in the journal, unknown keys."""

    KIND: ClassVar[str] = ""
    instance: str | None = None
    router: Any = None  # the router's port on the router's events
    seq: int | None = None  # stamped by the journal
    t: str | None = None  # ISO 8601 UTC, stamped by the journal
    extra: Mapping[str, Any] = field(default_factory=dict, compare=True)
    # fields the line read lacked: written back as absent, not as null (`decode` sets it)
    absent: frozenset[str] = field(default=frozenset(), compare=False, repr=False)

    @property
    def kind(self) -> str:
        return self.KIND

    def fields(self) -> dict[str, Any]:
        """The kind's own fields as the journal writes them (no envelope)."""
        out: dict[str, Any] = {}
        for f in own_fields(type(self)):
            value = getattr(self, f.name)
            if value is None and (not _required(f) or f.name in self.absent):
                continue
            out[f.metadata.get("key", f.name)] = value
        for key, value in self.extra.items():
            if key not in ENVELOPE:
                out.setdefault(key, value)
        return out

    def to_json(self) -> dict[str, Any]:
        """The journal's JSON object, key for key as the journal has always written it."""
        out: dict[str, Any] = {}
        for key in ENVELOPE:
            value = self.kind if key == "kind" else getattr(self, key)
            if value is not None:
                out[key] = value
            elif key in self.extra:  # a garbled envelope value, kept as it came
                out[key] = self.extra[key]
        return out | self.fields()

    @classmethod
    def of(cls, fields: Mapping[str, Any]) -> Self:
        """The event of this kind with these JSON fields (`Rollout.to_json()`, say): a key it
        does not declare is kept in `extra`."""
        event = decode({**fields, "kind": cls.KIND})
        assert isinstance(event, cls), cls
        return event

    def describe(self, urls: Urls | None = None) -> str | None:
        """The event in words, safe for a terminal; None when it is left out of the text."""
        words = self.words(urls or {})
        return None if words is None else printable(words)

    def words(self, urls: Urls) -> str | None:
        """The words before they are made terminal-safe; each kind says itself."""
        keys = {
            k: v for k, v in self.to_json().items() if k not in ("seq", "t", "kind", "instance")
        }
        keys.pop("router", None)
        return f"{self.kind}" + (f" {json.dumps(keys, default=str)[:200]}" if keys else "")


def own_fields(cls: type[JournalEvent]) -> tuple[dataclasses.Field[Any], ...]:
    base = {f.name for f in dataclasses.fields(JournalEvent)}
    return tuple(f for f in dataclasses.fields(cls) if f.name not in base)


def _required(f: dataclasses.Field[Any]) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


@dataclass(frozen=True, kw_only=True)
class UnknownEvent(JournalEvent):
    """A kind this vsup does not know (a newer daemon's): said with its fields."""

    unknown_kind: Any = None

    @property
    def kind(self) -> str:
        return str(self.unknown_kind)

    def to_json(self) -> dict[str, Any]:
        out = super().to_json()
        if self.unknown_kind is None:
            del out["kind"]  # a line without a kind stays without one
        else:
            out["kind"] = self.unknown_kind
        return out

    def fields(self) -> dict[str, Any]:
        return {k: v for k, v in self.extra.items() if k not in ENVELOPE}


KINDS: dict[str, type[JournalEvent]] = {}


_T = TypeVar("_T", bound=type[JournalEvent])


def _kind(cls: _T) -> _T:
    KINDS[cls.KIND] = cls
    return cls


def decode(doc: Mapping[str, Any]) -> JournalEvent:
    """A journal line's object as its type (see the module's doc: never raises)."""
    kind = doc.get("kind")
    cls = KINDS.get(kind) if isinstance(kind, str) else None
    instance = doc.get("instance")
    seq, t = doc.get("seq"), doc.get("t")
    env: dict[str, Any] = {
        "instance": instance if isinstance(instance, str) else None,
        "router": doc.get("router"),
        "seq": seq if isinstance(seq, int) and not isinstance(seq, bool) else None,
        "t": t if isinstance(t, str) else None,
    }
    known = {"kind", "router"} | {k for k in ("instance", "seq", "t") if env[k] is not None}
    if cls is None:
        extra = {k: v for k, v in doc.items() if k not in known}
        return UnknownEvent(unknown_kind=kind, extra=extra, **env)
    kwargs: dict[str, Any] = {}
    absent = set()
    for f in own_fields(cls):
        key = f.metadata.get("key", f.name)
        known.add(key)
        if key in doc:
            kwargs[f.name] = doc[key]
        elif _required(f):
            kwargs[f.name] = None
            absent.add(f.name)
    extra = {k: v for k, v in doc.items() if k not in known}
    return cls(**env, **kwargs, extra=extra, absent=frozenset(absent))


def as_event(event: JournalEvent | Mapping[str, Any]) -> JournalEvent:
    return event if isinstance(event, JournalEvent) else decode(event)


# -- words helpers ---------------------------------------------------------------------------


def seconds(value: Any) -> str:
    try:
        return f"{float(value):.1f} s"
    except (TypeError, ValueError):
        return "? s"


def _last_line(text: Any, limit: int = 160) -> str:
    if not isinstance(text, str) or not text.strip():
        return ""
    return text.strip().splitlines()[-1].strip()[:limit]


def _run(run: Any) -> str:
    """`run 3`; empty when the event has no run (a start refused before any process)."""
    return f"run {run}" if run is not None else ""


def _minute(t: Any) -> str:
    """An ISO 8601 UTC time to the minute (`2026-12-05T14:02:03.123Z` -> `2026-12-05 14:02`);
    anything else as it is."""
    text = str(t)
    if len(text) >= 16 and text[10] == "T" and text[13] == ":":
        return f"{text[:10]} {text[11:16]}"
    return text


def _plan_words(plan: Any) -> str:
    if not isinstance(plan, dict):
        return ""
    parts = [
        f"{what} {', '.join(plan[what])}"
        for what in ("start", "restart", "stop", "update")
        if plan.get(what)
    ]
    if plan.get("router") not in (None, "unchanged"):
        parts.append(f"router {plan['router']}")
    return "; ".join(parts) or "nothing to change"


def _joined(items: Any) -> str:
    return ", ".join(str(x) for x in items or ())


def work_words(
    evidence: str | None,
    running: float | None,
    waiting: float | None,
    in_flight: float | None,
    ranks: tuple[int, ...] = (),
) -> str:
    """The work a stalled server made no progress on, from the figures themselves (a `stalled`
    event carries them): with evidence `server` the engine's gauges read 0 (frozen at its last
    stats) and the work is what the API server holds, so that is what is said."""
    if evidence == "server":
        n = int(in_flight or 0)
        shown = int((running or 0) + (waiting or 0))
        work = f"{n} request{'s' if n != 1 else ''} in flight at the API server and "
        work += f"{shown} of them at the engines" if shown else "none at the engine"
    elif evidence == "canary":
        work = "a canary request (max_tokens 1) unanswered"
    else:
        work = f"{int(running or 0)} running, {int(waiting or 0)} waiting"
    if ranks:
        which = ", ".join(str(r) for r in ranks)
        work = f"data-parallel rank{'s' if len(ranks) > 1 else ''} {which}: {work}"
    return work


# -- the daemon ------------------------------------------------------------------------------


@_kind
@dataclass(frozen=True, kw_only=True)
class DaemonStartEvent(JournalEvent):
    KIND: ClassVar[str] = "daemon_start"
    pid: int | None
    version: str | None

    def words(self, urls: Urls) -> str:
        return f"vsup daemon started (pid {self.pid}, version {self.version})"


@_kind
@dataclass(frozen=True, kw_only=True)
class DaemonStopEvent(JournalEvent):
    KIND: ClassVar[str] = "daemon_stop"
    pid: int | None
    left_running: list[str] | None

    def words(self, urls: Urls) -> str:
        left = self.left_running or []
        running = f"; left running: {', '.join(left)}" if left else ""
        return f"vsup daemon stopped (pid {self.pid}){running}"


@_kind
@dataclass(frozen=True, kw_only=True)
class SocketReboundEvent(JournalEvent):
    KIND: ClassVar[str] = "socket_rebound"
    path: str | None
    was: str | None

    def words(self, urls: Urls) -> str:
        return f"control socket bound again ({self.was or 'it was gone'})"


@_kind
@dataclass(frozen=True, kw_only=True)
class ProblemEvent(JournalEvent):
    KIND: ClassVar[str] = "problem"
    problem: str | None
    message: str | None

    def words(self, urls: Urls) -> str:
        return f"problem ({self.problem}): {self.message}"


@_kind
@dataclass(frozen=True, kw_only=True)
class ErrorEvent(JournalEvent):
    KIND: ClassVar[str] = "error"
    message: str | None

    def words(self, urls: Urls) -> str:
        return f"vsup error: {self.message}"


# -- an instance's life ----------------------------------------------------------------------


@_kind
@dataclass(frozen=True, kw_only=True)
class StateEvent(JournalEvent):
    """A state change: other events of the same moment say it, so it has no words."""

    KIND: ClassVar[str] = "state"
    from_: str | None = field(metadata={"key": "from"})
    to: str | None

    def words(self, urls: Urls) -> None:
        return None


@_kind
@dataclass(frozen=True, kw_only=True)
class SpawnEvent(JournalEvent):
    KIND: ClassVar[str] = "spawn"
    run: int | None
    pid: int | None
    pgid: int | None = None
    create_time: float | None = None
    log: str | None = None
    # added by the daemon: what journal replay needs to adopt it if the state file is lost
    port: int | None = None
    restarts: int | None = None
    spec: dict[str, Any] | None = None

    def words(self, urls: Urls) -> str:
        return f"started run {self.run} (pid {self.pid})"


@_kind
@dataclass(frozen=True, kw_only=True)
class ReadyEvent(JournalEvent):
    KIND: ClassVar[str] = "ready"
    run: int | None
    pid: int | None
    startup_s: float | None

    def words(self, urls: Urls) -> str:
        return f"ready after {seconds(self.startup_s)} (run {self.run}, pid {self.pid})"


@_kind
@dataclass(frozen=True, kw_only=True)
class UnhealthyEvent(JournalEvent):
    KIND: ClassVar[str] = "unhealthy"
    run: int | None
    pid: int | None
    failures: int | None
    status: int | None
    error: str | None
    rank: int | None = None

    def words(self, urls: Urls) -> str:
        status = f"HTTP {self.status}" if self.status is not None else "no answer"
        err = f", {self.error}" if self.error else ""
        rank = f", data-parallel rank {self.rank} died" if self.rank is not None else ""
        return f"unhealthy: /health failed {self.failures} time(s) ({status}{err}{rank})"


@_kind
@dataclass(frozen=True, kw_only=True)
class ExitEvent(JournalEvent):
    KIND: ClassVar[str] = "exit"
    run: int | None
    pid: int | None
    code: int | None
    signal: str | None
    reason: str | None
    log_excerpt: str | None
    rank: int | None = None
    restarts: int | None = None
    at: str | None = None

    def how_exited(self) -> str:
        if self.signal:
            return f"killed by {self.signal}"
        if self.code is not None:
            return f"exit code {self.code}"
        if self.pid is None:
            return "no process was started"
        return "status unknown (not vsup's child)"

    def words(self, urls: Urls) -> str:
        reason = self.reason or "unknown"
        if reason == ExitReason.STOPPED:
            return f"stopped ({', '.join(x for x in (_run(self.run), self.how_exited()) if x)})"
        how = ", ".join(x for x in (self.how_exited(), _run(self.run)) if x)
        said = _last_line(self.log_excerpt)
        rank = f", data-parallel rank {self.rank} died first" if self.rank is not None else ""
        return f"exited: {reason} ({how}{rank})" + (f": {said}" if said else "")


@_kind
@dataclass(frozen=True, kw_only=True)
class RankExitEvent(JournalEvent):
    KIND: ClassVar[str] = "rank_exit"
    run: int | None
    rank: int | None
    pid: int | None
    message: str | None

    def words(self, urls: Urls) -> str:
        return f"data-parallel rank {self.rank} (pid {self.pid}) ended: {self.message}"


@_kind
@dataclass(frozen=True, kw_only=True)
class RestartScheduledEvent(JournalEvent):
    KIND: ClassVar[str] = "restart_scheduled"
    delay_s: float | None
    failures: int | None
    reason: str | None
    why: str | None = None
    restarts: int | None = None

    def words(self, urls: Urls) -> str:
        delay = float(self.delay_s or 0)
        when = "at once" if delay <= 0 else f"in {delay:.0f} s"
        why = f"; {self.why}" if self.why else ""
        return f"restart {when} after {self.reason} (failure {self.failures}){why}"


@_kind
@dataclass(frozen=True, kw_only=True)
class FailedEvent(JournalEvent):
    KIND: ClassVar[str] = "failed"
    reason: str | None
    failures: int | None
    why: str | None

    def words(self, urls: Urls) -> str:
        return f"FAILED ({self.reason}, {self.failures} failure(s)): {self.why}"


@dataclass(frozen=True, kw_only=True)
class _WaitEvent(JournalEvent):
    """A start that waits (`done` false, with why) and then goes on (`done` true)."""

    done: bool | None
    message: str | None = None
    waited_s: float | None = None


@_kind
@dataclass(frozen=True, kw_only=True)
class MemoryWaitEvent(_WaitEvent):
    KIND: ClassVar[str] = "memory_wait"

    def words(self, urls: Urls) -> str:
        if self.done:
            return f"GPU memory free after waiting {seconds(self.waited_s)}"
        return f"waits for GPU memory: {self.message}"


@_kind
@dataclass(frozen=True, kw_only=True)
class GroupWaitEvent(_WaitEvent):
    KIND: ClassVar[str] = "group_wait"

    def words(self, urls: Urls) -> str:
        if self.done:
            return f"its swap group let it start after {seconds(self.waited_s)}"
        return f"start waits for its swap group: {self.message}"


@_kind
@dataclass(frozen=True, kw_only=True)
class DrainEvent(JournalEvent):
    KIND: ClassVar[str] = "drain"
    drained: bool | None  # None: the running requests could not be read
    waited_s: float | None
    requests: float | None
    why: str | None = None

    def words(self, urls: Urls) -> str:
        if self.drained is True:
            first = self.requests
            had = f" ({int(first)} in flight at its start)" if first else ""
            return f"drained in {seconds(self.waited_s)}{had}"
        if self.drained is False:
            return f"drain timed out after {seconds(self.waited_s)} with requests still running"
        return f"drain: running requests unknown after {seconds(self.waited_s)}"


@_kind
@dataclass(frozen=True, kw_only=True)
class StopEvent(JournalEvent):
    KIND: ClassVar[str] = "stop"
    run: int | None
    pid: int | None
    term: bool | None
    kill: bool | None
    waited_s: float | None

    def words(self, urls: Urls) -> str | None:
        if self.kill:
            return (
                f"stop: SIGKILL after the grace ({seconds(self.waited_s)} in all): it did not "
                "end on SIGTERM"
            )
        return None  # the exit event says it stopped


@_kind
@dataclass(frozen=True, kw_only=True)
class SweepEvent(JournalEvent):
    KIND: ClassVar[str] = "sweep"
    run: int | None
    pids: list[int] | None
    kill: bool | None
    waited_s: float | None

    def words(self, urls: Urls) -> str:
        how = " with SIGKILL" if self.kill else ""
        return f"ended what was left of run {self.run}{how}: pids {_joined(self.pids)}"


@_kind
@dataclass(frozen=True, kw_only=True)
class GpuReleaseEvent(JournalEvent):
    KIND: ClassVar[str] = "gpu_release"
    run: int | None
    gpus: list[int] | None
    released: bool | None  # None: it could not be read
    waited_s: float | None

    def words(self, urls: Urls) -> str:
        gpus = ",".join(str(g) for g in self.gpus or ())
        released = self.released
        state = (
            "released" if released is True else "NOT released" if released is False else "unknown"
        )
        return f"GPU {gpus} memory {state} after {seconds(self.waited_s)}"


@_kind
@dataclass(frozen=True, kw_only=True)
class StopIncompleteEvent(JournalEvent):
    KIND: ClassVar[str] = "stop_incomplete"
    run: int | None
    pids: list[int] | None
    message: str | None
    resume: bool | None = None

    def words(self, urls: Urls) -> str:
        return f"processes outlived SIGKILL: {self.message}"


@_kind
@dataclass(frozen=True, kw_only=True)
class StuckGoneEvent(JournalEvent):
    KIND: ClassVar[str] = "stuck_gone"
    run: int | None
    pids: list[int] | None

    def words(self, urls: Urls) -> str:
        return "the processes that outlived SIGKILL are gone"


@_kind
@dataclass(frozen=True, kw_only=True)
class RemovedEvent(JournalEvent):
    KIND: ClassVar[str] = "removed"

    def words(self, urls: Urls) -> str:
        return "removed from the layout"


@_kind
@dataclass(frozen=True, kw_only=True)
class AdoptEvent(JournalEvent):
    KIND: ClassVar[str] = "adopt"
    adopted: bool | None
    pid: int | None
    pgid: int | None = None
    run: int | None
    why: str | None = None
    # what journal replay may find on an adopt (as on a spawn)
    create_time: float | None = None
    port: int | None = None
    restarts: int | None = None
    spec: dict[str, Any] | None = None

    def words(self, urls: Urls) -> str:
        if self.adopted:
            return f"re-adopted run {self.run} (pid {self.pid}) from the last daemon"
        return f"not re-adopted (run {self.run}): {self.why}"


# -- stalls ----------------------------------------------------------------------------------


@_kind
@dataclass(frozen=True, kw_only=True)
class StalledEvent(JournalEvent):
    KIND: ClassVar[str] = "stalled"
    run: int | None
    requests_running: float | None
    requests_waiting: float | None
    requests_in_flight: float | None
    evidence: str | None
    ranks: list[int] | None
    stalled_since: str | float | None
    stalled_for_s: float | None
    stall_after_s: float | None
    on_stall: bool | None

    def words(self, urls: Urls) -> str:
        work = work_words(
            self.evidence,
            self.requests_running,
            self.requests_waiting,
            self.requests_in_flight,
            tuple(self.ranks) if isinstance(self.ranks, list) else (),
        )
        return f"STALLED: {work}, no token for {seconds(self.stalled_for_s)}" + (
            "; restart.on_stall restarts it" if self.on_stall else ""
        )


@_kind
@dataclass(frozen=True, kw_only=True)
class StallClearedEvent(JournalEvent):
    KIND: ClassVar[str] = "stall_cleared"
    run: int | None
    lasted_s: float | None
    state: str | None
    why: str | None

    def words(self, urls: Urls) -> str:
        return f"no longer stalled ({self.why or 'progress'})"


@_kind
@dataclass(frozen=True, kw_only=True)
class StallRestartEvent(JournalEvent):
    KIND: ClassVar[str] = "stall_restart"
    run: int | None
    pid: int | None
    why: str | None
    rank: int | None = None

    def words(self, urls: Urls) -> str:
        return f"restarting a stalled engine: {self.why}"


# -- sleep mode ------------------------------------------------------------------------------


@_kind
@dataclass(frozen=True, kw_only=True)
class SleepEvent(JournalEvent):
    KIND: ClassVar[str] = "sleep"
    level: int | None
    why: str | None
    took_s: float | None
    held_before: int | None
    held_after: int | None
    error: str | None
    # seconds per step (engine/sleep.py): leave_router_s, drain_s, sleep_call_s,
    # release_seen_s; a wake's wake_call_s, first_answer_s, rejoin_s; a swap's both
    phases: dict[str, float] | None = None

    def words(self, urls: Urls) -> str:
        held = self.held_after
        kept = f", {held / 2**30:.1f} GiB still held" if isinstance(held, int) else ""
        trouble = f"; {self.error}" if self.error else ""
        head = f"asleep (level {self.level}) in {seconds(self.took_s)}{kept}"
        return f"{head}: {self.why}{trouble}"


@_kind
@dataclass(frozen=True, kw_only=True)
class WakeEvent(JournalEvent):
    KIND: ClassVar[str] = "wake"
    why: str | None
    took_s: float | None
    cold: bool | None = None  # a cold start: it was not running
    level: int | None
    in_router: bool | None = None
    phases: dict[str, float] | None = None

    def words(self, urls: Urls) -> str:
        cold = " (cold start: it was not running)" if self.cold else ""
        return f"awake in {seconds(self.took_s)}{cold}: {self.why}"


@_kind
@dataclass(frozen=True, kw_only=True)
class SleepFailedEvent(JournalEvent):
    KIND: ClassVar[str] = "sleep_failed"
    level: int | None
    why: str | None
    error: str | None

    def words(self, urls: Urls) -> str:
        return f"sleep FAILED ({self.why}): {self.error}"


@_kind
@dataclass(frozen=True, kw_only=True)
class WakeFailedEvent(JournalEvent):
    KIND: ClassVar[str] = "wake_failed"
    why: str | None
    error: str | None

    def words(self, urls: Urls) -> str:
        return f"wake FAILED ({self.why}): {self.error}"


@_kind
@dataclass(frozen=True, kw_only=True)
class SwapEvent(JournalEvent):
    KIND: ClassVar[str] = "swap"
    slept: str | None
    took_s: float | None
    phases: dict[str, float] | None = None

    def words(self, urls: Urls) -> str:
        steps = phase_words(self.phases)
        return f"swapped in for {self.slept} in {seconds(self.took_s)}" + (
            f" ({steps})" if steps else ""
        )


# the steps of a sleep, a wake and a swap as `vsup swap` and `vsup events` say them
PHASE_NAMES = {
    "leave_router_s": "leave router",
    "drain_s": "drain",
    "sleep_call_s": "/sleep",
    "release_seen_s": "release seen",
    "wake_call_s": "/wake_up",
    "first_answer_s": "first answer",
    "rejoin_s": "rejoin router",
}


def phase_words(phases: Mapping[str, Any] | None) -> str:
    """`leave router 0.00 s, drain 0.00 s, /sleep 0.42 s, ...` (empty: no phases)."""
    if not isinstance(phases, Mapping):
        return ""
    out = []
    for key, value in phases.items():
        if isinstance(value, int | float):
            out.append(f"{PHASE_NAMES.get(key, str(key))} {value:.2f} s")
    return ", ".join(out)


# -- the router ------------------------------------------------------------------------------


@_kind
@dataclass(frozen=True, kw_only=True)
class RouterWorkersEvent(JournalEvent):
    KIND: ClassVar[str] = "router_workers"
    add: list[str] | None
    remove: list[str] | None
    why: str | None = None

    def words(self, urls: Urls) -> str:
        parts = []
        if self.add:
            parts.append("added " + ", ".join(urls.get(u, u) for u in self.add))
        if self.remove:
            parts.append("removed " + ", ".join(urls.get(u, u) for u in self.remove))
        why = f" ({self.why})" if self.why else ""
        return "workers: " + ("; ".join(parts) or "unchanged") + why


@_kind
@dataclass(frozen=True, kw_only=True)
class HoldWakeEvent(JournalEvent):
    """Wake on request: requests for a model none of whose instances is awake are held while
    vsup wakes `woke` (router/holder.py)."""

    KIND: ClassVar[str] = "hold_wake"
    model: str | None
    woke: str | None
    held: int | None

    def words(self, urls: Urls) -> str:
        return f"{self.held} request(s) for {self.model} held: waking {self.woke}"


@_kind
@dataclass(frozen=True, kw_only=True)
class HoldEndEvent(JournalEvent):
    """A wake on request ended: what became of the requests held for it."""

    KIND: ClassVar[str] = "hold_end"
    model: str | None
    woke: str | None
    took_s: float | None
    forwarded: int | None = None  # sent on to the woken vLLM
    timed_out: int | None = None  # answered 503 after hold_s
    dropped: int | None = None  # their clients went away
    failed: int | None = None  # answered 503: the wake failed
    full: int | None = None  # answered 503 at once: hold_queue were held
    error: str | None = None

    def words(self, urls: Urls) -> str:
        counts = ("forwarded", "timed_out", "dropped", "failed", "full")
        parts = [f"{getattr(self, k)} {k.replace('_', ' ')}" for k in counts if getattr(self, k)]
        end = f"wake failed: {self.error}" if self.error else f"awake in {seconds(self.took_s)}"
        return f"{self.model} ({self.woke}) {end}; held requests: {', '.join(parts) or 'none'}"


@dataclass(frozen=True, kw_only=True)
class ForeignEvent(JournalEvent):
    """Someone else changed the router's workers; vsup undid it."""

    url: str | None
    first_seen: str | None
    users: list[str] | None

    def users_words(self) -> str:
        return f"local users connected to its port: {_joined(self.users) or 'none seen'}"


@_kind
@dataclass(frozen=True, kw_only=True)
class RouterForeignWorkerEvent(ForeignEvent):
    KIND: ClassVar[str] = "router_foreign_worker"
    removals: int | None = None

    def words(self, urls: Urls) -> str:
        return (
            f"SOMEONE ELSE added worker {self.url}; removed it (removal {self.removals}, "
            f"{self.users_words()})"
        )


@_kind
@dataclass(frozen=True, kw_only=True)
class RouterWorkerRemovedEvent(ForeignEvent):
    KIND: ClassVar[str] = "router_worker_removed"
    restores: int | None = None

    def words(self, urls: Urls) -> str:
        url = str(self.url)
        return (
            f"SOMEONE ELSE removed worker {urls.get(url, url)}; put it back (restore "
            f"{self.restores}, {self.users_words()})"
        )


# -- operator actions and rollouts -----------------------------------------------------------


@_kind
@dataclass(frozen=True, kw_only=True)
class ActionEvent(JournalEvent):
    """An operator's action (`by` operator, `names`), an apply (its layout's text, path and
    plan; `vsup rollback`'s apply also `rollback_of`, the kept layout's seq, and `rollback_t`,
    when that one was applied), a save, a shutdown, or the engine's echo of one on an
    instance."""

    KIND: ClassVar[str] = "action"
    action: str | None
    automatic: bool | None = None  # started again by vsup (exited while no daemon watched)
    drain: bool | None = None
    names: list[str] | None = None
    by: str | None = None
    level: int | None = None
    layout: str | None = None
    path: str | None = None
    plan: dict[str, Any] | None = None
    toml: str | None = None
    written: str | None = None
    outdated: list[str] | None = None
    stop_instances: bool | None = None
    rollback_of: int | None = None  # `vsup rollback`: the kept layout's seq (docs/canary.md)
    rollback_t: str | None = None  # and when that layout was applied

    def words(self, urls: Urls) -> str | None:
        action = self.action
        if self.by == "operator":
            return f"operator: {action} {', '.join(self.names or ()) or 'every instance'}"
        if action == "apply":
            where = f" ({self.path})" if self.path else ""
            named = self.layout or "(unnamed)"
            head = "operator: "
            if self.rollback_of is not None:
                when = f" (applied {_minute(self.rollback_t)})" if self.rollback_t else ""
                head += f"rollback to layout #{self.rollback_of}{when}: "
            return f"{head}apply layout {named}{where}: " + _plan_words(self.plan)
        if action == "save":
            return f"operator: saved the running layout to {self.written or self.path}"
        if action == "shutdown":
            stop = self.stop_instances is None or self.stop_instances
            how = "stop every instance" if stop else "leave instances running"
            return f"operator: shut the daemon down ({how})"
        if self.automatic:
            return "started again by vsup (it had exited while no daemon watched)"
        return None  # the engine's echo of an operator's action or an apply, said above


@_kind
@dataclass(frozen=True, kw_only=True)
class RolloutEvent(JournalEvent):
    """A rolling apply's progress: `Rollout.to_json()` (vsup.engine.rollout)."""

    KIND: ClassVar[str] = "rollout"
    state: str | None
    wave: int | None
    waves: int | None
    done: int | None
    total: int | None
    current: list[str] | None
    pending: list[str] | None
    max_unavailable: int | None
    failure: str | None
    started_at: str | None
    ended_at: str | None
    names: list[str] | None
    restarted: list[str] | None
    old_config: list[str] | None
    drain_timeout_s: float | None
    interrupted_at: str | None
    canary: list[str] | None = None
    canary_s: float | None = None
    canary_state: str | None = None
    verdict: str | None = None

    def words(self, urls: Urls) -> str:
        if self.state == RolloutState.ROLLED_BACK:
            return f"rollout rolled back at its canary: {self.failure}"
        head = f"rollout {self.state}: wave {self.wave}/{self.waves}, {self.done}/{self.total} done"
        if self.state == RolloutState.RUNNING and self.current:
            head += f", restarting {', '.join(self.current)}"
        if self.failure:
            head += f": {self.failure}"
        return head


@_kind
@dataclass(frozen=True, kw_only=True)
class CanaryEvent(JournalEvent):
    """A canary's gate has decided (docs/canary.md; engine/canary.py): `decision` pass | fail |
    insufficient, `reason` its words with the figures, `action` what the rollout does now
    (continue | roll_back), `figures` as data (canary first, the old instances second)."""

    KIND: ClassVar[str] = "canary"
    instances: list[str] | None
    decision: str | None
    reason: str | None
    action: str | None
    watched_s: float | None
    figures: dict[str, Any] | None = None

    def words(self, urls: Urls) -> str:
        then = "rolled back" if self.action == "roll_back" else "the rollout goes on"
        return f"{self.reason}; {then}"


# -- pulls of hub models (control/pulls.py) --------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class PullEvent(JournalEvent):
    """A hub model's pull, in the words `vsup status` uses (pullview)."""

    model: str | None
    revision: str | None
    instances: list[str] | None

    def what(self) -> str:
        who = ", ".join(self.instances or ())
        return pullview.label(self) + (f" for {who}" if who else "")


@_kind
@dataclass(frozen=True, kw_only=True)
class PullStartEvent(PullEvent):
    KIND: ClassVar[str] = "pull_start"
    commit: str | None
    cache_dir: str | None
    files: int | None
    bytes_total: int | None
    bytes_to_fetch: int | None

    def words(self, urls: Urls) -> str:
        commit = f" (commit {str(self.commit)[:12]})" if self.commit else ""
        return (
            f"pull of {self.what()} started: {self.files} file(s), "
            f"{pullview.human_bytes(self.bytes_to_fetch)} to fetch of "
            f"{pullview.human_bytes(self.bytes_total)}{commit}"
        )


@_kind
@dataclass(frozen=True, kw_only=True)
class PullProgressEvent(PullEvent):
    KIND: ClassVar[str] = "pull_progress"
    bytes_done: int | None
    bytes_total: int | None
    rate_bps: float | None

    def words(self, urls: Urls) -> str:
        pct = pullview.percent(self)
        rate = f", {pullview.human_bytes(self.rate_bps)}/s" if self.rate_bps else ""
        done = pullview.human_bytes(self.bytes_done)
        return (
            f"pull of {self.what()}: {done}/{pullview.human_bytes(self.bytes_total)}"
            + (f" ({pct})" if pct else "")
            + rate
        )


@_kind
@dataclass(frozen=True, kw_only=True)
class PullDoneEvent(PullEvent):
    KIND: ClassVar[str] = "pull_done"
    commit: str | None
    snapshot: str | None
    fetched_bytes: int | None
    elapsed_s: float | None

    def words(self, urls: Urls) -> str:
        return (
            f"pulled {self.what()}: {pullview.human_bytes(self.fetched_bytes)} fetched in "
            f"{pullview.duration(self.elapsed_s)}, snapshot {self.snapshot}"
        )


@_kind
@dataclass(frozen=True, kw_only=True)
class PullFailedEvent(PullEvent):
    KIND: ClassVar[str] = "pull_failed"
    reason: str | None
    message: str | None

    def words(self, urls: Urls) -> str:
        return f"pull of {self.what()} FAILED ({self.reason}): {self.message}"


PULL_KINDS = frozenset(
    c.KIND for c in (PullStartEvent, PullProgressEvent, PullDoneEvent, PullFailedEvent)
)


@dataclass(frozen=True)
class EventPage:
    """One answer of GET /v1/events: the events with `seq >= since` and the `since` that reads
    on after them."""

    events: list[JournalEvent]
    next: int

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> EventPage:
        events = doc.get("events")
        items = events if isinstance(events, list) else []
        nxt = doc.get("next")
        return cls(
            events=[decode(e) for e in items if isinstance(e, Mapping)],
            next=nxt if isinstance(nxt, int) else 0,
        )

    def to_json(self) -> dict[str, Any]:
        return {"events": [e.to_json() for e in self.events], "next": self.next}
