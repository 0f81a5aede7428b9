"""`vsup events` in words: journal events (shapes as the engine and daemon write them) read as
a person reads them, and `--since` as a person writes it."""

from __future__ import annotations

import pytest

from vsup.commands.events import concerns, describe, parse_since, render, subject

NOW = 1_800_000_000.0


@pytest.mark.parametrize(
    ("text", "ago"),
    [("90s", 90), ("90", 90), ("30m", 1800), ("1h", 3600), ("2d", 172800), ("1.5h", 5400)],
)
def test_since_takes_durations(text, ago):
    assert parse_since(text, NOW) == NOW - ago


def test_since_takes_a_local_time_and_all():
    from datetime import datetime

    assert parse_since("2026-12-01 08:00", NOW) == datetime(2026, 12, 1, 8, 0).timestamp()
    assert parse_since("all", NOW) is None
    with pytest.raises(ValueError, match="--since 'soon'"):
        parse_since("soon", NOW)


EXIT = {
    "seq": 20, "t": "2026-12-01T20:13:55.168Z", "kind": "exit", "instance": "a", "run": 1,
    "pid": 23676, "code": None, "signal": "SIGKILL", "reason": "killed",
    "log_excerpt": "INFO ...\nKilled\n",
}  # fmt: skip


@pytest.mark.parametrize(
    ("event", "words"),
    [
        (EXIT, "exited: killed (killed by SIGKILL, run 1): Killed"),
        (
            {"kind": "exit", "instance": "a", "run": 3, "pid": 9, "code": 2, "signal": None,
             "reason": "bad_args", "log_excerpt": "error: unrecognized arguments: --x"},
            "exited: bad_args (exit code 2, run 3): error: unrecognized arguments: --x",
        ),
        (
            {"kind": "restart_scheduled", "instance": "a", "delay_s": 0.0, "failures": 1,
             "reason": "killed"},
            "restart at once after killed (failure 1)",
        ),
        (
            {"kind": "restart_scheduled", "instance": "a", "delay_s": 20.0, "failures": 3,
             "reason": "oom"},
            "restart in 20 s after oom (failure 3)",
        ),
        (
            {"kind": "failed", "instance": "a", "reason": "bad_args", "failures": 1,
             "why": "the restart policy gave up: bad_args recurs"},
            "FAILED (bad_args, 1 failure(s)): the restart policy gave up: bad_args recurs",
        ),
        (
            {"kind": "adopt", "instance": "a", "adopted": True, "pid": 5, "pgid": 5, "run": 2},
            "re-adopted run 2 (pid 5) from the last daemon",
        ),
        (
            {"kind": "drain", "instance": "a", "drained": False, "waited_s": 60.0},
            "drain timed out after 60.0 s with requests still running",
        ),
        (
            {"kind": "drain", "instance": "a", "drained": True, "waited_s": 1.4, "requests": 3},
            "drained in 1.4 s (3 in flight at its start)",
        ),
        (
            {"kind": "sweep", "instance": "a", "run": 1, "pids": [7, 8], "kill": True},
            "ended what was left of run 1 with SIGKILL: pids 7, 8",
        ),
        (
            {"kind": "stop", "instance": "a", "run": 1, "pid": 5, "term": True, "kill": True,
             "waited_s": 30.2},
            "stop: SIGKILL after the grace (30.2 s in all): it did not end on SIGTERM",
        ),
        (
            {"kind": "action", "action": "apply", "layout": "demo", "path": "/l.toml",
             "plan": {"start": ["a"], "restart": ["b"], "stop": [], "router": "unchanged"}},
            "operator: apply layout demo (/l.toml): start a; restart b",
        ),
        (
            {"kind": "rollout", "state": "failed", "wave": 1, "waves": 2, "done": 0, "total": 2,
             "failure": "wave 1/2 failed: a is failed"},
            "rollout failed: wave 1/2, 0/2 done: wave 1/2 failed: a is failed",
        ),
        (
            {"kind": "daemon_stop", "pid": 7, "left_running": ["a", "b"]},
            "vsup daemon stopped (pid 7); left running: a, b",
        ),
    ],
)  # fmt: skip
def test_events_in_words(event, words):
    assert describe(event) == words


def test_transitions_and_echoes_of_an_operators_action_stay_out_of_the_text():
    assert describe({"kind": "state", "instance": "a", "from": "ready", "to": "stopping"}) is None
    echo = {"kind": "action", "instance": "a", "action": "restart", "drain": False}
    assert describe(echo) is None
    automatic = {"kind": "action", "instance": "a", "action": "start", "automatic": True}
    assert "started again by vsup" in (describe(automatic) or "")


def test_router_events_are_the_routers_and_name_their_workers():
    ev = {"kind": "router_workers", "router": 8080, "add": ["http://127.0.0.1:8101"],
          "remove": [], "why": None}  # fmt: skip
    assert subject(ev) == "@router"
    assert describe(ev, {"http://127.0.0.1:8101": "cpu0"}) == "workers: added cpu0"
    assert concerns(ev, "@router") and not concerns(ev, "cpu0")


def test_a_line_has_local_time_whose_and_what(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    import time

    time.tzset()
    try:
        assert render(EXIT, 8).startswith("2026-12-01 20:13:55  a         exited: killed")
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


def test_an_operators_action_concerns_the_instances_it_names():
    ev = {"kind": "action", "action": "restart", "names": ["b"], "by": "operator"}
    assert subject(ev) == "vsup" and concerns(ev, "b") and not concerns(ev, "a")
    assert describe(ev) == "operator: restart b"
