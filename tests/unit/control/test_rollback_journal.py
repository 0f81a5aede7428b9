"""A rollback's apply says so in the journal (docs/canary.md, "Rollback"): `vsup rollback` sends
the kept layout's seq with the apply (`rollback_of`), the daemon journals it on the apply's
`action` event with the time that layout was applied, and `vsup events` words it. Old journal
lines (no such key) still read and say what they said; an older daemon that refuses the key
still gets the layout applied."""

from __future__ import annotations

import pytest

from vsup.answers import ApplyAnswer
from vsup.answers import decode as decode_answer
from vsup.commands import up
from vsup.control.errors import ControlError
from vsup.journalevents import ActionEvent, decode

pytestmark = pytest.mark.timeout(60)

PLAN = {"start": [], "restart": [], "rolling": ["a", "b"], "stop": [], "unchanged": []}


def test_a_rollback_apply_round_trips_and_says_which_kept_layout_it_goes_back_to():
    doc = {
        "seq": 12,
        "t": "2026-12-06T01:00:00.000Z",
        "kind": "action",
        "action": "apply",
        "layout": "prod",
        "path": "/etc/vsup/prod.toml",
        "plan": PLAN,
        "toml": "[layout]\n",
        "rollback_of": 3,
        "rollback_t": "2026-12-05T14:02:03.123Z",
    }
    ev = decode(doc)
    assert isinstance(ev, ActionEvent)
    assert ev.rollback_of == 3 and ev.rollback_t == "2026-12-05T14:02:03.123Z"
    assert ev.to_json() == doc and list(ev.to_json()) == list(doc)
    words = ev.describe()
    assert words is not None
    assert words.startswith(
        "operator: rollback to layout #3 (applied 2026-12-05 14:02): "
        "apply layout prod (/etc/vsup/prod.toml): "
    ), words
    # a kept layout no longer kept: the seq alone
    bare = decode({k: v for k, v in doc.items() if k != "rollback_t"}).describe()
    assert bare is not None and bare.startswith("operator: rollback to layout #3: apply"), bare


def test_a_plain_apply_and_an_old_line_are_written_and_said_as_before():
    old = {
        "seq": 4,
        "t": "2026-12-05T14:02:03.123Z",
        "kind": "action",
        "action": "apply",
        "layout": "prod",
        "plan": PLAN,
        "toml": "[layout]\n",
    }
    ev = decode(old)
    assert isinstance(ev, ActionEvent) and ev.rollback_of is None
    assert ev.to_json() == old  # no rollback key written
    words = ev.describe()
    assert words is not None and words.startswith("operator: apply layout prod: ")
    assert "rollback" not in words


def named(name: str) -> str:
    return f'[layout]\nname = "{name}"\nempty = true\n'


async def test_the_daemon_journals_the_kept_layout_a_rollback_applies(daemons):
    _, client = await daemons.start()
    await client.apply(named("a"), "/l/a.toml")
    await client.apply(named("b"), "/l/b.toml")
    kept = {k["name"]: k for k in (await client.layouts())["layouts"]}
    back = await client.apply(named("a"), "/l/a.toml", rollback_of=kept["a"]["seq"])
    assert back["applied"], back
    applies = [
        e
        for e in (await client.events())["events"]
        if e["kind"] == "action" and e.get("action") == "apply"
    ]
    assert [e.get("rollback_of") for e in applies] == [None, None, kept["a"]["seq"]]
    assert applies[-1]["rollback_t"] == kept["a"]["t"]
    words = decode(applies[-1]).describe()
    assert words is not None and f"rollback to layout #{kept['a']['seq']} (applied " in words

    # a seq no longer kept is journaled as it came; a bad one is refused, nothing applied
    await client.apply(named("b"), "/l/b.toml", rollback_of=999)
    last = (await client.events())["events"][-1]
    assert last.get("rollback_of") == 999 and "rollback_t" not in last
    for bad in (-1, "3", True):
        with pytest.raises(ControlError) as refused:
            await client._call(
                "POST", "/v1/apply", json={"toml": named("a"), "path": None, "rollback_of": bad}
            )
        assert refused.value.status == 400 and "'rollback_of'" in str(refused.value)
    assert (await client.layouts())["running"] == named("b")


class OlderDaemon:
    """A daemon from before `rollback_of`: refuses the key as `_body` does, applies without."""

    def __init__(self) -> None:
        self.applies: list[dict] = []

    def apply(self, toml, path=None, dry_run=False, all_at_once=False, pull=True, **kw):
        if kw:
            raise ControlError(f"unknown key {', '.join(map(repr, kw))}; allowed: ...", 400)
        self.applies.append({"toml": toml, "dry_run": dry_run})
        doc = {"plan": {"unchanged": ["a"]}, "errors": [], "warnings": [], "applied": True}
        return decode_answer(ApplyAnswer, doc, "POST /v1/apply")


def test_an_older_daemon_that_refuses_the_key_still_gets_the_rollback_applied():
    daemon = OlderDaemon()
    answer = up._apply(daemon, named("a"), "/l/a.toml", False, True, rollback_of=3)  # type: ignore[arg-type]  # a stand-in for the socket's client
    assert answer.applied and daemon.applies == [{"toml": named("a"), "dry_run": False}]
