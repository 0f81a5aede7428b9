"""Stall detection against a real vLLM (CPU build), one server for every case: its EngineCore is
frozen with SIGSTOP, the way a hung GPU or a stuck collective freezes an engine.

What this shows, measured here: with the EngineCore stopped the API server still answers
`/health` 200 and `/metrics` (vLLM's gauges frozen at the last stats the engine sent), and its
`/load` (vsup starts it with `--enable-server-load-tracking`) still counts the requests it holds.
In order, on one server:
1. idle, unfrozen, for longer than `stall_after_s`: never flagged;
2. frozen while idle: not flagged while nothing waits; then 3 requests: `stalled` (evidence
   `server`: the requests only /load shows) about `stall_after_s` after they arrived, with the
   advice, one journal event, the Prometheus series; SIGCONT: they are answered, it clears;
3. frozen under load (long requests in flight, tokens flowing): `stalled`; SIGCONT: all 12
   answered, it clears, nothing restarted;
4. `restart.on_stall = true` (taken by an apply without a restart), frozen while idle, then a
   request: the run ends through the restart policy (exit reason `stalled`, one restart
   counted), a new run is spawned with load tracking, nothing of the frozen one is left.
Nothing stays SIGSTOPped: every stopped pid gets SIGCONT in `finally`. The figures are printed
(`-s`); docs/benchmarks.md ("Stall detection on real vLLM") quotes them.

Written for a loaded 2-core machine (a full run, other real-vLLM tests just ended): every wait
is for an event, bounded generously; no bound on when `stalled` may come is taken from the
test's own view of the requests (it is taken from before they were sent, or from before the
last progress the test saw); every assertion says what was seen (the status keys, /health's
answers, the journal's stall events), so a failure reads from CI output alone.

vLLM runs in one-process mode (VLLM_ONE_PROCESS, tests/conftest.py `vllm_env`): API server +
`VLLM::EngineCore` with the model worker inside, the process tree of a GPU server at TP1. The
frozen process is then the engine itself, forward pass included, as a hung GPU engine at TP1
is; the CPU build's default tree adds a `VLLM::Worker` under the EngineCore, which a freeze of
the EngineCore left running (waiting for its next step). The freeze under load waits for the
EngineCore's own CPU share, which in this mode is the model's work.

The long-prefill rule is checked on a real vLLM's figures replayed (tests/unit/telemetry/
test_stall.py, tests/fixtures/vllm-0.32-cpu/prefill_slowed.txt) and on the emulator
(tests/unit/control/test_stall_daemon.py): slowing the tiny model's prefill here takes SIGSTOP
duty cycles whose effect depends on the machine's speed, which a test cannot pin down.
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

from vsup.control.client import Client

from tests.conftest import free_port, run_vsup

pytestmark = pytest.mark.vllm
VLLM_ONE_PROCESS = True
STALL_AFTER_S = 5


vsup = partial(run_vsup, timeout=600)


def layout_text(model: Path, port: int, vllm_env: dict, metrics_port: int, restart: str) -> str:
    env = ", ".join(f'{k} = "{v}"' for k, v in vllm_env.items())
    cmd = json.dumps([sys.executable, "-m", "vllm.entrypoints.openai.api_server"])
    return f"""
[layout]
name = "stall"
metrics_listen = "127.0.0.1:{metrics_port}"

[defaults]
model = "{model}"
command = {cmd}
host = "127.0.0.1"
args = {{ dtype = "float32", enforce-eager = true, max-model-len = 2048 }}
env = {{ {env} }}
stall_after_s = {STALL_AFTER_S}
unhealthy_grace_s = 300
stop_grace_s = 5
restart = {{ policy = "on-failure", backoff_s = 1, backoff_max_s = 5, max_failures = 5{restart} }}

