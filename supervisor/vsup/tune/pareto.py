"""The throughput/latency Pareto front: the candidates no other candidate beats on both.

A point is (throughput, latency): more throughput is better, less latency is better. A point is
on the front when no other point has at least its throughput and at most its latency with one
of the two strictly better. Points missing either figure are never on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Point:
    key: int  # the candidate's index
    throughput: float | None
    latency: float | None

    @property
    def known(self) -> bool:
        return self.throughput is not None and self.latency is not None


def dominates(a: Point, b: Point) -> bool:
    """Whether `a` is at least as good as `b` on both axes and better on one."""
    assert a.throughput is not None and a.latency is not None
    assert b.throughput is not None and b.latency is not None
    at_least = a.throughput >= b.throughput and a.latency <= b.latency
    better = a.throughput > b.throughput or a.latency < b.latency
    return at_least and better


def front(points: Sequence[Point]) -> list[Point]:
    """The non-dominated points, by throughput ascending (the order to draw the front in)."""
    known = [p for p in points if p.known]
    out = [p for p in known if not any(dominates(q, p) for q in known if q is not p)]
    return sorted(out, key=lambda p: (p.throughput, p.key))
