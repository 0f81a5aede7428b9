"""What is wanted of an instance, as one value: run it, stop it (with a drain), or restart it
(with a drain, a new spec, a cause).

The engine sets the intent (a person's start/stop/restart, an apply, a rollout, a stall
restart, the restart policy giving up) and the instance's runner reads it and takes a pending
restart when it begins the next start. One value instead of loose flags, so a wish cannot be
half-set: a restart asked for while a spawn is under way stays asked for until the runner
takes it (it ends the new process and starts again), whatever the process is doing.

Changes go through `Control`'s moves, each checked against `TRANSITIONS` like the states
(`states.TRANSITIONS`): an illegal change is a bug and raises `IllegalIntent`.

    kind       value                                                  meaning
    stop       Stop(drain, drain_timeout_s)                           nothing should run
    run        Run()                                                  it should run
    restart    Restart(drain, drain_timeout_s, spec)                  end this run, start again
    stall      Restart(..., cause=STALLED, why)                       restart.on_stall: end the
               stalled run as `stalled`; the restart policy decides what follows
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from vsup.layout.spec import InstanceSpec
from vsup.states import ExitReason


@dataclass(frozen=True)
class Run:
    """It should run (and nothing about the current run is asked for)."""


@dataclass(frozen=True)
class Stop:
    """Nothing of it should run; a stop of a serving process first drains for `drain` (at most
    `drain_timeout_s`, default the spec's)."""

    drain: bool = False
    drain_timeout_s: float | None = None


@dataclass(frozen=True)
class Restart:
    """End the current run (if any) and start again, with `spec` when an apply changed it.

    `cause` is how the run ends: `stopped` (a person or an apply asked: drained like a stop,
    the breaker reset) or `stalled` (restart.on_stall: the exit counts as a failure and the
    restart policy decides, `why` says what was seen)."""

    drain: bool = False
    drain_timeout_s: float | None = None
    spec: InstanceSpec | None = None
    cause: ExitReason = ExitReason.STOPPED
    why: str | None = None
    rank: int | None = None  # data parallel: the rank that stalled (its exit's `rank`)


Intent = Run | Stop | Restart


class Kind(StrEnum):
    STOP = "stop"
    RUN = "run"
    RESTART = "restart"
    STALL = "stall"


def kind_of(intent: Intent) -> Kind:
    if isinstance(intent, Stop):
        return Kind.STOP
    if isinstance(intent, Run):
        return Kind.RUN
    return Kind.STALL if intent.cause == ExitReason.STALLED else Kind.RESTART


K = Kind
# from -> the kinds it may change to; staying within a kind is always allowed (a second stop with
# another drain, a second restart merged into the first), except a stall restart: one at a time.
TRANSITIONS: dict[Kind, frozenset[Kind]] = {
    # start; a restart of an idle instance (it starts, with the restart's spec)
    K.STOP: frozenset({K.RUN, K.RESTART}),
    # stop; restart; a stall restart of a run that stalled
    K.RUN: frozenset({K.STOP, K.RESTART, K.STALL}),
    # taken by the runner (run); stop
    K.RESTART: frozenset({K.RUN, K.STOP}),
    # taken; stop (a person's, or the policy gave up); a person's restart outranks it
    K.STALL: frozenset({K.RUN, K.STOP, K.RESTART}),
}


class IllegalIntent(RuntimeError):
    """An intent change the table does not allow: a bug in the engine."""

    def __init__(self, old: Intent, new: Intent | None, move: str) -> None:
        target = kind_of(new) if new is not None else "-"
        super().__init__(f"illegal intent change {kind_of(old)} -> {target} ({move})")
        self.old, self.new = old, new


def check(old: Intent, new: Intent, move: str) -> None:
    """Raise IllegalIntent unless `old -> new` is in TRANSITIONS."""
    a, b = kind_of(old), kind_of(new)
    if a == b and a != K.STALL:
        return
    if b not in TRANSITIONS[a]:
        raise IllegalIntent(old, new, move)


class IntentCell:
    """One instance's intent and the moves that change it (held by `instance.Control`)."""

    def __init__(self) -> None:
        self._intent: Intent = Stop()

    @property
    def intent(self) -> Intent:
        return self._intent

    def _move(self, new: Intent, move: str) -> None:
        check(self._intent, new, move)
        self._intent = new

    # -- reading ----------------------------------------------------------------------------

    @property
    def wants_run(self) -> bool:
        """It should run (or run again after a restart)."""
        return not isinstance(self._intent, Stop)

    @property
    def end_asked(self) -> bool:
        """The current run must end because a person (or an apply) asked: a stop or a restart,
        not a stall restart (that one ends as `stalled`)."""
        i = self._intent
        return isinstance(i, Stop) or (isinstance(i, Restart) and i.cause == ExitReason.STOPPED)

    @property
    def stall(self) -> Restart | None:
        """The pending stall restart, if that is what is asked."""
        i = self._intent
        return i if isinstance(i, Restart) and i.cause == ExitReason.STALLED else None

    @property
    def pending_spec(self) -> InstanceSpec | None:
        """The spec the next start takes (a pending restart's), or None: the current one."""
        i = self._intent
        return i.spec if isinstance(i, Restart) else None

    @property
    def drain(self) -> tuple[bool, float | None]:
        """(drain?, its limit or None for the spec's) for ending the current run as asked."""
        i = self._intent
        if isinstance(i, Stop | Restart):
            return i.drain, i.drain_timeout_s
        return False, None

    # -- moves ------------------------------------------------------------------------------

    def start(self) -> None:
        """It should run. A pending restart stays: the run it ends is still to end."""
        if isinstance(self._intent, Restart):
            return
        self._move(Run(), "start")

    def stop(self, drain: bool = False, drain_timeout_s: float | None = None) -> None:
        """Nothing should run: a person's stop, or the engine's for a reason that outranks any
        wish (processes that outlived SIGKILL, GPU memory not released, a runner that broke)."""
        self._move(Stop(drain, drain_timeout_s), "stop")

    def restart(
        self,
        drain: bool = False,
        drain_timeout_s: float | None = None,
        spec: InstanceSpec | None = None,
    ) -> None:
        """End the current run and start again. Merged into a pending restart: its spec stays
        unless `spec` replaces it (an apply's restart, then a person's, starts the apply's)."""
        old = self._intent
        if spec is None and isinstance(old, Restart):
            spec = old.spec
        self._move(Restart(drain, drain_timeout_s, spec), "restart")

    def stall_restart(self, why: str, rank: int | None = None) -> None:
        """restart.on_stall: end the stalled run as `stalled` (`rank`: the data-parallel rank
        that stalled, if one did). Only from a plain run."""
        self._move(Restart(cause=ExitReason.STALLED, why=why, rank=rank), "stall")

    def take(self) -> InstanceSpec | None:
        """The runner begins a start: a pending restart is taken (its spec, if any, is
        returned for the start to use). A start while nothing should run is a bug."""
        old = self._intent
        if isinstance(old, Stop):
            raise IllegalIntent(old, None, "take")
        if isinstance(old, Restart):
            self._move(Run(), "take")
            return old.spec
        return None

    def give_up(self) -> None:
        """The restart policy does not restart the run that ended (it failed, or exited clean).
        A person's pending restart outranks that verdict on the run before it: it stays."""
        old = self._intent
        if isinstance(old, Restart) and old.cause == ExitReason.STOPPED:
            return
        self._move(Stop(), "give_up")

    def drop_spec(self) -> None:
        """The instance took a spec directly (an apply's update): a pending restart starts with
        that one, not the spec it carried."""
        old = self._intent
        if isinstance(old, Restart) and old.spec is not None:
            self._move(replace(old, spec=None), "drop_spec")
