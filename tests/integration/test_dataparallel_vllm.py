"""A data-parallel instance with real vLLM (CPU build, `--data-parallel-size 2`) under vsup,
through the real CLI: its status (shape, one entry per rank with its EngineCore_DP process),
what vsup does when one rank hangs next to a working one (SIGSTOP of `VLLM::EngineCore_DP1`:
under load, and while idle then requests; flagged `stalled` with the rank named; with
`restart.on_stall` the exit names the rank), and when one rank's EngineCore dies (the instance
ends as one, the exit names the rank, it restarts as a unit); the second failure (the stall
restart of the new run, `max_failures = 2`) trips the breaker, and `failed_why` names the rank.

One vLLM server at a time (two ranks: about 6 GiB here); every process it started is killed by
process group at the end, every stopped rank gets SIGCONT first.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from functools import partial
from pathlib import Path

import httpx
import psutil
import pytest

from tests.conftest import daemon_status, free_port, run_vsup

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(2400)]
# each rank's model worker inside its EngineCore_DP process (tests/conftest.py, vllm_env), as
# on GPUs at TP1: the ranks this module freezes and kills are those processes either way, and
# each of its two DP2 starts imports torch and vLLM twice less
VLLM_ONE_PROCESS = True


vsup = partial(run_vsup, timeout=1200)


def status(home: Path) -> dict:
    """The instance's entry of the status document, in this process (`daemon_status`): polled
    every half second, taken from the very start being waited for (`vsup status`'s table is
    read below)."""
    return daemon_status(home)["instances"][0]


def events(home: Path) -> list[dict]:
    return [json.loads(x) for x in (home / "journal.jsonl").read_text().splitlines()]


def wait_for(what: str, check, timeout: float, show=None):
    """`check()` until it returns something true, for at most `timeout` s; on a timeout the
    message has what `show()` sees then (the instance's stall keys and the journal's stall
    events by default), so a failure reads from CI output alone."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"timed out after {timeout} s waiting for {what}; last check gave {value!r}; "
                f"seen: {(show or stall_seen)()}"
            )
        time.sleep(0.5)


HOME: list[Path] = []  # the test's VSUP_HOME, for `stall_seen`


def stall_seen() -> str:
    """The instance's stall keys and the journal's stall events, for assertion messages."""
    if not HOME:
        return "-"
    try:
        inst = status(HOME[0])
    except Exception as exc:  # the message must come out whatever the daemon does
        inst = {"status": repr(exc)}
    keys: tuple[str, ...] = (
        "state",
        "pid",
        "run",
        "restarts",
        "stalled",
        "stall_evidence",
        "stalled_ranks",
    )
    keys += ("requests_running", "requests_waiting", "requests_in_flight")
    kinds = ("stalled", "stall_cleared", "stall_restart", "exit", "rank_exit", "restart_scheduled")
    try:
        journal: list[object] = [
            (e["kind"], e.get("ranks") or e.get("rank"), e.get("evidence") or e.get("reason"))
            for e in events(HOME[0])
            if e.get("kind") in kinds
        ]
    except OSError as exc:
        journal = [repr(exc)]
    return f"{ {k: inst.get(k) for k in keys} } journal {journal}"


