"""The restart policy: when an instance that exited comes back, and when vsup gives up.

Kubernetes-like (docs/ARCHITECTURE.md, Engine):
- the first restart after a failure happens at once, then the delay doubles from `backoff_s`
  up to `backoff_max_s`: with backoff_s=10 the delays are 0, 10, 20, 40, ... ;
- a run that stayed ready for `stable_s` resets the count of consecutive failures, so a server
  that crashes once a day is always restarted at once;
- after `max_failures` consecutive failures the breaker trips: the instance is `failed` and
  only a person starts it again (`max_failures = 0` means never give up);
- exits that will recur whatever vsup does (`bad_args`, `model_not_found`, `port_in_use`) fail
  fast: by default the first one trips the breaker. Each retry of a vLLM start costs from 30 s
  (CPU) to many minutes (a large model on GPUs) and fixes nothing until someone edits the layout
  or frees the port; `deterministic_spawns` allows more spawns where a node has reasons to.

Policies: `never` restarts nothing (a failure ends `failed`, a clean exit `stopped`);
`on-failure` restarts failures only; `always` restarts clean exits too. A failure is any exit
the operator did not ask for, except a clean one: exit code 0 with nothing wrong in the log.
vLLM exits 0 after its engine died (`engine_dead`), so the reason, not the code, decides.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from vsup.engine.states import ExitReason as R
from vsup.layout.spec import RestartPolicy

# Exit reasons that recur on every spawn until a person changes something.
DETERMINISTIC = frozenset({R.BAD_ARGS, R.MODEL_NOT_FOUND, R.PORT_IN_USE})


class Action(StrEnum):
    """What follows an exit."""

    RESTART = "restart"  # after the decision's delay_s (backoff)
    FAILED = "failed"  # the breaker tripped: only a person starts it again
    STOPPED = "stopped"  # nothing to restart (asked for, or a clean exit)


@dataclass(frozen=True)
class Decision:
    """What to do after an exit: `restart` after `delay_s`, or stay `failed` / `stopped`."""

    action: Action
    delay_s: float = 0.0
    failures: int = 0  # consecutive failures counted so far
    why: str = ""


def is_failure(reason: str, code: int | None) -> bool:
    """Whether an exit counts against the instance (a clean exit or an operator stop does not)."""
    if reason == R.STOPPED:
        return False
    return not (reason == R.UNKNOWN and code == 0)


def backoff_delay(policy: RestartPolicy, failures: int) -> float:
    """The wait before the restart that follows the `failures`-th consecutive failure."""
    if failures <= 1:
        return 0.0
    return float(min(policy.backoff_s * 2 ** (failures - 2), policy.backoff_max_s))


class RestartTracker:
    """Counts consecutive failures of one instance and decides each restart."""

    def __init__(self, policy: RestartPolicy, deterministic_spawns: int = 1) -> None:
        self.policy = policy
        self.deterministic_spawns = max(1, deterministic_spawns)
        self.failures = 0
        self.deterministic_failures = 0

    def reset(self) -> None:
        """A person started the instance: the breaker and the backoff start over."""
        self.failures = 0
        self.deterministic_failures = 0

    def decide(self, reason: str, code: int | None, ready_for_s: float | None) -> Decision:
        """Record an exit that the operator did not request and say what follows.

        `ready_for_s` is how long the run that ended had been ready (None if it never was).
        """
        policy = self.policy
        if ready_for_s is not None and ready_for_s >= policy.stable_s:
            self.reset()
        failure = is_failure(reason, code)
        if not failure and policy.policy != "always":
            return Decision(Action.STOPPED, failures=self.failures, why="clean exit")
        self.failures += 1
        if reason in DETERMINISTIC:
            self.deterministic_failures += 1
            if self.deterministic_failures >= self.deterministic_spawns:
                return Decision(Action.FAILED, failures=self.failures, why=f"{reason} recurs")
        else:
            self.deterministic_failures = 0
        if policy.policy == "never":
            return Decision(Action.FAILED, failures=self.failures, why="restart policy is never")
        if policy.max_failures > 0 and self.failures >= policy.max_failures:
            return Decision(
                Action.FAILED,
                failures=self.failures,
                why=f"{self.failures} consecutive failures (max_failures = {policy.max_failures})",
            )
        return Decision(Action.RESTART, backoff_delay(policy, self.failures), self.failures)
