"""The kept layouts of `vsup rollback` (control/layouthistory.py): which one it goes back to,
what is kept, the file across daemons, and a home that has only the journal."""

from __future__ import annotations

import dataclasses
import json
import os
import stat

import pytest

from vsup.control.journal import Journal
from vsup.control.layouthistory import (
    KEEP,
    KeptLayout,
    LayoutHistory,
    NoLayout,
    bench_candidate,
    choose,
    journal_applies,
    remember,
)
from vsup.journalevents import ActionEvent
from vsup.lease import clear_lease


def kept(seq: int, toml: str, path: str | None = None) -> KeptLayout:
    return KeptLayout(seq=seq, toml=toml, t=f"2026-12-06T01:00:{seq:02d}Z", name="n", path=path)


def test_the_previous_layout_is_the_newest_that_differs_from_the_running_one():
    a, b = kept(1, "A"), kept(2, "B")
    assert choose([a, b], running="B") == a
    # B applied twice in a row (an entry each, as an older file may hold): still A
    assert choose([a, b, kept(3, "B")], running="B") == a
    # a rollback to A applied A again: the next rollback returns to B
    assert choose([a, b, kept(3, "A")], running="A").seq == 2


def test_after_a_canary_rolled_back_the_previous_layout_is_the_one_before_the_failed_one():
    # The gate put the instances back on A's spec, but the running layout is B (applied):
    # rollback applies A, which restarts nothing and makes the daemon's layout A again.
    assert choose([kept(1, "A"), kept(2, "B")], running="B").toml == "A"


def test_a_seq_picks_that_layout_even_the_running_one():
    layouts = [kept(1, "A"), kept(2, "B"), kept(3, "C")]
    assert choose(layouts, running="C", seq=1).toml == "A"
    assert choose(layouts, running="C", seq=3).toml == "C"
    with pytest.raises(NoLayout, match=r"no kept layout has seq 7 \(kept: 3, 2, 1"):
        choose(layouts, running="C", seq=7)


def test_no_previous_layout_says_why():
    with pytest.raises(NoLayout, match="no layout was applied on this node yet"):
        choose([], running=None)
    with pytest.raises(NoLayout, match="every kept layout is the running one"):
        choose([kept(4, "A")], running="A")
    # no running layout (nothing applied since the state was lost): the last applied one
    assert choose([kept(4, "A")], running=None).seq == 4


def test_remember_keeps_the_newest_and_folds_a_repeated_text():
    out: list[KeptLayout] = []
    for i in range(KEEP + 3):
        out = remember(out, kept(i + 1, f"L{i}"))
    assert [k.seq for k in out] == list(range(4, KEEP + 4))
    again = remember(out, kept(99, out[-1].toml, path="/new/place.toml"))
    assert len(again) == KEEP and again[-1].seq == 99 and again[-1].path == "/new/place.toml"
    assert again[-2] == out[-2]


def test_the_file_is_private_survives_a_new_daemon_and_skips_garbled_entries(tmp_path):
    path = tmp_path / "layouts.json"
    history = LayoutHistory(path)
    history.record(kept(1, "A", "/l/a.toml"))
    history.record(kept(5, "B", "/l/b.toml"))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert LayoutHistory(path).entries() == [kept(1, "A", "/l/a.toml"), kept(5, "B", "/l/b.toml")]

    doc = json.loads(path.read_text())
    doc["layouts"] += [{"seq": "x", "toml": "C"}, {"seq": 9}, "junk", {"seq": 8, "toml": 3}]
    path.write_text(json.dumps(doc))
    assert [k.seq for k in LayoutHistory(path).entries()] == [1, 5]


def test_a_home_without_the_file_starts_from_the_journals_applies(tmp_path):
    journal = Journal(tmp_path / "journal.jsonl")
    journal.append(ActionEvent(action="apply", layout="a", path="/l/a.toml", toml="A"))
    journal.append(ActionEvent(action="stop", names=["x"], by="operator"))
    journal.append(ActionEvent(action="apply", layout="b", path="/l/b.toml", toml="B"))
    journal.append(ActionEvent(action="apply", layout="b", path="/l/b.toml", toml="B"))
    journal.append(ActionEvent(action="apply", layout="old", plan={}))  # an older vsup: no text
    journal.close()
    history = LayoutHistory(tmp_path / "layouts.json", lambda: journal_applies(journal.iter_file()))
    entries = history.entries()
    assert [(k.seq, k.toml, k.name, k.path) for k in entries] == [
        (1, "A", "a", "/l/a.toml"),
        (4, "B", "b", "/l/b.toml"),
    ]
    assert entries[0].t is not None
    # an unreadable file is no reason to lose them either
    (tmp_path / "layouts.json").write_text("{not json")
    again = LayoutHistory(tmp_path / "layouts.json", lambda: journal_applies(journal.iter_file()))
    assert [k.seq for k in again.entries()] == [1, 4]


def test_a_running_benchs_candidates_are_not_kept(tmp_path):
    from vsup.lease import Lease, layout_sha, my_start_ticks, write_lease

    original = {"toml": "O", "path": "/l/o.toml", "name": "o"}
    lease = Lease(
        owner="bench",
        pid=os.getpid(),  # this test is the bench: it runs
        start_ticks=my_start_ticks(),
        started_at="2026-12-06T01:00:00Z",
        original=original,
        layouts=[{"name": "c1", "sha256": layout_sha("C1")}],
    )
    write_lease(tmp_path, lease)
    assert bench_candidate(tmp_path, "C1")
    assert not bench_candidate(tmp_path, "O")  # the original, applied again at the end
    write_lease(tmp_path, dataclasses.replace(lease, pid=2**22 + 7, start_ticks=1))
    assert not bench_candidate(tmp_path, "C1")  # a bench that is gone: whoever applies it now
    clear_lease(tmp_path)
    assert not bench_candidate(tmp_path, "C1")
