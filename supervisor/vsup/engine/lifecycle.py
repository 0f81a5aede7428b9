"""The life of one instance as a state machine: its states and the moves between them, no I/O.

States (snapshot.STATES):
    stopped    no process, and none wanted (never started, stopped, or a clean exit)
    starting   a start attempt: waiting for its turn on its devices, then spawned and polling
               /health until it answers 200
    ready      /health answered 200
    unhealthy  a ready process failed `unhealthy_after` health checks in a row (and, when they
               got no answer, gave none for `unhealthy_grace_s`); vsup is ending it
    backoff    it exited on its own and waits to be restarted (0 s before the first restart)
    stopping   a person asked it to stop: drain, SIGTERM, SIGKILL, sweep
    failed     the breaker tripped (restart.py), processes outlived SIGKILL, or the GPU kept
               their memory (`failed_why` says which); a person starts it again - or the
               engine, once processes that outlived SIGKILL while it was meant to run are gone

Moves, called by the runner (runner.py) that does the I/O:
    stopped|failed|backoff  --request_start-->  starting       (a person; the breaker resets)
    stopped|backoff         --attempt-->        starting       (the runner begins a start)
    starting                --spawned(run)-->   starting
    starting                --became_ready-->   ready
    ready                   --health_failed x unhealthy_after-->  unhealthy
    any but stopped|failed  --begin_stop-->     stopping
    starting|ready|unhealthy --exited-->        backoff | failed | stopped   (restart.py decides)
    stopping                --exited-->         stopping, then --finish_stop--> stopped

Every change is checked against states.TRANSITIONS (IllegalTransition on a move it lacks).
Time comes from an injected clock (supervisor/vsup/clock.py), so tests drive every timeout without
sleeping. `on_change(old, new)` is called after every change of state.
"""

from __future__ import annotations

from collections.abc import Callable

from vsup.clock import Clock
from vsup.engine.restart import Action, Decision, RestartTracker
from vsup.engine.states import IDLE, ExitReason, State, check_transition
from vsup.layout.spec import InstanceSpec
from vsup.snapshot import LastExit

__all__ = ["Lifecycle", "State"]


