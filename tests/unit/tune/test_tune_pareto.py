"""The throughput/latency Pareto front."""

from __future__ import annotations

from vsup.tune.pareto import Point, dominates, front


def test_front_keeps_the_points_nobody_beats_on_both_axes():
    pts = [
        Point(1, 100.0, 50.0),  # fast and quick: front
        Point(2, 200.0, 80.0),  # more throughput, slower: front
        Point(3, 150.0, 90.0),  # beaten by 2 on both
        Point(4, 90.0, 60.0),  # beaten by 1 on both
        Point(5, 300.0, None),  # no latency: never on it
        Point(6, 200.0, 80.0),  # ties 2 exactly: neither dominates
    ]
    assert [p.key for p in front(pts)] == [1, 2, 6]
    assert dominates(pts[1], pts[2]) and not dominates(pts[1], pts[5])


def test_front_of_nothing_and_of_one():
    assert front([]) == []
    assert [p.key for p in front([Point(1, 1.0, 1.0)])] == [1]
    assert front([Point(1, None, 1.0)]) == []
