"""What vsup says in words (issue 35, items 6, 11, 15, 16, 17), on the shapes the journal, the
daemon and a log really hold: pull events, a start refused before any process, a stall seen at
the API server, `vsup fleet events` in `vsup events`' words and local time, terminal control
characters from a log or a name, the start-timeout advice, a wake in a swap group, and the
command the dashboard's detach message names. The same through the real CLI and daemon:
tests/integration/control/test_words_cli.py, tests/tui/test_detach_message.py."""

from __future__ import annotations

import re

import pytest

from vsup import paths
from vsup.answers import SleepResult, decode
from vsup.commands import fleet, sleep
from vsup.commands.events import concerns, describe, render, subject
from vsup.control.advice import AdviceInputs, compute_advice
from vsup.logtext import TerminalLines, collapse
from vsup.snapshot import LastExit, empty_instance

CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
PULL = {"model": "org/tiny", "revision": "main", "instances": ["a", "b"]}


@pytest.mark.parametrize(
    ("event", "words"),
    [
        (
            {"kind": "pull_start", **PULL, "commit": "0123456789abcdef0123", "cache_dir": "/c",
             "files": 5, "bytes_total": 3 * 2**30, "bytes_to_fetch": 2 * 2**30},
            "pull of org/tiny for a, b started: 5 file(s), 2.0 GiB to fetch of 3.0 GiB "
            "(commit 0123456789ab)",
        ),
        (
            {"kind": "pull_progress", **PULL, "bytes_done": 2**30, "bytes_total": 4 * 2**30,
             "rate_bps": 85 * 2**20},
            "pull of org/tiny for a, b: 1.0 GiB/4.0 GiB (25%), 85.0 MiB/s",
        ),
        (
            {"kind": "pull_done", **PULL, "commit": "0123", "snapshot": "/c/snapshots/0123",
             "fetched_bytes": 3 * 2**30, "elapsed_s": 185.0},
            "pulled org/tiny for a, b: 3.0 GiB fetched in 3m05s, snapshot /c/snapshots/0123",
        ),
        (
            {"kind": "pull_failed", **PULL, "revision": "v2", "reason": "unauthorized",
             "message": "the hub refused the token"},
            "pull of org/tiny@v2 for a, b FAILED (unauthorized): the hub refused the token",
        ),
    ],
)  # fmt: skip
def test_pull_events_read_in_words_not_json(event, words):
    assert describe(event) == words
    assert subject(event) == "vsup"
    # `--instance a` shows the pulls of a's model
    assert concerns(event, "a") and not concerns(event, "c")


def test_a_start_refused_before_any_process_has_no_run_to_name():
    # the engine's event for port_in_use: no process, so no pid and no run
    ev = {"kind": "exit", "instance": "a", "run": None, "pid": None, "code": None,
          "signal": None, "reason": "port_in_use",
          "log_excerpt": "port 8000 on 127.0.0.1 is in use by pid 4242 (nginx)"}  # fmt: skip
    words = describe(ev)
    assert words == (
        "exited: port_in_use (no process was started): port 8000 on 127.0.0.1 is in use by pid "
        "4242 (nginx)"
    )
    stopped = {"kind": "exit", "instance": "a", "run": None, "pid": None, "reason": "stopped"}
    assert describe(stopped) == "stopped (no process was started)"


def test_a_stall_seen_at_the_api_server_says_the_requests_held_there():
    # as control/stalls.py journals a freeze that began while idle (test_stall_vllm.py, real
    # vLLM): the engine's gauges frozen at 0, the 3 requests only /load counts
    ev = {"kind": "stalled", "instance": "a", "run": 1, "requests_running": 0.0,
          "requests_waiting": 0.0, "requests_in_flight": 3, "evidence": "server", "ranks": [],
          "stalled_for_s": 6.4, "stall_after_s": 5, "on_stall": False}  # fmt: skip
    assert describe(ev) == (
        "STALLED: 3 requests in flight at the API server and none at the engine, no token for 6.4 s"
    )
    engine = {**ev, "evidence": "engine", "requests_running": 3.0, "requests_waiting": 5.0}
    assert describe(engine).startswith("STALLED: 3 running, 5 waiting, no token for 6.4 s")
    rank = {**ev, "evidence": "canary", "ranks": [1], "on_stall": True}
    assert describe(rank) == (
        "STALLED: data-parallel rank 1: a canary request (max_tokens 1) unanswered, no token for "
        "6.4 s; restart.on_stall restarts it"
    )


def test_control_characters_from_a_log_or_a_name_are_shown_not_sent():
    ev = {"kind": "exit", "t": "2026-12-01T20:13:55.168Z", "instance": "a", "run": 1,
          "pid": 9, "code": 3, "signal": None, "reason": "unknown",
          "log_excerpt": "RuntimeError: \x1b]0;pwned\x07 \x1b[2J boom\x07"}  # fmt: skip
    line = render(ev, 4)
    assert line is not None and not CONTROL.search(line), line
    assert "RuntimeError: \\x1b]0;pwned\\x07 \\x1b[2J boom\\x07" in line
    apply = {"kind": "action", "t": "2026-12-01T20:13:55Z", "action": "apply",
             "layout": "x\x1b[2J\u202e", "plan": {}}  # fmt: skip
    assert "apply layout x\\x1b[2J\\u202e: nothing to change" in (render(apply, 4) or "")


