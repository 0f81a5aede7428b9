"""Stall detection against a real vLLM (CPU build), one server for every case: its EngineCore is
frozen with SIGSTOP, the way a hung GPU or a stuck collective freezes an engine.

What this shows, measured here: with the EngineCore stopped the API server still answers
`/health` 200 and `/metrics` (vLLM's gauges frozen at the last stats the engine sent), and its
`/load` (vsup starts it with `--enable-server-load-tracking`) still counts the requests it holds.
In order, on one server:
1. idle, unfrozen, for longer than `stall_after_s`: never flagged;
2. frozen while idle: not flagged while nothing waits; then 3 requests: `stalled` (evidence
   `server`: the requests only /load shows) about `stall_after_s` after they arrived, with the
   advice, the journal event, the Prometheus series; SIGCONT: they are answered, it clears;
3. frozen under load (12 long requests in flight): `stalled`; SIGCONT: all answered, it clears,
   nothing restarted;
4. `restart.on_stall = true` (taken by an apply without a restart), frozen while idle, then a
   request: the run ends through the restart policy (exit reason `stalled`, one restart
   counted), a new run is ready, nothing of the frozen one is left.
Nothing stays SIGSTOPped: every stopped pid gets SIGCONT in `finally`. The figures are printed
(`-s`); README.md ("On call: stalled instances") quotes them.

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


def wait_for(pred, timeout: float, what: str, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


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

    def join(self, timeout: float) -> None:
        for t in self.threads:
            t.join(timeout)


def server_load(port: int) -> int:
    return httpx.get(f"http://127.0.0.1:{port}/load", timeout=10).json()["server_load"]


def engine_core(api_pid: int) -> psutil.Process:
    for p in psutil.Process(api_pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if p.name() == "VLLM::EngineCore":
                return p
    raise AssertionError(f"no VLLM::EngineCore under pid {api_pid}")


def instance(client: Client) -> dict:
    return client.status()["instances"][0]


def events(client: Client, kind: str) -> list[dict]:
    return [e for e in client.events()["events"] if e["kind"] == kind]


def watch(client: Client, port: int, seconds: float) -> list[dict]:
    """Status each 0.5 s for `seconds` (every reading), with /health's answer beside it."""
    seen = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        inst = instance(client)
        inst["health"] = health(port)
        seen.append(inst)
        time.sleep(0.5)
    return seen