def title(pid: int) -> str:
    """The process title ('' once the process is gone)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


class Requests:
    """Completions in flight, each in its own thread; answers (status or error) are kept."""

    def __init__(self, port: int, n: int, max_tokens: int) -> None:
        base = f"http://127.0.0.1:{port}"
        model = httpx.get(f"{base}/v1/models", timeout=30).json()["data"][0]["id"]
        body = {"model": model, "prompt": "the quick brown fox", "max_tokens": max_tokens}
        self.answers: list[object] = []

        def one() -> None:
            try:
                answer = httpx.post(
                    f"{base}/v1/completions", json={**body, "ignore_eos": True}, timeout=600
                )
                self.answers.append(answer.status_code)
            except httpx.HTTPError as exc:
                self.answers.append(type(exc).__name__)

        self.threads = [threading.Thread(target=one, daemon=True) for _ in range(n)]
        for t in self.threads:
            t.start()

    def join(self, timeout: float) -> None:
        for t in self.threads:
            t.join(timeout)

    def done(self) -> bool:
        return not any(t.is_alive() for t in self.threads)


def per_engine(port: int, gauge: str) -> dict[str, float]:
    out = {}
    for line in httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text.splitlines():
        if line.startswith(f"vllm:{gauge}{{"):
            out[line.split('engine="', 1)[1].split('"', 1)[0]] = float(line.rsplit(" ", 1)[1])
    return out


def per_engine_running(port: int) -> dict[str, float]:
    return per_engine(port, "num_requests_running")


def per_engine_work(port: int) -> dict[str, int]:
    """Requests running + waiting at each engine, as its gauges say."""
    running, waiting = per_engine_running(port), per_engine(port, "num_requests_waiting")
    return {e: int(running[e] + waiting.get(e, 0.0)) for e in running}


def cpu_rate(pid: int, window_s: float = 0.1) -> float:
    """The share of one core process `pid` used over the next `window_s`."""
    proc = psutil.Process(pid)
    t0, c0 = time.monotonic(), sum(proc.cpu_times()[:2])
    time.sleep(window_s)
    return (sum(proc.cpu_times()[:2]) - c0) / (time.monotonic() - t0)


def server_load(port: int) -> int:
    return httpx.get(f"http://127.0.0.1:{port}/load", timeout=10).json()["server_load"]


def ranks_seen(home: Path) -> dict | None:
    inst = status(home)
    ranks = inst["ranks"]
    if inst["state"] == "ready" and len(ranks) == 2 and all(r["alive"] for r in ranks):
        return inst
    return None


STALL_AFTER_S = 5


def test_dp_instance_status_a_hung_rank_and_a_dead_rank(vsup_home, tiny_model, vllm_env, tmp_path):
    home = vsup_home
    HOME[:] = [home]
    port = free_port()
    env = ", ".join(f'{k} = "{v}"' for k, v in vllm_env.items())
    cmd = json.dumps([sys.executable, "-m", "vllm.entrypoints.openai.api_server"])
    layout = tmp_path / "dp.toml"
    stopped: list[int] = []
    figures: dict[str, float] = {}

    def text(on_stall: str) -> str:
        return f"""
[layout]
name = "cpu-dp"