class Lifecycle:
    """The state of one instance and the rules that move it."""

    def __init__(
        self,
        spec: InstanceSpec,
        clock: Clock,
        on_change: Callable[[State, State], None] | None = None,
        deterministic_spawns: int = 1,
    ) -> None:
        self.clock = clock
        self.on_change = on_change
        self.tracker = RestartTracker(spec.restart, deterministic_spawns)
        self.start_timeout_s = spec.start_timeout_s
        self.unhealthy_after = max(1, spec.unhealthy_after)
        self.unhealthy_grace_s = spec.unhealthy_grace_s
        self.state = State.STOPPED
        self.state_since = clock.monotonic()
        self.run = 0  # spawns so far; the run number names the log file
        self.restarts = 0  # automatic restarts (not those a person asked for)
        self.last_exit: LastExit | None = None
        self.spawned_at: float | None = None
        self.ready_since: float | None = None
        self.backoff_until: float | None = None
        self.health_failures = 0
        self.last_health_status: int | None = None
        self.engine_part_died = False  # a data-parallel rank's engine core ended (ranks.py)
        self.last_answer_at: float | None = None  # the last /health answer, of any status
        # /health answers someone else got (the telemetry scrape): the latest status and how
        # many so far, so the health loop takes each at most once (runner.py)
        self.answered_status: int | None = None
        self.answered_count = 0
        # the latest of them was a 200 while ready, taken as the check when it came
        # (`health_answered`): the health loop has nothing left to do with it
        self.answered_taken = False
        # the health loop's alarm (runner.py): it sleeps for seconds while good answers come
        # with the scrapes, and any other answer, or a scrape without one, wakes it at once
        self.nudge: Callable[[], None] | None = None
        # at rest (telemetry/rest.py, control/monitor.py): its scrapes, and their /health, come
        # every rest_interval_s, and a good answer this recent stands for a check; 0: not at rest
        self.rest_window_s = 0.0
        self._restart_pending = False
        # why the instance is `failed` (cleared when it leaves that state), for people
        self.failed_why: str | None = None

    def configure(self, spec: InstanceSpec) -> None:
        """Take a new spec's restart policy and timeouts (they apply from the next decision)."""
        self.tracker.policy = spec.restart
        self.start_timeout_s = spec.start_timeout_s
        self.unhealthy_after = max(1, spec.unhealthy_after)
        self.unhealthy_grace_s = spec.unhealthy_grace_s

    # -- a person's requests ----------------------------------------------------------------

    def request_start(self, automatic: bool = False) -> None:
        """A person (or an apply) wants the instance running: the breaker starts over. An
        `automatic` start is the supervisor restarting an exited instance (one that died while
        no daemon watched): it counts as a restart and the breaker keeps counting."""
        if automatic:
            self._restart_pending = True
        else:
            self.tracker.reset()
            self._restart_pending = False
        if self.state in IDLE or self.state == State.BACKOFF:
            self.backoff_until = None
            self._enter(State.STARTING)

    def begin_stop(self) -> None:
        """A person wants the instance stopped (or restarted); a process may still be running."""
        self.backoff_until = None
        self._restart_pending = False
        if self.state not in IDLE:
            self._enter(State.STOPPING)

    def finish_stop(self) -> None:
        """Nothing of the instance is left running."""
        self.spawned_at = None
        self.ready_since = None
        self._enter(State.STOPPED)

    # -- the runner's observations ----------------------------------------------------------

    def attempt(self) -> None:
        """The runner begins a start attempt (after backoff, or after a restart's stop)."""
        if self.state != State.STARTING:
            self.backoff_until = None
            self._enter(State.STARTING)

    def spawned(self, run: int, started_ago_s: float = 0.0) -> None:
        """A process was spawned (or adopted) as run `run`, `started_ago_s` seconds ago."""
        self.run = run
        self.spawned_at = self.clock.monotonic() - max(0.0, started_ago_s)
        self.ready_since = None
        self.health_failures = 0
        self.last_health_status = None
        self.engine_part_died = False
        self.answered_status = None
        self.answered_taken = False
        self.rest_window_s = 0.0
        if self._restart_pending:
            self.restarts += 1
            self._restart_pending = False
        # a stop asked for while the spawn was under way stays a stop
        if self.state not in (State.STARTING, State.STOPPING):
            self._enter(State.STARTING)

    def became_ready(self) -> bool:
        """/health answered 200 while starting; True if that made the instance ready."""
        self.health_failures = 0
        if self.state != State.STARTING or self.spawned_at is None:
            return False
        self.ready_since = self.last_answer_at = self.clock.monotonic()
        self._enter(State.READY)
        return True

    def health_answered(self, status: int | None) -> None:
        """The current run answered `/health` with `status` to someone else's request (the
        telemetry scrape's); None: that request got no answer (the scrape failed). A 200
        while ready is this second's check at once; anything else wakes the health loop,
        which judges it as its own check's (runner.py)."""
        if status is not None:
            self.answered_status = status
            self.answered_count += 1
            self.answered_taken = self.state == State.READY and status == 200
            if self.answered_taken:
                self.health_ok()
                return
        if self.nudge is not None:
            self.nudge()

    def rests(self) -> bool:
        """Ready, at rest, and its last check good within the rest's window: the health loop
        asks nothing itself this second (the rest's next scrape brings its /health)."""
        if self.state != State.READY or self.rest_window_s <= 0 or self.health_failures:
            return False
        last = self.last_answer_at
        return last is not None and self.clock.monotonic() - last < self.rest_window_s

    def health_ok(self) -> None:
        self.health_failures = 0
        self.last_answer_at = self.clock.monotonic()

    def health_failed(self, status: int | None) -> bool:
        """A failed check (`status` None: no answer); True when the instance turns unhealthy.

        An answer that is not 200 (503: the engine died) counts at the `unhealthy_after`-th
        failure in a row. No answer at all (a timeout, a refused connection) must also have
        lasted `unhealthy_grace_s` since the last answer: an API server saturated by its load
        misses checks for seconds (measured here; reported on GPU fleets too) and is not hung."""
        if self.state != State.READY:
            return False
        now = self.clock.monotonic()
        self.health_failures += 1
        self.last_health_status = status
        if status is not None:
            self.last_answer_at = now
        if self.health_failures < self.unhealthy_after:
            return False
        last = self.last_answer_at if self.last_answer_at is not None else self.ready_since
        silent_for = now - last if last is not None else float("inf")
        if status is None and silent_for < self.unhealthy_grace_s:
            return False
        self._enter(State.UNHEALTHY)
        return True

    def engine_died(self) -> bool:
        """Part of the engine ended while the API server lives (a data-parallel rank's engine
        core): vLLM fails the whole server then, though /health says 200 for a few more
        seconds. True when that made a ready instance unhealthy (ended as `engine_dead`)."""
        self.engine_part_died = True
        if self.state != State.READY:
            return False
        self._enter(State.UNHEALTHY)
        return True

    @property
    def unhealthy_cause(self) -> ExitReason:
        """Why an unhealthy process is ended: `engine_dead` when /health said 503 or a rank's
        engine core died."""
        dead = self.last_health_status == 503 or self.engine_part_died
        return ExitReason.ENGINE_DEAD if dead else ExitReason.UNHEALTHY

    def start_remaining_s(self) -> float | None:
        """Seconds left before the start timeout, or None when no spawned start is running."""
        if self.state != State.STARTING or self.spawned_at is None:
            return None
        return self.spawned_at + self.start_timeout_s - self.clock.monotonic()

    def start_timed_out(self) -> bool:
        remaining = self.start_remaining_s()
        return remaining is not None and remaining <= 0

    def exited(
        self, last_exit: LastExit, *, hold: str | None = None, fail_fast: str | None = None
    ) -> Decision:
        """The process ended (or was never spawned: `port_in_use` found before spawning).

        During a stop the state stays `stopping` until `finish_stop`; otherwise the restart
        policy decides between `backoff`, `failed` and `stopped` - unless the runner knows
        better (memory.py): `hold` (why) restarts at once without counting a failure (the
        start will wait for memory other processes hold); `fail_fast` (why) fails now.
        """
        now = self.clock.monotonic()
        ready_for = now - self.ready_since if self.ready_since is not None else None
        self.last_exit = last_exit
        self.spawned_at = None
        self.ready_since = None
        if self.state == State.STOPPING or last_exit.reason == ExitReason.STOPPED:
            return Decision(
                Action.STOPPED, failures=self.tracker.failures, why="stopped by request"
            )
        if fail_fast is not None:
            self.tracker.failures += 1
            self.backoff_until = None
            self._restart_pending = False
            self.failed_why = fail_fast
            self._enter(State.FAILED)
            return Decision(Action.FAILED, failures=self.tracker.failures, why=fail_fast)
        if hold is not None:
            self.backoff_until = now
            self._restart_pending = True
            self._enter(State.BACKOFF)
            return Decision(Action.RESTART, 0.0, self.tracker.failures, why=hold)
        code = last_exit.code
        decision = self.tracker.decide(last_exit.reason, code, ready_for)
        if decision.action == Action.RESTART:
            self.backoff_until = now + decision.delay_s
            self._restart_pending = True
            self._enter(State.BACKOFF)
        elif decision.action == Action.FAILED:
            self.failed_why = f"the restart policy gave up: {decision.why}"
            self._enter(State.FAILED)
        else:
            self._enter(State.STOPPED)
        return decision

    def fail(self, why: str) -> None:
        """Trip the breaker for a reason outside the restart policy (a process that would not
        die, GPU memory that was not released); only a person starts the instance again."""
        self.backoff_until = None
        self._restart_pending = False
        self.failed_why = why
        self._enter(State.FAILED)

    def backoff_remaining_s(self) -> float | None:
        if self.state != State.BACKOFF or self.backoff_until is None:
            return None
        return max(0.0, self.backoff_until - self.clock.monotonic())

    def backoff_due(self) -> bool:
        remaining = self.backoff_remaining_s()
        return remaining is not None and remaining <= 0

    @property
    def failures(self) -> int:
        """Consecutive failures counted by the restart policy."""
        return self.tracker.failures

    def _enter(self, state: State) -> None:
        old = self.state
        if old == state:
            return
        check_transition(old, state)
        if state != State.FAILED:
            self.failed_why = None
        self.state = state
        self.state_since = self.clock.monotonic()
        if self.on_change is not None:
            self.on_change(old, state)