def health(port: int) -> object:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code
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

    def stalled_now(health_seen: list[object]):
        health_seen.append(health(port))
        inst = instance(client)
        return inst if inst["stalled"] else None

    try:
        up = vsup(home, "up", str(layout), "--detach", "--wait", "--timeout", "400")
        assert up.returncode == 0, up.stdout + up.stderr
        # `stalled` is null (unknown) until the first scrape of the ready server
        first = wait_for(
            lambda: (lambda i: i if i["stalled"] is False else None)(instance(client)),
            30,
            "the first scrape",
        )
        assert first["state"] == "ready" and first["load_tracking"] is True
        assert "--enable-server-load-tracking" in client.config("cpu0")["argv"]
        api_pid = first["pid"]
        core = engine_core(api_pid)

        # 1. Idle for longer than stall_after_s: never flagged.
        idle = watch(client, port, STALL_AFTER_S + 2)
        assert {i["stalled"] for i in idle} == {False}
        assert {i["requests_in_flight"] for i in idle} == {0}

        # 2. Frozen while idle: nothing waits, nothing to flag; then requests: stalled.
        freeze(core.pid)
        quiet = watch(client, port, 3)
        assert {i["stalled"] for i in quiet} == {False} and {i["health"] for i in quiet} == {200}
        held = Requests(port, n=3, max_tokens=20)
        wait_for(lambda: server_load(port) == 3, 30, "/load to count the 3 requests")
        t_req = time.monotonic()
        health_seen: list[object] = []
        inst = wait_for(lambda: stalled_now(health_seen), STALL_AFTER_S + 30, "stalled", 0.5)
        figures["idle freeze: requests -> stalled"] = time.monotonic() - t_req
        assert set(health_seen) == {200}, health_seen
        assert time.monotonic() - t_req >= STALL_AFTER_S - 1.5
        assert inst["state"] == "ready" and inst["pid"] == api_pid
        assert inst["stall_evidence"] == "server" and inst["requests_in_flight"] == 3
        assert inst["requests_running"] == 0 and inst["requests_waiting"] == 0  # frozen gauges
        assert inst["stalled_for_s"] >= STALL_AFTER_S - 1.5
        doc = client.status()
        (advice,) = [a for a in doc["advice"] if a["kind"] == "stalled"]
        assert "3 requests in flight at the API server and none at the engine" in advice["message"]
        table = vsup(home, "status").stdout
        assert "ready STALLED" in table and "critical: cpu0: stalled:" in table, table
        exported = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text
        assert 'vsup_instance_stalled{name="cpu0"} 1.0' in exported
        assert 'vsup_instance_requests_in_flight{name="cpu0"} 3.0' in exported
        assert 'vsup_instance_up{name="cpu0"} 1.0' in exported
        (event,) = wait_for(lambda: events(client, "stalled"), 10, "the stalled event")
        assert event["evidence"] == "server" and event["requests_in_flight"] == 3
        assert event["on_stall"] is False
        t_cont = thaw(core.pid)
        wait_for(lambda: instance(client)["stalled"] is False, 60, "the stall to clear")
        figures["idle freeze: SIGCONT -> cleared"] = time.monotonic() - t_cont
        held.join(120)
        assert held.answers == [200] * 3, held.answers
        (cleared,) = wait_for(lambda: events(client, "stall_cleared"), 10, "stall_cleared")
        assert cleared["why"] in ("progress", "idle") and cleared["lasted_s"] >= STALL_AFTER_S - 1.5

        # 3. Frozen under load: 12 long generations in flight at the freeze.
        load = Requests(port, n=12, max_tokens=600)
        wait_for(lambda: server_load(port) == 12, 30, "/load to count the 12 requests")
        t_stop = freeze(core.pid)
        health_seen = []
        inst = wait_for(lambda: stalled_now(health_seen), STALL_AFTER_S + 30, "stalled", 0.5)
        figures["under load: SIGSTOP -> stalled"] = time.monotonic() - t_stop
        assert set(health_seen) == {200}, health_seen
        assert time.monotonic() - t_stop >= STALL_AFTER_S - 1.5
        assert inst["requests_in_flight"] == 12 and inst["pid"] == api_pid
        # which figure showed the work depends on whether an engine step reported them
        # before the freeze: the engine's gauges, else the API server's count
        assert inst["stall_evidence"] in ("engine", "server")
        # the daemon journals a change at its next poll (status answers from a fresh build)
        wait_for(lambda: len(events(client, "stalled")) == 2, 10, "the second stalled event")
        t_cont = thaw(core.pid)
        wait_for(lambda: instance(client)["stalled"] is False, 60, "the stall to clear")
        figures["under load: SIGCONT -> cleared"] = time.monotonic() - t_cont
        load.join(300)
        assert load.answers == [200] * 12, load.answers
        wait_for(lambda: len(events(client, "stall_cleared")) == 2, 10, "stall_cleared")
        assert instance(client)["restarts"] == 0 and instance(client)["pid"] == api_pid

        # 4. restart.on_stall = true (an update: no restart), frozen while idle, a request.
        layout.write_text(
            layout_text(tiny_model, port, vllm_env, metrics_port, ", on_stall = true")
        )
        up = vsup(home, "up", str(layout), "--detach", "--wait", "--yes", "--timeout", "400")
        assert up.returncode == 0, up.stdout + up.stderr
        assert instance(client)["pid"] == api_pid
        pgid = os.getpgid(api_pid)
        wait_for(lambda: server_load(port) == 0, 30, "an idle server")
        t_stop = freeze(core.pid)
        lost = Requests(port, n=1, max_tokens=20)
        (restart,) = wait_for(
            lambda: events(client, "stall_restart"), STALL_AFTER_S + 30, "stall_restart"
        )
        figures["on_stall: SIGSTOP + request -> stall_restart"] = time.monotonic() - t_stop
        assert restart["pid"] == api_pid
        assert "1 request in flight at the API server and none at the engine" in restart["why"]
        back = wait_for(
            lambda: (lambda i: i if i["state"] == "ready" and i["pid"] != api_pid else None)(
                instance(client)
            ),
            400,
            "a new ready run",
            interval=1.0,
        )
        figures["on_stall: SIGSTOP -> ready again"] = time.monotonic() - t_stop
        assert back["restarts"] == 1 and back["last_exit"]["reason"] == "stalled"
        exits = [e for e in events(client, "exit") if e["reason"] == "stalled"]
        assert len(exits) == 1 and exits[0]["pid"] == api_pid and "rank" not in exits[0]
        assert [e["reason"] for e in events(client, "restart_scheduled")] == ["stalled"]
        assert not psutil.pid_exists(core.pid) or psutil.Process(core.pid).status() == "zombie"
        stopped.remove(core.pid)
        left = [p.pid for p in psutil.process_iter() if _pgid(p.pid) == pgid]
        assert left == [], f"left of the frozen run: {left}"
        lost.join(60)
        assert lost.answers and lost.answers[0] != 200  # its request failed with the run
        assert back["load_tracking"] is True and back["stalled"] is False
    finally:
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        client.close()
        down = vsup(home, "down", "--yes", timeout=180)
        assert down.returncode == 0, down.stdout + down.stderr
        for what, seconds in figures.items():
            print(f"\n{what}: {seconds:.1f} s", end="")
        print(f"\nwhole test: {time.monotonic() - t_test:.0f} s")


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None
