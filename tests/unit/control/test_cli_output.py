"""What the control-plane commands print: the status table, progress, log chunks."""

from __future__ import annotations

import io

from vsup.commands.status import render
from vsup.control.api import read_log_chunk
from vsup.progress import Progress, describe_waiting, fmt_duration
from vsup.snapshot import (
    Advice,
    LastExit,
    NodeInfo,
    StatusSnapshot,
    SupervisorInfo,
    empty_instance,
)


def doc():
    return StatusSnapshot(
        supervisor=SupervisorInfo(pid=77, version="0.1.0", uptime_s=65, layout="pair"),
        node=NodeInfo("n", "none", 0),
        gpus=(),
        instances=(
            empty_instance(
                "cpu0",
                state="ready",
                pid=100,
                port=8000,
                restarts=0,
                uptime_s=30,
                kv_cache_usage=0.5,
                requests_running=2.0,
                requests_waiting=0.0,
                backend="CPU_ATTN",
                backend_source="default",
            ),
            empty_instance(
                "cpu1",
                state="backoff",
                port=8001,
                restarts=2,
                backoff_remaining_s=4.2,
                last_exit=LastExit(
                    1, None, "oom", "2026-01-01T00:00:00.000Z", "a\nMemoryError: no room"
                ),
            ),
        ),
        advice=(Advice("crash_loop", "warning", "cpu1: crash loop", instance="cpu1"),),
    ).to_json()


def test_status_table_shows_states_unknowns_exits_and_advice():
    text = render(doc())
    lines = text.splitlines()
    assert lines[0].startswith("vsup 0.1.0 · layout pair · 1/2 ready · daemon pid 77 up 1m05s")
    assert lines[1].split()[:3] == ["NAME", "STATE", "PID"]
    row0, row1 = lines[2].split(), lines[3].split()
    assert row0[:5] == ["cpu0", "ready", "100", "8000", "cpu"] and "50%" in row0
    assert "CPU_ATTN*" in row0  # inferred, marked
    assert row1[:3] == ["cpu1", "backoff", "4s"] and row1[-2:] == ["2", "-"]
    assert "cpu1: last exit oom (code 1)" in text and "MemoryError: no room" in text
    assert "warning: cpu1: crash loop" in text


def test_status_says_a_bench_replaced_the_layout_under_the_header_line():
    d = doc()
    assert "BENCH" not in render(d)  # bench: null
    d["bench"] = {
        "pid": 4242, "phase": "running", "layout": "two", "index": 2, "count": 3,
        "requests_done": 412, "requests_total": 1000, "elapsed_s": 72.0,
    }  # fmt: skip
    lines = render(d).splitlines()
    assert lines[1] == (
        "BENCH 2/3 two: running 412/1000 requests, 1m12s "
        "(vsup bench pid 4242 replaced the layout; it restores it at the end)"
    )
    assert lines[2].split()[:3] == ["NAME", "STATE", "PID"]
    # a tune reports through the same route: it says what it is
    d["bench"].update(tool="tune", eta_s=750.0)
    assert (
        render(d)
        .splitlines()[1]
        .startswith(
            "TUNE 2/3 two: running 412/1000 requests (~12m30s left of the whole tune), 1m12s"
        )
    )
    assert "(vsup tune pid 4242 replaced the layout" in render(d)


def test_progress_is_silent_in_a_pipe_and_live_on_a_terminal():
    pipe = io.StringIO()
    Progress(pipe).update("loading")
    assert pipe.getvalue() == ""
    tty = io.StringIO()
    p = Progress(tty, enabled=True)
    p.update("loading cpu0")
    p.clear()
    assert "loading cpu0" in tty.getvalue() and tty.getvalue().endswith("\r\x1b[K")


def test_waiting_line_names_what_is_loading_and_for_how_long():
    exit_oom = LastExit(code=1, signal=None, reason="oom", at="t", log_excerpt=None)
    line = describe_waiting(
        [
            empty_instance("a", state="ready"),
            empty_instance("b", state="starting", state_since_s=12.3),
            empty_instance("c", state="backoff", backoff_remaining_s=8, last_exit=exit_oom),
            empty_instance("d", state="starting", state_since_s=12.3, waiting_for="b starting"),
        ]
    )
    assert line == "ready 1/4 · b loading 12s · c backoff 8s (oom) · d waits (b starting)"
    assert fmt_duration(3725) == "1h02m" and fmt_duration(None) == "-"


def test_log_chunks_page_by_offset_and_tail_starts_on_a_line(tmp_path, monkeypatch):
    import vsup.control.api as api

    log = tmp_path / "run-1.log"
    log.write_bytes(b"".join(f"line {i}\n".encode() for i in range(100)))
    size = log.stat().st_size
    first = read_log_chunk(log, 0, None)
    assert first["start"] == 0 and first["offset"] == size and first["eof"]
    tail = read_log_chunk(log, None, 20)
    assert tail["text"].startswith("line ") and tail["text"].endswith("line 99\n")
    assert tail["offset"] == size
    monkeypatch.setattr(api, "MAX_LOG_CHUNK", 50)
    part = read_log_chunk(log, 0, None)
    assert not part["eof"] and part["text"].endswith("\n") and part["offset"] < 50
    again = read_log_chunk(log, part["offset"], None)
    assert again["start"] == part["offset"]
    assert read_log_chunk(tmp_path / "missing.log", 0, None)["text"] == ""