[[instance]]
name = "dp2"
model = "{tiny_model}"
command = {cmd}
host = "127.0.0.1"
gpus = []
port = {port}
args = {{ data-parallel-size = 2, dtype = "float32", enforce-eager = true, max-model-len = 512 }}
env = {{ {env} }}
start_timeout_s = 900
stall_after_s = {STALL_AFTER_S}
restart = {{ policy = "on-failure", backoff_s = 1, backoff_max_s = 5, stable_s = 600, max_failures = 2{on_stall} }}
"""

    def stalled_rank() -> dict | None:
        inst = status(home)
        return inst if inst["stalled"] else None

    layout.write_text(text(""))
    try:
        up = vsup(home, "up", str(layout), "--detach", "--wait", "--timeout", "1100")
        assert up.returncode == 0, up.stdout + up.stderr

        # status: the shape on every instance, one entry per rank with its EngineCore_DP process
        inst = wait_for("both ranks in the status", lambda: ranks_seen(home), 60)
        assert inst["parallel"] == {"tp": 1, "pp": 1, "dp": 2}
        assert inst["hbm_per_gpu"] is None  # no GPU here: unknown, not 0
        assert [(r["rank"], r["gpus"], r["hbm_bytes"]) for r in inst["ranks"]] == [
            (0, [], None),
            (1, [], None),
        ]
        for r in inst["ranks"]:
            assert title(r["pid"]) == f"VLLM::EngineCore_DP{r['rank']}"
            assert os.getpgid(r["pid"]) == inst["pid"]  # in the API server's group
        table = vsup(home, "status").stdout
        assert "TP1 x DP2" in table
        assert f"DP1 gpu cpu pid {inst['ranks'][1]['pid']} alive" in table

        # rank 1 hangs under load beside a working rank 0: stalled, the rank named. The freeze
        # comes when rank 1's process burns CPU: the tiny model's engines finish a load before
        # the API server, which lags behind them, shows it running (the stall test saw it).
        # A try that finds rank 1 done (nothing held: no stall, right) is made again, and so
        # is a load that ends without rank 1 seen busy: beside another lane's servers on 2
        # cores it may get too little CPU for the 0.1 s sample, or rank 0 takes the whole load
        # (3 CI-like runs of 5 on 2026-12-05 timed out here while the module alone passed).
        rank1 = inst["ranks"][1]["pid"]
        tries: list[str] = []
        while True:
            load = Requests(port, n=16, max_tokens=400)  # max-model-len is 512
            busy = wait_for(
                "rank 1 to work, or the load to end",
                lambda load=load: (r := cpu_rate(rank1)) > 0.2 and r or load.done() and -1.0,
                300,
            )
            if busy < 0:
                tries.append(f"rank 1 never seen busy during a load: {load.answers}")
                assert len(tries) < 5, tries
                continue
            os.kill(rank1, signal.SIGSTOP)
            stopped.append(rank1)
            t0 = time.monotonic()
            hung = wait_for(
                "rank 1 stalled, or nothing held",
                lambda: (i := status(home))["stalled"] and i or server_load(port) == 0 and i,
                STALL_AFTER_S + 60,
            )
            if hung["stalled"]:
                break
            os.kill(rank1, signal.SIGCONT)
            stopped.remove(rank1)
            load.join(120)
            tries.append(f"rank 1 done at the freeze ({busy:.0%} CPU): {load.answers}")
            assert len(tries) < 5, tries
        figures["DP=2, rank 1 frozen under load -> stalled"] = time.monotonic() - t0
        # rank 1's gauges stay at what it held when it froze (the API server has shown its
        # last stats by now: each output before the freeze was progress)
        at_rank1 = per_engine_work(port)["1"]
        shown = f"{hung} (rank 1 held {at_rank1}); {stall_seen()}; earlier tries {tries}"
        # which figure shows rank 1's requests depends on whether a step of rank 1 reported
        # them before the freeze: its gauges, else only the API server's count (seen: 5 in
        # flight, rank 1's gauges at 0)
        # When only the API server's count shows them, the requests are held by a rank that
        # has not moved since they came: rank 0, done with its share before then and idle,
        # cannot be told from frozen rank 1 by any figure vLLM gives (seen in CI: [0, 1]), so
        # it is named with it; a rank that answered since is never named.
        named = hung["stalled_ranks"]
        assert named == [1] or (named == [0, 1] and hung["stall_evidence"] == "server"), shown
        if named == [0, 1]:
            assert per_engine_work(port)["0"] == 0, shown  # idle, not a second frozen rank
        assert hung["stall_evidence"] in ("engine", "server"), shown
        # rank 1's requests are held; rank 0 goes on answering its own
        assert hung["state"] == "ready", shown
        assert 1 <= hung["requests_in_flight"] <= 16, shown
        assert at_rank1 <= hung["requests_in_flight"], shown
        # the status names the ranks at once; the journal's event follows at the next poll
        # (a stall of [1] may come back as [0, 1]: wait for the event that names what it shows)
        got = wait_for(
            "the stalled event naming what the status shows",
            lambda: (
                (g := [e for e in events(home) if e.get("kind") == "stalled"])
                and g[-1]["ranks"] == named
                and g
            ),
            15,
        )
        # with only the API server's count as evidence, rank 0 finishing its share reads as
        # progress (a clear) and then as idle, so a stall of [1] may clear and come back as
        # [0, 1] while rank 1 stays frozen (seen alone and in the suite, 2026-12-05): every
        # stall names rank 1, and the last is the one the status shows
        assert 1 <= len(got) <= 2 and all(1 in e["ranks"] for e in got), stall_seen()
        event = got[-1]
        assert event["ranks"] == named and event["evidence"] == hung["stall_evidence"], event
        said = "rank 1: " if named == [1] else "ranks 0, 1: "
        assert f"data-parallel {said}" in vsup(home, "status").stdout
        os.kill(rank1, signal.SIGCONT)
        stopped.remove(rank1)
        wait_for("the stall to clear", lambda: status(home)["stalled"] is False, 60)
        load.join(300)
        assert load.answers == [200] * 16, load.answers

        # rank 1 hangs while idle, then requests: vLLM's balancer gives rank 1 one of them
        # and, seeing it in flight, the rest to rank 0, which answers them; the one held at
        # rank 1 shows only in /load (README: tests/fixtures/vllm-0.32-cpu/dp2)
        wait_for("an idle server", lambda: server_load(port) == 0, 60)
        os.kill(rank1, signal.SIGSTOP)
        stopped.append(rank1)
        held = Requests(port, n=4, max_tokens=20)
        t0 = time.monotonic()
        hung = wait_for("rank 1 stalled while idle", stalled_rank, STALL_AFTER_S + 60)
        figures["DP=2, rank 1 frozen idle, requests -> stalled"] = time.monotonic() - t0
        shown = f"{hung}; {stall_seen()}"
        # rank 0, done with its share, cannot be told from frozen rank 1 by the server's count
        # (as under load above): named with it, and then it is idle
        assert hung["stall_evidence"] == "server", shown
        assert hung["stalled_ranks"] in ([1], [0, 1]), shown
        if hung["stalled_ranks"] == [0, 1]:
            assert per_engine_work(port)["0"] == 0, shown
        # rank 0 answers what it got while rank 1 stays frozen
        wait_for("rank 0's answers", lambda: held.answers.count(200) >= 1, 60, lambda: held.answers)
        os.kill(rank1, signal.SIGCONT)
        stopped.remove(rank1)
        wait_for("the stall to clear", lambda: status(home)["stalled"] is False, 60)
        held.join(120)
        assert held.answers == [200] * 4, held.answers

        # one rank's EngineCore dies (rank 0, the one that answers the API server's balancer
        # first): vsup sees it at once, ends the server, names the rank, restarts it as a unit
        victim = inst["ranks"][0]["pid"]
        t0 = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        seen = wait_for(
            "the rank_exit event",
            lambda: [e for e in events(home) if e.get("kind") == "rank_exit"],
            30,
        )
        t_seen = time.monotonic() - t0
        assert seen[0]["rank"] == 0 and seen[0]["pid"] == victim and seen[0]["run"] == 1
        exit_ev = wait_for(
            "the exit",
            lambda: [e for e in events(home) if e.get("kind") == "exit"],
            120,
        )[0]
        t_exit = time.monotonic() - t0
        assert exit_ev["reason"] == "engine_dead" and exit_ev["rank"] == 0
        kinds = [e["kind"] for e in events(home) if e.get("instance") == "dp2"]
        first_exit = kinds[kinds.index("rank_exit") :]
        assert first_exit.index("unhealthy") < first_exit.index("exit")
        # nothing of the first run is left: every rank and worker ended with the group
        assert not any("EngineCore_DP" in title(r["pid"]) for r in inst["ranks"])
        # restarted as a unit: a new API server with two new ranks
        again = wait_for(
            "the restart",
            lambda: (i := ranks_seen(home)) is not None and i["pid"] != inst["pid"] and i,
            1100,
        )
        assert again["restarts"] == 1
        assert {r["pid"] for r in again["ranks"]}.isdisjoint({r["pid"] for r in inst["ranks"]})
        assert again["last_exit"]["rank"] == 0 and again["last_exit"]["reason"] == "engine_dead"
        print(
            f"\nDP=2, SIGKILL of EngineCore_DP0: seen by vsup after {t_seen:.2f} s, "
            f"instance ended {t_exit:.1f} s after the kill"
        )

        # restart.on_stall = true (an update, no restart): rank 1 of the new run hangs; the
        # stall restart names it, and this second failure trips the breaker (max_failures =
        # 2), whose failed_why names the rank too. (One DP2 start less than restarting it.)
        layout.write_text(text(", on_stall = true"))
        up = vsup(home, "up", str(layout), "--detach", "--wait", "--yes", "--timeout", "600")
        assert up.returncode == 0, up.stdout + up.stderr
        assert status(home)["pid"] == again["pid"]
        rank1 = again["ranks"][1]["pid"]
        os.kill(rank1, signal.SIGSTOP)
        stopped.append(rank1)
        lost = Requests(port, n=4, max_tokens=20)
        got = wait_for(
            "stall_restart",
            lambda: [e for e in events(home) if e.get("kind") == "stall_restart"],
            STALL_AFTER_S + 60,
        )
        assert len(got) == 1, stall_seen()
        restart = got[0]
        # As while idle above: the requests came to a server whose rank 0 then finished its
        # share, so only the API server's count shows rank 1's, and rank 0 (idle) may be named
        # with it (seen in a fresh clone's full suite, 2026-12-06); rank 1 is always named,
        # and a single rank named is rank 1
        one = restart.get("rank")
        assert one == 1 or (
            one is None and restart["why"].startswith("data-parallel ranks 0, 1: ")
        ), restart
        if one == 1:
            assert restart["why"].startswith("data-parallel rank 1: "), restart
        failed = wait_for(
            "the breaker",
            lambda: (i := status(home))["state"] == "failed" and i,
            120,
        )
        shown = f"{failed['failed_why']}, last exit {failed['last_exit']}; {stall_seen()}"
        assert failed["last_exit"]["reason"] == "stalled", shown
        assert failed["last_exit"].get("rank") == one, shown
        if one == 1:
            assert "data-parallel rank 1 stalled" in failed["failed_why"], shown
        exits = [e for e in events(home) if e.get("kind") == "exit"]
        assert [(e["reason"], e.get("rank")) for e in exits] == [
            ("engine_dead", 0),
            ("stalled", one),
        ], shown
        stopped.remove(rank1)
        assert not title(rank1)  # the frozen rank went with its server
        assert [r["alive"] for r in failed["ranks"]] == [None, None]  # no run now
        lost.join(60)
    finally:
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        for what, seconds in figures.items():
            print(f"\n{what}: {seconds:.1f} s", end="")
        vsup(home, "down", "--yes", timeout=120)
        journal = home / "journal.jsonl"
        if journal.exists():
            for line in journal.read_text().splitlines():
                ev = json.loads(line)
                if ev.get("kind") == "spawn":
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(ev["pgid"], signal.SIGKILL)
