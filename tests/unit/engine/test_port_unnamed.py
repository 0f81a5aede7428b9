"""A port held by a process that cannot be named yet (a server killed a moment ago whose
processes the kernel is still tearing down: seen when a span's head was SIGKILLed and its
restart began 0.3 s later) is waited for, not refused at once as `port_in_use` (which fails
fast: the head would stay `failed` and its unit down)."""

from __future__ import annotations

import pytest

from vsup.engine import spawn
from vsup.states import ExitReason

from tests.factories import instance_spec


def holders(monkeypatch: pytest.MonkeyPatch, answers: list[str | None]) -> list[str | None]:
    asked: list[str | None] = []

    def holder(host: str, port: int) -> str | None:
        asked.append(answers[min(len(asked), len(answers) - 1)])
        return asked[-1]

    monkeypatch.setattr(spawn, "port_holder", holder)
    monkeypatch.setattr(spawn, "TIME_WAIT_POLL_S", 0.01)
    return asked


def test_a_holder_that_goes_away_within_the_wait_lets_the_start_go_on(monkeypatch):
    asked = holders(monkeypatch, [spawn.UNNAMED, spawn.UNNAMED, None])
    assert spawn._port_busy(instance_spec("a")) is None
    assert asked == [spawn.UNNAMED, spawn.UNNAMED, None]


def test_a_holder_that_stays_is_refused_after_the_wait(monkeypatch):
    asked = holders(monkeypatch, [spawn.UNNAMED])
    monkeypatch.setattr(spawn, "UNNAMED_WAIT_S", 0.05)
    refused = spawn._port_busy(instance_spec("a"))
    assert refused is not None and refused.reason == ExitReason.PORT_IN_USE
    assert "in use by another process" in refused.excerpt and len(asked) > 1


def test_a_named_listener_is_refused_at_once(monkeypatch):
    asked = holders(monkeypatch, ["pid 42 (nginx)"])
    refused = spawn._port_busy(instance_spec("a"))
    assert refused is not None and "pid 42 (nginx)" in refused.excerpt
    assert len(asked) == 1
