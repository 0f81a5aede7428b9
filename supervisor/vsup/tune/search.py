"""The search: asynchronous successive halving over rungs of prompts, each candidate started once.

Rungs are workloads of growing size: with the full workload of P prompts and a reduction factor
eta, rung r of R sends P / eta^(R-1-r) prompts (at least `min_prompts`), so the last rung is the
whole workload. Every candidate runs the first rung. After a rung a candidate goes on to the next
only while its score (goodput under the SLO, or output tokens/s without one) is among the best
ceil(m / eta) of the m candidates measured at that rung so far, or within `margin` of the
cut-off (a difference inside the noise never cuts). Candidates that reach the last rung run it
`repeats` times, and those figures rank them.

Why this and not optuna (or synchronous successive halving / Hyperband):
- A candidate's start is the expensive part (loading weights, compiling, capturing CUDA graphs:
  minutes on a GPU for an 8B model) and a rung is cheap once it runs. ASHA's promotion rule
  looks only at the candidates measured so far, so a candidate can run all its rungs while it
  is up and is started exactly once; synchronous halving would stop every candidate after each
  rung and start the survivors again, paying the start once per rung.
- The spaces are small grids (3-20 candidates of a few discrete knobs): a model-based sampler
  (optuna's TPE) learns nothing from a dozen points that the grid does not show, and its
  pruners decide on intermediate values of one trial, which here are the same rungs.
- No new dependency on a supervisor that is installed on GPU nodes; the rule is a few lines
  that the report can state exactly.
The price is ASHA's known bias: early candidates are compared against fewer rivals, so the first
candidate always reaches the last rung. The order puts the base layout first, which makes it
the yardstick the others must beat, which is what an operator asks.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

DEFAULT_ETA = 2
DEFAULT_MARGIN = 0.05  # within 5 % of the cut-off a candidate is not cut


def rung_sizes(full: int, eta: int, candidates: int, min_prompts: int) -> list[int]:
    """Prompts per rung, smallest first, the last being `full`: at most enough rungs to halve
    the candidates down to one, and none below `min_prompts`."""
    if full < 1 or eta < 2 or candidates < 1 or min_prompts < 1:
        raise ValueError("rung_sizes: full, candidates and min_prompts >= 1, eta >= 2")
    by_candidates = 1 + math.floor(math.log(candidates, eta) + 1e-9) if candidates > 1 else 1
    by_prompts = 1 + math.floor(math.log(max(1.0, full / min_prompts), eta) + 1e-9)
    rungs = max(1, min(by_candidates, by_prompts))
    sizes = [max(min_prompts, round(full / eta ** (rungs - 1 - r))) for r in range(rungs)]
    sizes[-1] = full
    return sorted(set(sizes))


@dataclass
class Halving:
    """The promotion rule, over the scores measured so far at each rung."""

    rungs: list[int]
    eta: int = DEFAULT_ETA
    margin: float = DEFAULT_MARGIN
    scores: dict[int, list[float]] = field(default_factory=dict)  # rung -> scores

    def record(self, rung: int, score: float | None) -> None:
        """A candidate's score at `rung` (None: it failed or broke the SLO: scores 0)."""
        self.scores.setdefault(rung, []).append(score or 0.0)

    def cutoff(self, rung: int) -> float:
        """The lowest score that still goes on from `rung`: the ceil(m/eta)-th best."""
        got = sorted(self.scores.get(rung, ()), reverse=True)
        if not got:
            return 0.0
        keep = max(1, math.ceil(len(got) / self.eta))
        return got[keep - 1]

    def promote(self, rung: int, score: float | None) -> bool:
        """Whether a candidate that scored `score` at `rung` (already recorded) goes on."""
        if rung >= len(self.rungs) - 1 or not score or score <= 0:
            return False
        return score >= self.cutoff(rung) * (1 - self.margin)


@dataclass
class Step:
    """One measurement: a candidate at a rung (and a repeat of the last rung)."""

    candidate: int  # Candidate.index
    rung: int
    prompts: int
    repeat: int  # 0-based; > 0 only at the last rung
    outcome: str  # the bench run's outcome: ok, partial, failed, not_ready, invalid, ...
    score: float | None
    slo_met: bool
    seconds: float
    start_seconds: float | None = None  # how long the candidate took to become ready
    result: dict[str, Any] = field(default_factory=dict)


@dataclass
class Estimator:
    """The time of what is left, from what was measured: a start, and a prompt's share of a
    rung (each rung's steps scale with their prompts)."""

    starts: list[float] = field(default_factory=list)
    per_prompt: list[float] = field(default_factory=list)
    overhead: list[float] = field(default_factory=list)

    def add(self, step: Step) -> None:
        run_s = step.seconds - (step.start_seconds or 0.0)
        if step.start_seconds is not None and step.rung == 0 and step.repeat == 0:
            self.starts.append(step.start_seconds)
        if step.prompts:
            self.per_prompt.append(max(0.0, run_s) / step.prompts)

    def start(self) -> float | None:
        return _median(self.starts)

    def step(self, prompts: int, start: bool) -> float | None:
        """A step of `prompts` prompts (and a start before it with `start`); None: unknown."""
        per = _median(self.per_prompt)
        if per is None:
            return None
        return per * prompts + ((self.start() or 0.0) if start else 0.0)

    def candidate(self, rungs: Sequence[int], eta: int, repeats: int) -> float | None:
        """An average candidate: a start, the first rung, and its share of the later rungs."""
        first = self.step(rungs[0], start=True)
        if first is None:
            return None
        later = sum(
            (self.step(p, start=False) or 0.0) * (repeats if r == len(rungs) - 1 else 1) / eta**r
            for r, p in enumerate(rungs)
            if r > 0
        )
        return first + later


