"""The journal's typed events (vsup.journalevents): one type per kind, written and read through
those types, the JSON line unchanged, old and newer journals still read, each event says itself."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from vsup import journalevents as je
from vsup.control.journal import Journal, parse_line
from vsup.journalevents import (
    KINDS,
    ActionEvent,
    EventPage,
    ExitEvent,
    JournalEvent,
    SpawnEvent,
    StateEvent,
    UnknownEvent,
    decode,
)

from tests.importgraph import PACKAGE


def sample(kind: str) -> dict:
    """A journal object of `kind` with every field its type declares, each a distinct value of
    the field's declared type."""
    doc: dict = {"seq": 7, "t": "2026-12-01T20:13:55.123Z", "kind": kind, "instance": "a"}
    for i, f in enumerate(je.own_fields(KINDS[kind]), start=1):
        hint = str(f.type)
        value: object = f"v{i}"
        for word, typed in (("list", [f"v{i}"]), ("dict", {"k": i}), ("bool", True)):
            if hint.startswith(word) or f" {word}" in hint:
                value = typed
                break
        else:
            if hint.startswith(("int", "float")):
                value = i
        doc[f.metadata.get("key", f.name)] = value
    return doc


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_each_kind_round_trips_key_for_key(kind):
    doc = sample(kind)
    ev = decode(doc)
    assert type(ev) is KINDS[kind] and ev.kind == kind and ev.extra == {}
    assert ev.to_json() == doc and list(ev.to_json()) == list(doc)  # same keys, same order
    assert decode(ev.to_json()) == ev
    # a key this vsup does not declare rides along in `extra` and is written back
    newer = doc | {"from_a_newer_vsup": [1, 2]}
    assert decode(newer).to_json() == newer


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_each_kind_says_itself_in_its_own_words(kind):
    """Every kind has its own words (`vsup events`' text moved onto the type), never the
    generic `kind {json}` fallback that an unknown kind gets."""
    cls = KINDS[kind]
    assert cls.words is not JournalEvent.words, f"{cls.__name__} has no words of its own"
    words = decode(sample(kind)).describe()
    assert words is None or (isinstance(words, str) and words and not words.startswith("{"))


def test_an_optional_field_left_none_is_not_written_a_required_one_is():
    ev = ExitEvent(run=1, pid=None, code=None, signal="SIGKILL", reason="killed", log_excerpt="")
    doc = ev.to_json()
    assert doc["pid"] is None and doc["code"] is None and "rank" not in doc
    assert ExitEvent(**{**dataclasses.asdict(ev), "extra": {}, "rank": 1}).to_json()["rank"] == 1


def test_the_journal_writes_the_line_byte_for_byte_as_before(tmp_path):
    """What this vsup's journal held before the types, for the same emit: the same bytes."""
    j = Journal(tmp_path / "journal.jsonl", clock_wall=lambda: 1764620035.25)
    j.append(SpawnEvent(instance="a", run=1, pid=10, pgid=10, create_time=1.5, log="/l/a.1"))
    j.append(StateEvent(instance="a", from_="starting", to="ready"))
    j.append(ExitEvent(instance="a", run=1, pid=10, code=None, signal="SIGKILL", reason="killed",
                       log_excerpt=None))  # fmt: skip
    j.append(ActionEvent(action="shutdown", stop_instances=False))
    j.close()
    t = '"t":"2025-12-01T20:13:55.250Z"'
    assert (tmp_path / "journal.jsonl").read_text().splitlines() == [
        '{"seq":1,' + t + ',"kind":"spawn","instance":"a","run":1,"pid":10,"pgid":10,'
        '"create_time":1.5,"log":"/l/a.1"}',
        '{"seq":2,' + t + ',"kind":"state","instance":"a","from":"starting","to":"ready"}',
        '{"seq":3,' + t + ',"kind":"exit","instance":"a","run":1,"pid":10,"code":null,'
        '"signal":"SIGKILL","reason":"killed","log_excerpt":null}',
        '{"seq":4,' + t + ',"kind":"action","action":"shutdown","stop_instances":false}',
    ]


OLD_LINES = [  # lines as vsup wrote them before the journal was typed (and an older vsup's)
    b'{"seq":3,"t":"2026-12-01T08:00:00.000Z","kind":"spawn","instance":"a","run":2,"pid":41,'
    b'"pgid":41,"create_time":1.0,"log":"/x","port":8000,"restarts":1,"spec":{"name":"a"}}',
    b'{"seq":4,"t":"2026-12-01T08:00:01.000Z","kind":"exit","instance":"a","run":2,"pid":41,'
    b'"code":1,"signal":null,"reason":"crash","log_excerpt":"boom\\nValueError: bad"}',
    b'{"seq":5,"t":"2026-12-01T08:00:02.000Z","kind":"vanished","instance":"a","pid":41}',
    b'{"seq":6,"t":"2026-12-01T08:00:03.000Z","kind":"router_workers","router":9000,'
    b'"add":["http://127.0.0.1:8000"],"remove":[]}',
]