def test_fleet_events_read_as_vsup_events_in_local_time_with_the_node():
    ev = {"kind": "ready", "t": "2026-12-01T20:13:55.168Z", "instance": "a", "run": 1,
          "pid": 4242, "startup_s": 31.2, "node": "gpu01"}  # fmt: skip
    line = fleet.event_line(ev, 6)
    mine = render(ev, fleet.WHO_WIDTH)
    assert line is not None and mine is not None
    when, words = mine[:19], mine[19:]
    # the same local time and words as `vsup events`, the node between them
    assert line == f"{when}  gpu01 {words}"
    assert line.endswith("a           ready after 31.2 s (run 1, pid 4242)")
    assert "T20:13:55" not in line and "startup_s=" not in line
    # what `vsup events` leaves out, the fleet leaves out too
    state = {"kind": "state", "t": ev["t"], "instance": "a", "from": "starting", "to": "ready"}
    assert fleet.event_line({**state, "node": "gpu01"}, 6) is None
    # and a node's name is shown, not sent
    odd = fleet.event_line({**ev, "node": "n\x1b[2J"}, 6)
    assert odd is not None and "n\\x1b[2J" in odd and not CONTROL.search(odd)


def test_a_log_shows_a_bell_as_an_escape_and_drops_a_window_title():
    lines = TerminalLines()
    out = lines.feed("\x1b]0;pwned\x07title\n\x1b[31mred\x1b[0m \x07bell\x08\n") + lines.flush()
    assert out == ["title", "red \\x07bell\\x08"]
    # a window title ended by ESC \ (ST) goes too; tabs stay
    assert collapse("\x1b]2;t\x1b\\a\tb\x07\n") == "a\tb\\x07\n"
    # the fast path (nothing to redraw) is made safe as well
    assert collapse("plain \x07\n") == "plain \\x07\n"


def test_a_start_that_timed_out_is_advice_until_the_instance_serves():
    timed_out = LastExit(None, "SIGTERM", "startup_timeout", "2026-12-01T20:13:55Z", None)
    for state in ("starting", "backoff", "failed"):
        inst = empty_instance("cpu1", state=state, last_exit=timed_out, start_timeout_s=240.0)
        advice = [a for a in compute_advice([inst], [], AdviceInputs({})) if a.instance]
        timeout = [a for a in advice if a.kind == "start_timeout"]
        assert len(timeout) == 1, (state, advice)
        text = timeout[0].message
        assert timeout[0].severity == "warning"
        assert "cpu1: its last start timed out (not ready 240 s after it began" in text
        assert "raise start_timeout_s for cpu1" in text and "busy node" in text
        assert ("--previous" in text) == (state == "starting")  # the timed-out run's log
    ready = empty_instance("cpu1", state="ready", last_exit=timed_out, start_timeout_s=240.0)
    assert not [a for a in compute_advice([ready], [], AdviceInputs({}))]


def test_a_wake_in_a_swap_group_says_who_went_to_sleep_first():
    answer = {"instance": "s2", "took_s": 0.8,
              "group_slept": [{"instance": "s1", "level": 1, "took_s": 1.2, "held_bytes": None}]}  # fmt: skip
    assert sleep.describe("wake", decode(SleepResult, answer, "test")) == (
        "s1: asleep (level 1) in 1.2 s (its swap group's other member)\ns2: awake in 0.8 s"
    )
    assert sleep.describe("wake", SleepResult(instance="s2", took_s=0.8)) == "s2: awake in 0.8 s"


def test_the_attach_command_names_a_home_a_plain_vsup_would_not_find(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.delenv("VSUP_HOME", raising=False)
    assert paths.attach_command() == paths.vsup_program()
    demo = tmp_path / "demo home"
    monkeypatch.setenv("VSUP_HOME", str(demo))
    assert paths.attach_command() == f"VSUP_HOME='{demo}' {paths.vsup_program()}"
    # VSUP_HOME naming the default home: the plain command finds it
    monkeypatch.setenv("VSUP_HOME", str(tmp_path / "state" / "vsup"))
    assert paths.attach_command() == paths.vsup_program()


def test_router_incidents_say_who_changed_the_workers_in_words():
    removed = {"kind": "router_worker_removed", "router": 8000, "url": "http://127.0.0.1:8101",
               "first_seen": "2026-12-05T12:00:00.000Z", "users": ["intruder (uid 1001)"],
               "restores": 3}  # fmt: skip
    words = describe(removed, {"http://127.0.0.1:8101": "gpu1"})
    assert words == (
        "SOMEONE ELSE removed worker gpu1; put it back (restore 3, local users connected to its "
        "port: intruder (uid 1001))"
    )
    foreign = {"kind": "router_foreign_worker", "router": 8000, "url": "http://127.0.0.1:9999",
               "first_seen": "2026-12-05T12:00:00.000Z", "users": [], "removals": 1}  # fmt: skip
    assert describe(foreign) == (
        "SOMEONE ELSE added worker http://127.0.0.1:9999; removed it (removal 1, local users "
        "connected to its port: none seen)"
    )
