"""`live_tree` indexes a process table once (by group and by parent) and reuses the index for
every instance's tree in that table (the daemon's chores at 64+ instances: docs/benchmarks.md);
a new scan gets its own index, never the last table's."""

from __future__ import annotations

from vsup.engine.proc import ProcInfo, live_tree


def table(*rows: tuple[int, int, int, str, float]) -> dict[int, ProcInfo]:
    return {r[0]: ProcInfo(*r) for r in rows}


def test_each_instance_of_one_table_gets_its_own_tree() -> None:
    t = table(
        (100, 1, 100, "S", 50.0),  # instance a: API server
        (101, 100, 100, "S", 51.0),  # its EngineCore
        (200, 1, 200, "S", 60.0),  # instance b
        (201, 200, 200, "S", 61.0),
        (202, 201, 202, "S", 62.0),  # b's child in a group of its own, known to b
    )
    assert sorted(live_tree(100, {}, 50.0, t)) == [100, 101]
    assert sorted(live_tree(200, {}, 60.0, t)) == [200, 201, 202]
    assert sorted(live_tree(None, {202: 62.0}, 60.0, t)) == [202]
    assert sorted(live_tree(100, {}, 50.0, t)) == [100, 101]


def test_a_new_scan_is_read_afresh() -> None:
    first = table((100, 1, 100, "S", 50.0), (101, 100, 100, "S", 51.0))
    assert sorted(live_tree(100, {}, 50.0, first)) == [100, 101]
    # the next scan: the EngineCore is gone and a worker was forked (an equal-sized table)
    second = table((100, 1, 100, "S", 50.0), (102, 100, 100, "S", 52.0))
    assert sorted(live_tree(100, {}, 50.0, second)) == [100, 102]
    # a table that grew in place (a caller's own dict) is indexed again too
    second[103] = ProcInfo(103, 102, 100, "S", 53.0)
    assert sorted(live_tree(100, {}, 50.0, second)) == [100, 102, 103]
