"""Successive halving: the rungs, the promotion rule, the budget and crashes, on a measure that
returns given scores (the search's logic alone; the real one runs vLLM)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from vsup.tune.search import Halving, Step, eta_seconds, eta_text, run_search, rung_sizes


@pytest.mark.parametrize(
    ("full", "eta", "cands", "min_p", "want"),
    [
        (200, 2, 8, 16, [25, 50, 100, 200]),  # 8 candidates halve 3 times
        (200, 3, 9, 16, [22, 67, 200]),
        (200, 2, 1, 16, [200]),  # one candidate: the full workload only
        (32, 2, 8, 16, [16, 32]),  # the prompts allow two rungs
        (16, 2, 4, 16, [16]),
        (8, 2, 3, 4, [4, 8]),
    ],
)
def test_rung_sizes(full, eta, cands, min_p, want):
    assert rung_sizes(full, eta, cands, min_p) == want


def test_promotion_keeps_the_best_share_seen_so_far_with_a_margin():
    h = Halving([10, 20, 40], eta=2, margin=0.05)
    h.record(0, 100.0)
    assert h.promote(0, 100.0)  # the first always goes on: nothing to compare with
    h.record(0, 50.0)
    assert not h.promote(0, 50.0)  # top ceil(2/2) = 1: 100
    h.record(0, 97.0)
    assert h.promote(0, 97.0)  # top ceil(3/2) = 2: 100, 97
    h.record(0, 96.0)  # top 2 of 4: cut-off 97; 96 is within 5 %
    assert h.promote(0, 96.0)
    assert not h.promote(2, 500.0)  # the last rung promotes nowhere
    h.record(1, None)
    assert not h.promote(1, None)  # a failure or a broken SLO never goes on


@dataclass
class Cand:
    index: int


class Script:
    """A measure that answers from a table: (candidate, rung) -> (outcome, score, slo_met),
    and advances a fake clock by `seconds` each step."""

    def __init__(self, table, seconds=10.0):
        self.table = table
        self.seconds = seconds
        self.now = 0.0
        self.calls = []

    def clock(self):
        return self.now

    def __call__(self, cand, rung, prompts, repeat):
        self.calls.append((cand.index, rung, repeat))
        outcome, score, met = self.table[(cand.index, rung)]
        self.now += self.seconds
        return Step(cand.index, rung, prompts, repeat, outcome, score, met, self.seconds, 0.0)


def test_each_candidate_runs_its_rungs_in_one_go_and_losers_stop_early():
    table = {
        (1, 0): ("ok", 10.0, True), (1, 1): ("ok", 10.0, True),
        (2, 0): ("ok", 5.0, True),  # loses to 1 at rung 0: cut
        (3, 0): ("ok", 20.0, True), (3, 1): ("ok", 19.0, True),
        (4, 0): ("ok", 30.0, False),  # breaks the SLO: scores 0, cut
    }  # fmt: skip
    m = Script(table)
    result = run_search([Cand(i) for i in (1, 2, 3, 4)], m, Halving([8, 16]), repeats=2,
                        clock=m.clock)  # fmt: skip
    assert m.calls == [(1, 0, 0), (1, 1, 0), (1, 1, 1), (2, 0, 0), (3, 0, 0), (3, 1, 0),
                       (3, 1, 1), (4, 0, 0)]  # fmt: skip
    assert result.finished == [1, 3] and result.cut == [2, 4]
    assert result.stopped_at == {1: 1, 2: 0, 3: 1, 4: 0}
    assert not result.budget_hit and result.skipped == {}


def test_a_crashed_candidate_is_recorded_and_the_search_goes_on():
    table = {
        (1, 0): ("not_ready", None, False),
        (2, 0): ("ok", 10.0, True), (2, 1): ("partial", 3.0, False),
        (3, 0): ("ok", 12.0, True), (3, 1): ("ok", 12.0, True),
    }  # fmt: skip
    m = Script(table)
    result = run_search([Cand(1), Cand(2), Cand(3)], m, Halving([8, 16]), repeats=2,
                        clock=m.clock)  # fmt: skip
    # 2 crashed at rung 1: no repeat of a crash
    assert (2, 1, 1) not in m.calls
    assert [s.outcome for s in result.steps][:3] == ["not_ready", "ok", "partial"]
    assert result.finished == [3]


def test_the_budget_stops_what_would_run_past_it():
    table = {(i, r): ("ok", 10.0 + i, True) for i in range(1, 6) for r in range(2)}
    m = Script(table, seconds=10.0)
    result = run_search([Cand(i) for i in range(1, 6)], m, Halving([8, 16]), repeats=1,
                        budget_s=35.0, clock=m.clock)  # fmt: skip
    # each step takes 10 s (the estimate learns it from the first): 3 steps fit in 35 s
    assert len(m.calls) == 3 and result.budget_hit
    assert set(result.skipped) >= {4, 5}
    assert all(why == "the time budget ran out" for why in result.skipped.values())


def test_the_eta_is_the_candidates_left_at_the_mean_time_never_past_the_budget():
    assert eta_seconds(3, None, None, 50.0) is None  # nothing finished, no budget: unknown
    assert eta_text(None) == "ETA unknown until the first candidate ran"
    assert eta_seconds(3, 100.0, None, 200.0) == 300.0
    assert eta_seconds(3, 100.0, 600.0, 500.0) == 100.0  # the budget ends it first
    assert eta_seconds(3, None, 600.0, 500.0) == 100.0  # known from the budget alone
    assert eta_seconds(3, 100.0, 600.0, 700.0) == 0.0
    assert eta_text(300.0) == "~5m00s left"
