"""The event journal: sequence numbers across restarts, torn lines, replay."""

from __future__ import annotations

import json

from vsup.control.journal import Journal, replay
from vsup.journalevents import JournalEvent, decode


def typed(kind: str, instance: str | None = None, **fields: object) -> JournalEvent:
    """The event of `kind` with these journal fields (as the daemon's emit sites build it)."""
    return decode({"kind": kind, "instance": instance, **fields})


def test_events_get_increasing_seq_that_continue_after_reopen(tmp_path):
    path = tmp_path / "journal.jsonl"
    j = Journal(path)
    a = j.append(typed("spawn", "a", pid=10))
    b = j.append(typed("ready", "a"))
    j.close()
    j2 = Journal(path)
    c = j2.append(typed("exit", "a", reason="oom"))
    assert [a.seq, b.seq, c.seq] == [1, 2, 3]
    events, nxt = j2.read(since=2)
    assert [e["kind"] for e in events] == ["ready", "exit"] and nxt == 4
    assert j2.read(since=nxt) == ([], 4)


def test_a_torn_last_line_is_skipped_and_the_next_event_starts_a_new_line(tmp_path):
    path = tmp_path / "journal.jsonl"
    j = Journal(path)
    j.append(typed("spawn", "a", pid=10))
    j.close()
    with open(path, "ab") as fh:
        fh.write(b'{"seq": 2, "kind": "ex')  # the daemon died mid-write
    j2 = Journal(path)
    assert j2.skipped_lines == 1
    ev = j2.append(typed("adopt", "a", pid=10))
    assert ev.seq == 2
    lines = path.read_text().splitlines()
    assert json.loads(lines[-1])["kind"] == "adopt"
    assert [e["kind"] for e in j2.iter_file()] == ["spawn", "adopt"]


def test_read_falls_back_to_the_file_for_old_events(tmp_path, monkeypatch):
    import vsup.control.journal as journal

    monkeypatch.setattr(journal, "MEMORY_EVENTS", 3)
    j = Journal(tmp_path / "journal.jsonl")
    for i in range(10):
        j.append(typed("action", None, n=i))
    events, nxt = j.read(since=2, limit=4)
    assert [e["n"] for e in events] == [1, 2, 3, 4] and nxt == 6


def test_replay_gives_the_last_process_of_each_instance(tmp_path):
    j = Journal(tmp_path / "journal.jsonl")
    j.append(typed("spawn", "a", pid=10, pgid=10, create_time=1.0, port=8000, run=1))
    j.append(typed("ready", "a"))
    j.append(typed("exit", "a", code=None, signal="SIGKILL", reason="killed", restarts=1))
    j.append(typed("spawn", "a", pid=11, pgid=11, create_time=2.0, port=8000, run=2, restarts=1))
    j.append(typed("spawn", "b", pid=20, pgid=20, create_time=3.0, port=8001, run=1))
    j.append(typed("exit", "b", code=0, signal=None, reason="stopped"))
    got = replay(j.iter_file())
    assert got["a"].running and got["a"].pid == 11 and got["a"].run == 2
    assert got["a"].restarts == 1
    assert got["b"].last_exit is not None
    assert not got["b"].running and got["b"].last_exit["reason"] == "stopped"
    # Only what happened after a given event counts (the state file covers the rest).
    later = replay(j.iter_file(), after_seq=4)
    assert set(later) == {"b"}


def test_a_refused_write_is_kept_retried_and_never_runs_into_the_next_record(tmp_path, monkeypatch):
    import errno
    import os as real_os

    import vsup.control.journal as journal

    path = tmp_path / "journal.jsonl"
    j = Journal(path)
    j.append(typed("spawn", "a", pid=1))
    real_write = real_os.write
    calls = {"n": 0}

    def full_disk(fd, data):
        calls["n"] += 1
        if calls["n"] == 1:
            return real_write(fd, data[: len(data) // 2])  # a short write, then ENOSPC
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(journal.os, "write", full_disk)
    j.append(typed("exit", "a", reason="killed"))  # never raises
    j.append(typed("spawn", "a", pid=2))
    assert j.write_error is not None
    assert j.pending == 2 and "No space left" in j.write_error
    assert [e["kind"] for e in j.read(since=1)[0]] == ["spawn", "exit", "spawn"]
    monkeypatch.setattr(journal.os, "write", real_write)
    assert j.flush_pending() and j.write_error is None
    j.append(typed("ready", "a"))
    kinds = [(e["seq"], e["kind"]) for e in j.iter_file()]
    # The torn half of the first try sits on a line of its own; every record is whole.
    assert kinds == [(1, "spawn"), (2, "exit"), (3, "spawn"), (4, "ready")]


def test_a_reader_resyncs_on_a_record_an_old_torn_write_ran_into(tmp_path):
    path = tmp_path / "journal.jsonl"
    path.write_bytes(
        b'{"seq":1,"kind":"spawn","instance":"a"}\n{"seq":2,"kind":"ex'
        b'{"seq":3,"kind":"ready","instance":"a"}\n'
    )
    j = Journal(path)
    assert [e["seq"] for e in j.iter_file()] == [1, 3] and j.next_seq == 4