def _median(xs: Sequence[float]) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


# What one measurement needs from the caller: run `candidate` at `prompts` (repeat `repeat`)
# and say how it went.
Measure = Callable[[Any, int, int, int], Step]


@dataclass
class SearchResult:
    steps: list[Step]
    finished: list[int]  # candidates that reached the last rung
    stopped_at: dict[int, int]  # candidate -> the last rung it ran
    skipped: dict[int, str]  # candidate -> why it never ran (budget)
    budget_hit: bool
    budget_stopped: int | None = None  # the candidate the budget stopped after a rung
    cut: list[int] = field(default_factory=list)  # candidates the rule stopped before the end


def run_search(
    candidates: Sequence[Any],
    measure: Measure,
    halving: Halving,
    *,
    repeats: int = 1,
    budget_s: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    on_step: Callable[[Step], None] | None = None,
    into: SearchResult | None = None,
) -> SearchResult:
    """Run the candidates (each with an `index`) in order through the rungs (see the module
    doc). The budget is checked before each step against the estimate of that step: what would
    run past it is not started. `into` is filled as the search goes, so that what was measured
    before an interrupt (KeyboardInterrupt out of `measure`) is known."""
    out = into if into is not None else SearchResult([], [], {}, {}, False)
    search = _Search(measure, halving, repeats, budget_s, clock, on_step, out, t0=clock())
    for cand in candidates:
        if search.budget_hit:
            out.skipped[cand.index] = "the time budget ran out"
            continue
        search.candidate(cand)
    return out


@dataclass
class _Search:
    """One search's state: what it measures with, the estimate, the result it fills."""

    measure: Measure
    halving: Halving
    repeats: int
    budget_s: float | None
    clock: Callable[[], float]
    on_step: Callable[[Step], None] | None
    out: SearchResult
    t0: float
    est: Estimator = field(default_factory=Estimator)
    budget_hit: bool = False

    @property
    def last(self) -> int:
        return len(self.halving.rungs) - 1

    def candidate(self, cand: Any) -> None:
        """`cand` up the rungs until the rule cuts it, a step fails or the budget runs out."""
        out = self.out
        rung = 0
        while True:
            step, scores, n = self.rung(cand, rung)
            if step is None:  # the budget stopped it before its first step here
                if rung == 0:
                    out.skipped[cand.index] = "the time budget ran out"
                else:
                    out.budget_stopped = cand.index
                return
            out.stopped_at[cand.index] = rung
            score = _median(scores) if scores and step.outcome == "ok" else None
            self.halving.record(rung, score)
            if rung == self.last and step.outcome == "ok" and len(scores) == n:
                out.finished.append(cand.index)
            if self.budget_hit:
                if cand.index not in out.finished:
                    out.budget_stopped = cand.index
                return
            if not self.halving.promote(rung, score):
                if rung < self.last and step.outcome == "ok":
                    out.cut.append(cand.index)
                return
            rung += 1

    def rung(self, cand: Any, rung: int) -> tuple[Step | None, list[float], int]:
        """The steps of `cand` at `rung` (the repeats at the last): its last step (None: the
        budget left none), the scores of its ok steps, and how many steps it was due."""
        n = self.repeats if rung == self.last else 1
        prompts = self.halving.rungs[rung]
        step: Step | None = None
        scores: list[float] = []
        for rep in range(n):
            guess = self.est.step(prompts, start=rung == 0 and rep == 0)
            budget_s = self.budget_s
            if (
                budget_s is not None
                and guess is not None
                and self.clock() - self.t0 + guess > budget_s
            ):
                self.budget_hit = self.out.budget_hit = True
                break
            step = self.measure(cand, rung, prompts, rep)
            self.out.steps.append(step)
            self.est.add(step)
            if self.on_step is not None:
                self.on_step(step)
            if step.outcome != "ok":
                break  # a crash or a failure: no repeat will mend it
            scores.append(step.score if step.slo_met and step.score else 0.0)
        return step, scores, n


def eta_seconds(
    remaining_candidates: int, per_candidate: float | None, budget_s: float | None, elapsed_s: float
) -> float | None:
    """About how long the search has left: the candidates left at the mean time of those run,
    never past the budget; None while unknown (no candidate finished, no budget)."""
    estimate = None if per_candidate is None else remaining_candidates * per_candidate
    if budget_s is None:
        return estimate
    left = max(0.0, budget_s - elapsed_s)
    return left if estimate is None else min(estimate, left)


def eta_text(seconds: float | None) -> str:
    """`~4m10s left` (eta_seconds) or `ETA unknown`."""
    if seconds is None:
        return "ETA unknown until the first candidate ran"
    from vsup.progress import fmt_duration

    return f"~{fmt_duration(seconds)} left"