def test_an_old_journal_line_still_reads_and_says_what_it_said():
    docs = [parse_line(raw) for raw in OLD_LINES]
    assert all(d is not None for d in docs)
    events = [decode(d) for d in docs if d is not None]
    assert [e.to_json() for e in events] == docs  # served by /v1/events exactly as stored
    spawn, exit_, vanished, workers = events
    assert isinstance(spawn, SpawnEvent) and spawn.spec == {"name": "a"} and spawn.port == 8000
    assert exit_.describe() == "exited: crash (exit code 1, run 2): ValueError: bad"
    assert isinstance(vanished, UnknownEvent) and vanished.kind == "vanished"
    assert vanished.describe() == 'vanished {"pid": 41}'
    assert workers.router == 9000 and workers.instance is None
    assert workers.describe({"http://127.0.0.1:8000": "a"}) == "workers: added a"


def test_a_line_lacking_fields_or_with_a_garbled_envelope_is_written_back_as_it_was():
    """`vsup events --json` and /v1/events give back what the journal holds: a field an
    older or edited line lacks stays absent (not null), a garbled envelope value stays."""
    for doc in (
        {"seq": 2, "t": "2026-12-01T08:00:00Z", "kind": "ready", "instance": "a"},
        {"seq": 3, "kind": "exit", "instance": 7, "reason": "oom"},
        {"t": 5, "kind": "state", "from": "ready"},
    ):
        ev = decode(doc)
        assert ev.to_json() == doc and list(ev.to_json()) == list(doc)
    assert (
        decode({"kind": "ready", "instance": "a"}).describe()
        == "ready after ? s (run None, pid None)"
    )


def test_a_kind_from_a_newer_daemon_decodes_to_a_generic_event_that_says_its_fields():
    doc = {"seq": 9, "t": "2027-01-01T00:00:00Z", "kind": "warp_drive", "instance": "a", "x": 1}
    ev = decode(doc)
    assert isinstance(ev, UnknownEvent) and ev.kind == "warp_drive" and ev.instance == "a"
    assert ev.to_json() == doc
    assert ev.describe() == 'warp_drive {"x": 1}'
    assert decode({"seq": 1}).to_json() == {"seq": 1}  # no kind: still nothing invented


def test_words_are_safe_for_a_terminal():
    ev = decode({"kind": "error", "instance": "a", "message": "bad \x1b[2J\x07 thing"})
    words = ev.describe()
    assert words is not None
    assert "\x1b" not in words and "\x07" not in words and "\\x1b[2J" in words


def test_a_page_of_events_decodes_typed():
    page = EventPage.from_json({"events": [parse_line(OLD_LINES[0]), "junk"], "next": 4})
    assert page.next == 4 and [type(e) for e in page.events] == [SpawnEvent]
    assert EventPage.from_json(page.to_json()) == page


# -- every emit site writes a type -----------------------------------------------------------

# calls that hand an event to the journal: engine `emit(inst, event)` / the router's
# `emit(event)`, `journal.append(event)`, and the journal callables of Pulls and StallActions
_SINKS = ("emit", "append", "journal", "_journal")


def _emit_calls(tree: ast.AST):
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = ast.unparse(node.func)
        name = func.rsplit(".", 1)[-1]
        if (
            name in ("emit",)
            or func.endswith("journal.append")
            or func
            in (
                "self.journal",
                "self._journal",
            )
        ):
            yield node


def test_every_event_the_daemon_writes_is_built_from_its_type():
    """Scan the installed package: every emit / journal call passes one of the event types
    (`SpawnEvent(...)`, `RolloutEvent.of(...)`), never a kind written as a string."""
    names = {c.__name__ for c in KINDS.values()}
    found, bad = set(), []
    for path in sorted(Path(PACKAGE).rglob("*.py")):
        if path.name == "journalevents.py" or "/pull/" in str(path):
            continue  # the pull worker's own `_emit` speaks to the daemon, not the journal
        tree = ast.parse(path.read_text())
        for call in _emit_calls(tree):
            if not call.args:
                continue
            arg = call.args[-1]
            ctor = arg.func if isinstance(arg, ast.Call) else None
            if isinstance(ctor, ast.Attribute) and ctor.attr == "of":
                ctor = ctor.value  # RolloutEvent.of(...)
            if isinstance(ctor, ast.Subscript):  # told_by[kind].of(...): a table of types
                found.add("<table>")
                continue
            label = ast.unparse(ctor) if ctor is not None else ""
            where = f"{path.relative_to(PACKAGE)}:{call.lineno}"
            if label in names:
                found.add(label)
            elif any(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in call.args):
                bad.append(f"{where}: {ast.unparse(call)[:80]}")
    assert not bad, "events written without their type:\n" + "\n".join(bad)
    # the scan saw the engine's and the daemon's events (not a scan of nothing)
    assert {"SpawnEvent", "ExitEvent", "StateEvent", "DaemonStartEvent", "StalledEvent"} <= found