[[instance]]
name = "cpu0"
gpus = []
port = {port}
"""


def wait_for(read, ok, timeout: float, what: str, interval: float = 0.2):
    """`read()` until `ok(value)`, for at most `timeout` s (sized for a loaded 2-core machine);
    on a timeout the message has what the last reading saw and how many there were."""
    deadline = time.monotonic() + timeout
    readings = 0
    changes: list[object] = []  # the values seen, each time it changed (the last 8)
    while True:
        value = read()
        readings += 1
        if ok(value):
            return value
        parts = value if isinstance(value, tuple) else (value,)
        shown = tuple(brief(v) if isinstance(v, dict) else v for v in parts)
        if not changes or changes[-1] != shown:
            changes[:] = [*changes[-7:], shown]
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"timed out after {timeout} s ({readings} readings) waiting for {what}; "
                f"seen, as it changed: {changes!r}"
            )
        time.sleep(interval)


class Requests:
    """Completions in flight, each in its own thread; answers (status or error) are kept."""

    def __init__(self, port: int, n: int, max_tokens: int) -> None:
        base = f"http://127.0.0.1:{port}"
        self.model = httpx.get(f"{base}/v1/models", timeout=30).json()["data"][0]["id"]
        self.url = f"{base}/v1/completions"
        self.answers: list[object] = []
        self.threads = [
            threading.Thread(target=self._one, args=(max_tokens,), daemon=True) for _ in range(n)
        ]
        for t in self.threads:
            t.start()

    def _one(self, max_tokens: int) -> None:
        body = {
            "model": self.model,
            "prompt": "the quick brown fox",
            "max_tokens": max_tokens,
            "ignore_eos": True,
        }
        try:
            self.answers.append(httpx.post(self.url, json=body, timeout=600).status_code)
        except httpx.HTTPError as exc:
            self.answers.append(type(exc).__name__)

    def join(self, timeout: float) -> list[object]:
        """Wait for every answer (at most `timeout` s in all); the answers."""
        deadline = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return self.answers


def server_load(port: int) -> int:
    return httpx.get(f"http://127.0.0.1:{port}/load", timeout=10).json()["server_load"]


def cpu_rate(proc: psutil.Process, window_s: float = 0.1) -> float:
    """The share of one core `proc` used over the next `window_s` (its CPU time sampled)."""
    t0, c0 = time.monotonic(), sum(proc.cpu_times()[:2])
    time.sleep(window_s)
    return (sum(proc.cpu_times()[:2]) - c0) / (time.monotonic() - t0)


def engine_core(api_pid: int) -> psutil.Process:
    for p in psutil.Process(api_pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if p.name() == "VLLM::EngineCore":
                return p
    raise AssertionError(f"no VLLM::EngineCore under pid {api_pid}")


STALL_KEYS = (
    "state",
    "pid",
    "run",
    "restarts",
    "stalled",
    "stalled_for_s",
    "stall_evidence",
    "requests_running",
    "requests_waiting",
    "requests_in_flight",
    "load_tracking",
)


def instance(client: Client) -> dict:
    return client.status()["instances"][0]


def brief(inst: dict) -> dict:
    """The keys this test reads, for assertion messages."""
    return {k: inst.get(k) for k in (*STALL_KEYS, "health") if k in inst}


def events(client: Client, *kinds: str) -> list[dict]:
    return [e for e in client.events().to_json()["events"] if e["kind"] in kinds]


STALL_EVENTS = ("stalled", "stall_cleared", "stall_restart", "exit", "restart_scheduled")


def journal(client: Client) -> list[tuple]:
    """The stall-related events so far, short, for assertion messages."""
    return [
        (e["kind"], e.get("evidence") or e.get("why") or e.get("reason"), e.get("run"))
        for e in events(client, *STALL_EVENTS)
    ]


def watch(client: Client, port: int, seconds: float) -> list[dict]:
    """Status each 0.5 s for `seconds` (every reading), with /health's answer beside it."""
    seen = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        inst = instance(client)
        inst["health"] = health(port)
        seen.append(brief(inst))
        time.sleep(0.5)
    return seen


