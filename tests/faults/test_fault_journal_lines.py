"""A journal with lines whose `seq` is not a number (edited by hand, written by something else)
still serves `/v1/events`: such lines are skipped, a number written as a string is read."""

from __future__ import annotations

import json

import pytest

from tests.faults.helpers import vsup

pytestmark = pytest.mark.timeout(120)


def test_events_are_served_past_lines_with_a_bad_seq(fault_home):
    home = fault_home
    lines = [
        {"seq": 1, "t": "2026-01-01T00:00:00Z", "kind": "daemon_start", "pid": 1},
        {"seq": "x", "t": "2026-01-01T00:00:01Z", "kind": "junk"},
        {"seq": None, "kind": "junk"},
        {"seq": True, "kind": "junk"},
        {"seq": 2.5, "kind": "junk"},
        {"kind": "junk"},
        [1, 2, 3],
        {"seq": "7", "t": "2026-01-01T00:00:02Z", "kind": "daemon_stop", "pid": 1},
    ]
    (home / "journal.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))

    assert vsup(home, "daemon", "--detach").returncode == 0
    from vsup.control.client import Client

    with Client(home) as client:
        for since in (0, 1, 2, 7, 8):
            doc = client.events(since)
            seqs = [e["seq"] for e in doc.to_json()["events"]]
            assert all(isinstance(s, int) for s in seqs), seqs
            assert seqs == sorted(seqs) and all(s >= since for s in seqs), (since, seqs)
        everything = [e["seq"] for e in client.events(0).to_json()["events"]]
        kinds = [e["kind"] for e in client.events(0).to_json()["events"]]
    assert everything[:2] == [1, 7] and "junk" not in kinds
    # the daemon's own events continue after the highest seq on disk
    assert everything[2] == 8 and kinds[2] == "daemon_start"