def test_an_unexpected_error_is_one_line_naming_the_traceback_file(monkeypatch, capsys, tmp_path):
    from vsup import cli

    monkeypatch.setenv("VSUP_HOME", str(tmp_path))
    monkeypatch.delenv("VSUP_DEBUG", raising=False)

    def broken(args):
        raise RuntimeError("boom\nsecond line")

    parser = cli.build_parser()
    monkeypatch.setattr(cli, "build_parser", lambda *a: parser)
    monkeypatch.setattr(
        parser, "parse_args", lambda argv: type("A", (), {"func": staticmethod(broken)})()
    )
    code = cli.main(["status"])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1
    assert err.startswith("vsup: internal error: RuntimeError: boom | second line (traceback in ")
    assert "Traceback" in (tmp_path / "cli-errors.log").read_text()


def rolling(state: str = "running", **kw) -> StatusSnapshot:
    """Two replicas in a rolling apply: a restarting (started 2m10s ago, of a 20 min start
    timeout), b waiting for its wave on its old spec; c waits for a co-tenant's start."""
    from vsup.snapshot import RolloutStatus, WaitReason

    rollout = RolloutStatus(
        state=state,
        wave=1,
        waves=2,
        done=0,
        total=2,
        current=("a",),
        pending=("b",),
        names=("a", "b"),
        old_config=("b",),
        **kw,
    )
    return StatusSnapshot(
        supervisor=SupervisorInfo(pid=77, version="0.1.0", uptime_s=65, layout="pair"),
        node=NodeInfo("n", "none", 0),
        gpus=(),
        instances=(
            empty_instance(
                "a", state="starting", pid=31, uptime_s=130.0, start_timeout_s=1200.0, port=1
            ),
            empty_instance(
                "b", state="ready", pid=32, outdated=True, outdated_fields=("args",), port=2
            ),
            empty_instance(
                "c",
                state="starting",
                port=3,
                waiting_for="a starting",
                wait=WaitReason("co_tenant", "a starting", instances=("a",)),
            ),
        ),
        rollout=rollout,
    )


def test_status_prints_the_rollout_the_start_progress_the_waits_and_the_old_spec():
    text = render(rolling().to_json())
    lines = text.splitlines()
    assert lines[1] == (
        "ROLLOUT wave 1/2: restarting a · 0/2 done · pending b (on the old config until their "
        "wave) · max_unavailable 1"
    )
    rows = {line.split()[0]: line for line in lines[3:6]}
    assert "starting 2m10s of 20m" in rows["a"]
    assert "ready (old spec)" in rows["b"]
    assert "starting (waits)" in rows["c"] and rows["c"].split()[3] == "-"  # no pid yet
    assert "c: waits for a starting (a co-tenant of its device)" in lines
    assert "b: runs an older spec than the layout (args differ); `vsup up LAYOUT` restarts " in (
        text
    )


def test_status_prints_a_failed_or_interrupted_rollout_with_what_keeps_its_old_config():
    failed = render(rolling("failed", failure="wave 1/2 failed: a is failed (oom); b keep ..."))
    assert "ROLLOUT FAILED at wave 1/2: wave 1/2 failed: a is failed (oom)" in failed
    assert "  on the old config: b" in failed.splitlines()
    cut = render(rolling("interrupted", interrupted_at="2026-12-01T04:01:00Z"))
    assert (
        "ROLLOUT INTERRUPTED at wave 1/2 (0/2 done; its daemon ended): b still run the old "
        "config - `vsup up LAYOUT` finishes it"
    ) in cut
    assert "ROLLOUT" not in render(rolling("done"))


def test_a_backoff_says_how_long_until_the_next_start():
    text = render(doc())
    assert "cpu1: backing off after a failure" not in text  # an older daemon: no wait reason
    from vsup.snapshot import WaitReason

    d = doc()
    d["instances"][1]["wait"] = {"kind": "backoff", "message": "next start in 4s (after oom)"}
    assert "cpu1: backing off after a failure, next start in 4s (after oom)" in render(d)
    assert WaitReason("backoff", "x").kind == "backoff"


def test_terminal_escapes_from_a_layout_or_a_log_are_shown_not_obeyed():
    evil = "\x1b]0;pwned\x07\x1b[2J"
    snap = StatusSnapshot(
        supervisor=SupervisorInfo(pid=1, version="0", uptime_s=1, layout=f"prod{evil}"),
        node=NodeInfo("n", "none", 0),
        gpus=(),
        instances=(
            empty_instance(
                "x",
                state="failed",
                model=f"m{evil}",
                backend=f"B{evil}",
                failed_why=f"why{evil}",
                last_exit=LastExit(1, None, "oom", "t", f"line\n\x1b[31mred{evil}"),
            ),
        ),
        advice=(Advice("failed", "critical", f"x failed{evil}", instance="x"),),
    )
    text = render(snap.to_json())
    assert "\x1b" not in text and "\x07" not in text
    assert "layout prod\\x1b]0;pwned\\x07\\x1b[2J" in text
    assert "\\x1b[31mred" in text and "critical: x failed\\x1b" in text