def health(port: int) -> object:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).status_code
    except httpx.HTTPError as exc:
        return type(exc).__name__


@pytest.mark.timeout(1200)
def test_freezes_under_load_and_while_idle_are_stalled_clear_and_restart_with_on_stall(
    vsup_home, tiny_model, vllm_env, tmp_path
):
    home, port, metrics_port = vsup_home, free_port(), free_port()
    layout = tmp_path / "stall.toml"
    layout.write_text(layout_text(tiny_model, port, vllm_env, metrics_port, ""))
    stopped: list[int] = []
    client = Client(home)
    t_test = time.monotonic()
    figures: dict[str, float] = {}

    def freeze(pid: int) -> float:
        os.kill(pid, signal.SIGSTOP)
        stopped.append(pid)
        return time.monotonic()

    def thaw(pid: int) -> float:
        os.kill(pid, signal.SIGCONT)
        stopped.remove(pid)
        return time.monotonic()

    health_seen: list[object] = []
    tries: list[str] = []  # freezes under load that found the engine done already

    def reading() -> dict:
        """The instance now, with /health's answer (also kept in health_seen)."""
        health_seen.append(health(port))
        inst = instance(client)
        inst["health"] = health_seen[-1]
        return inst

    def stalled(inst: dict) -> bool:
        return bool(inst["stalled"])

    def scraped(inst: dict) -> bool:
        # `stalled` is null (unknown) until the first scrape of a ready run
        return inst["state"] == "ready" and inst["stalled"] is False

    try:
        up = vsup(home, "up", str(layout), "--detach", "--wait", "--timeout", "400")
        assert up.returncode == 0, up.stdout + up.stderr
        first = wait_for(lambda: instance(client), scraped, 60, "the first scrape")
        assert first["load_tracking"] is True, brief(first)
        assert "--enable-server-load-tracking" in client.config("cpu0")["argv"]
        api_pid = first["pid"]
        core = engine_core(api_pid)

        # 1. Idle for longer than stall_after_s: never flagged.
        idle = watch(client, port, STALL_AFTER_S + 2)
        assert all(i["stalled"] is False and i["requests_in_flight"] == 0 for i in idle), idle

        # 2. Frozen while idle: nothing waits, nothing to flag; then requests: stalled.
        freeze(core.pid)
        quiet = watch(client, port, 3)
        assert all(i["stalled"] is False and i["health"] == 200 for i in quiet), quiet
        health_seen.clear()
        # the daemon cannot see a request before it is sent: no stall before t_sent + 5 s
        t_sent = time.monotonic()
        held = Requests(port, n=3, max_tokens=20)
        wait_for(lambda: server_load(port), lambda n: n == 3, 60, "/load to count 3 requests")
        inst = wait_for(reading, stalled, STALL_AFTER_S + 60, "stalled (idle freeze)", 0.5)
        figures["idle freeze: requests -> stalled"] = seen_after = time.monotonic() - t_sent
        seen = f"{brief(inst)} after {seen_after:.1f} s; /health {health_seen}; {journal(client)}"
        assert set(health_seen) == {200}, seen
        assert seen_after >= STALL_AFTER_S and inst["stalled_for_s"] >= STALL_AFTER_S, seen
        assert inst["state"] == "ready" and inst["pid"] == api_pid, seen
        assert inst["stall_evidence"] == "server" and inst["requests_in_flight"] == 3, seen
        assert inst["requests_running"] == 0 and inst["requests_waiting"] == 0, seen  # frozen
        doc = client.status()
        advice = [a["message"] for a in doc["advice"] if a["kind"] == "stalled"]
        assert len(advice) == 1, advice
        assert "3 requests in flight at the API server and none at the engine" in advice[0]
        table = vsup(home, "status").stdout
        assert "ready STALLED" in table and "critical: cpu0: stalled:" in table, table
        exported = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text
        series = [x for x in exported.splitlines() if x.startswith("vsup_instance_")]
        assert 'vsup_instance_stalled{name="cpu0"} 1.0' in series, series
        assert 'vsup_instance_requests_in_flight{name="cpu0"} 3.0' in series, series
        assert 'vsup_instance_up{name="cpu0"} 1.0' in series, series
        # the daemon journals a change at the poll that saw it (status may answer first)
        got = wait_for(
            lambda: events(client, "stalled"), bool, 15, "the stalled event", interval=0.5
        )
        assert len(got) == 1, journal(client)
        event = got[0]
        assert event["evidence"] == "server" and event["requests_in_flight"] == 3, event
        assert event["on_stall"] is False, event
        t_cont = thaw(core.pid)
        wait_for(reading, lambda i: i["stalled"] is False, 60, "the idle freeze to clear")
        figures["idle freeze: SIGCONT -> cleared"] = time.monotonic() - t_cont
        assert held.join(120) == [200] * 3, held.answers
        got = wait_for(
            lambda: events(client, "stall_cleared"), bool, 15, "stall_cleared", interval=0.5
        )
        assert len(got) == 1, journal(client)
        cleared = got[0]
        assert cleared["why"] in ("progress", "idle"), cleared
        assert cleared["lasted_s"] >= STALL_AFTER_S, cleared
        assert len(events(client, "stalled")) == 1, journal(client)  # one freeze, one stall

        # 3. Frozen under load: 12 long generations, the engine busy with them at the freeze.
        # The tiny model's engine is fast: it generated 12 x 1000 tokens in the time the API
        # server (which counts tokens and /load) took to show a few, so a freeze timed by
        # what the API server shows (/load counting all 12, tokens growing) came after the
        # engine had finished: seen here twice, /load then fell to 0 with the engine stopped.
        # So the freeze comes when the engine process itself burns CPU; should it still find
        # the engine done (nothing held: /load drains to 0, correctly no stall), it is thawed
        # and tried again with a new load, at most 3 times.
        tries.clear()
        while True:
            # no token of these requests before they are sent: no stall before t_sent + 5 s
            t_sent = time.monotonic()
            load = Requests(port, n=12, max_tokens=1000)  # max-model-len 2048
            busy = wait_for(
                lambda: cpu_rate(core), lambda r: r > 0.2, 60, "the engine to work (CPU share)"
            )
            t_stop = freeze(core.pid)
            health_seen.clear()
            inst, held_now = wait_for(
                lambda: (reading(), server_load(port)),
                lambda r: r[0]["stalled"] or r[1] == 0,
                STALL_AFTER_S + 60,
                "stalled (under load), or nothing held",
                0.5,
            )
            if inst["stalled"]:
                break
            thaw(core.pid)
            tries.append(f"engine at {busy:.0%} CPU, done at the freeze: {load.join(120)}")
            assert len(tries) < 3, tries
        figures["under load: SIGSTOP -> stalled"] = time.monotonic() - t_stop
        seen_after = time.monotonic() - t_sent
        seen = f"{brief(inst)} {seen_after:.1f} s after the requests were sent; "
        seen += f"/load {held_now}, answers {load.answers}; /health {health_seen}; "
        seen += f"{journal(client)}; earlier tries {tries}"
        assert set(health_seen) == {200}, seen
        assert seen_after >= STALL_AFTER_S and inst["stalled_for_s"] >= STALL_AFTER_S, seen
        assert inst["pid"] == api_pid and inst["state"] == "ready", seen
        # the API server has shown every output the engine gave before the freeze by now
        # (each one is progress: no stall before stall_after_s after the last)
        assert 1 <= held_now == inst["requests_in_flight"], seen
        # which figure showed the work depends on whether an engine step reported them
        # before the freeze: the engine's gauges, else the API server's count
        assert inst["stall_evidence"] in ("engine", "server"), seen
        wait_for(
            lambda: events(client, "stalled"),
            lambda ev: len(ev) == 2,
            15,
            "the second stalled event",
            interval=0.5,
        )
        t_cont = thaw(core.pid)
        wait_for(reading, lambda i: i["stalled"] is False, 60, "the load freeze to clear")
        figures["under load: SIGCONT -> cleared"] = time.monotonic() - t_cont
        assert load.join(300) == [200] * 12, load.answers
        figures["under load: SIGCONT -> all 12 answered"] = time.monotonic() - t_cont
        wait_for(
            lambda: events(client, "stall_cleared"),
            lambda ev: len(ev) == 2,
            15,
            "the second stall_cleared",
            interval=0.5,
        )
        inst = instance(client)
        assert inst["restarts"] == 0 and inst["pid"] == api_pid, (brief(inst), journal(client))
        assert len(events(client, "stalled")) == 2, journal(client)

        # 4. restart.on_stall = true (an update: no restart), frozen while idle, a request.
        layout.write_text(
            layout_text(tiny_model, port, vllm_env, metrics_port, ", on_stall = true")
        )
        up = vsup(home, "up", str(layout), "--detach", "--wait", "--yes", "--timeout", "400")
        assert up.returncode == 0, up.stdout + up.stderr
        assert instance(client)["pid"] == api_pid, brief(instance(client))
        pgid = os.getpgid(api_pid)
        wait_for(lambda: server_load(port), lambda n: n == 0, 60, "an idle server")
        t_stop = freeze(core.pid)
        lost = Requests(port, n=1, max_tokens=20)
        got = wait_for(
            lambda: events(client, "stall_restart"),
            bool,
            STALL_AFTER_S + 60,
            "stall_restart",
            interval=0.5,
        )
        assert len(got) == 1, journal(client)
        restart = got[0]
        figures["on_stall: SIGSTOP + request -> stall_restart"] = time.monotonic() - t_stop
        assert restart["pid"] == api_pid, restart
        assert "1 request in flight at the API server and none at the engine" in restart["why"]
        # The restart policy brings it back: a new run is spawned after the backoff. Its
        # readiness is vLLM's start (a minute here), which the data-parallel test waits out
        # after its own stall restart; this test stops at the spawn.
        back = wait_for(
            lambda: instance(client),
            lambda i: i["run"] > first["run"] and i["pid"] not in (None, api_pid),
            120,
            "a new run spawned by the restart policy",
            interval=0.5,
        )
        figures["on_stall: SIGSTOP -> new run spawned"] = time.monotonic() - t_stop
        seen = f"{brief(back)}, last exit {back['last_exit']}; {journal(client)}"
        assert back["state"] in ("starting", "ready"), seen
        assert back["restarts"] == 1 and back["last_exit"]["reason"] == "stalled", seen
        exits = [e for e in events(client, "exit") if e["reason"] == "stalled"]
        assert len(exits) == 1 and exits[0]["pid"] == api_pid and "rank" not in exits[0], seen
        assert [e["reason"] for e in events(client, "restart_scheduled")] == ["stalled"], seen
        argv = psutil.Process(back["pid"]).cmdline()
        assert "--enable-server-load-tracking" in argv, argv
        # nothing of the frozen run is left (a killed process is reaped a moment later)
        wait_for(
            lambda: [p.pid for p in psutil.process_iter() if _pgid(p.pid) == pgid],
            lambda left: left == [],
            30,
            "the frozen run's process group to be gone",
        )
        stopped.remove(core.pid)
        answers = lost.join(60)
        assert answers and answers[0] != 200, answers  # its request failed with the run
    finally:
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        client.close()
        down = vsup(home, "down", "--yes", timeout=180)
        for what, seconds in figures.items():
            print(f"\n{what}: {seconds:.1f} s", end="")
        print(f"\nunder load, freezes that found the engine done: {len(tries)} {tries}")
        print(f"whole test: {time.monotonic() - t_test:.0f} s")
        assert down.returncode == 0, down.stdout + down.stderr


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None
