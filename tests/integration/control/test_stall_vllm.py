"""Stall detection against a real vLLM (CPU build): its EngineCore is frozen with SIGSTOP while
requests are in flight, the way a hung GPU or a stuck collective freezes an engine.

What this shows, measured here: with the EngineCore stopped the API server still answers
`/health` 200 and `/metrics` (vLLM's gauges frozen at the last stats the engine sent), so only
stall detection sees it. vsup flags the instance `stalled` about `stall_after_s` after the last
token, with the advice, the journal event and the Prometheus gauge; SIGCONT clears it. Then with
`restart.on_stall = true` (taken by an apply without a restart) the next freeze ends the run
through the restart policy: exit reason `stalled`, one restart counted, ready again, and nothing
of the frozen run left. Nothing stays SIGSTOPped: every stopped pid gets SIGCONT in `finally`.

The long-prefill rule is checked on a real vLLM's figures replayed (tests/unit/telemetry/
test_stall.py, tests/fixtures/vllm-0.32-cpu/prefill_slowed.txt): SIGSTOP/SIGCONT cannot slow
the tiny model's prefill reliably enough for a live test here.
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


class Load:
    """Long generations in flight (`ignore_eos`), each in its own thread; errors are kept."""

    def __init__(self, port: int, n: int = 12, max_tokens: int = 1900) -> None:
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


def vllm_running(port: int) -> float:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    for line in text.splitlines():
        if line.startswith("vllm:num_requests_running"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


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


def freeze_under_load(port: int, api_pid: int, stopped: list[int]) -> tuple[Load, int, float]:
    """Start the load and SIGSTOP the EngineCore while vLLM's gauges say requests run. The
    tiny model decodes thousands of tokens a second: on a quiet machine (CI) a whole load ended
    between two scrapes, three times over. So besides freezing once a scrape sees requests
    running, it also freezes first and asks the frozen gauges (they cannot change under the
    stop), resuming when they say none run; at most 3 loads of 32 requests."""
    for _ in range(3):
        load = Load(port, n=32)
        core = engine_core(api_pid)
        deadline = time.monotonic() + 60
        tries = 0
        while time.monotonic() < deadline and any(t.is_alive() for t in load.threads):
            tries += 1
            if vllm_running(port) > 0:  # seen running: freeze it now
                os.kill(core.pid, signal.SIGSTOP)
                stopped.append(core.pid)
                return load, core.pid, time.monotonic()
            if tries % 5 == 0:  # or freeze first and ask the frozen gauges
                os.kill(core.pid, signal.SIGSTOP)
                stopped.append(core.pid)
                t_stop = time.monotonic()
                if vllm_running(port) > 0:
                    return load, core.pid, t_stop
                os.kill(core.pid, signal.SIGCONT)
                stopped.remove(core.pid)
            time.sleep(0.01)
        load.join(60)
    # Seen in clean-clone CI runs and here: vLLM's gauges never said a request ran although
    # 3 loads of 32 long requests were answered (cause not found yet). Without a busy engine to
    # freeze there is nothing to test: skip, saying so, rather than fail on the race.
    pytest.skip(
        f"no request seen running in vLLM's gauges; the last load's answers: {load.answers}"
    )


@pytest.mark.timeout(1200)
def test_a_frozen_engine_core_is_stalled_then_clears_then_restarts_with_on_stall(
    vsup_home, tiny_model, vllm_env, tmp_path
):
    home, port, metrics_port = vsup_home, free_port(), free_port()
    layout = tmp_path / "stall.toml"
    layout.write_text(layout_text(tiny_model, port, vllm_env, metrics_port, ""))
    stopped: list[int] = []
    client = Client(home)
    try:
        up = vsup(home, "up", str(layout), "--detach", "--wait", "--timeout", "400")
        assert up.returncode == 0, up.stdout + up.stderr
        # `stalled` is null (unknown) until the first scrape of the ready server
        first = wait_for(
            lambda: (lambda i: i if i["stalled"] is False else None)(instance(client)),
            30,
            "the first scrape",
        )
        assert first["state"] == "ready"
        api_pid = first["pid"]

        # 1. Frozen under load: stalled (flag on a ready instance), /health still 200.
        load, core_pid, t_stop = freeze_under_load(port, api_pid, stopped)
        health: list[object] = []

        def stalled_now():
            try:
                health.append(httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code)
            except httpx.HTTPError as exc:
                health.append(type(exc).__name__)
            inst = instance(client)
            return inst if inst["stalled"] else None

        inst = wait_for(stalled_now, STALL_AFTER_S + 30, "stalled", interval=0.5)
        took = time.monotonic() - t_stop
        print(f"SIGSTOP -> stalled: {took:.1f} s; /health while frozen: {health}")
        assert set(health) == {200}, health
        assert STALL_AFTER_S - 1.5 <= took <= STALL_AFTER_S + 15, took
        assert inst["state"] == "ready" and inst["pid"] == api_pid
        assert inst["requests_running"] > 0 and inst["stalled_for_s"] >= STALL_AFTER_S
        doc = client.status()
        (advice,) = [a for a in doc["advice"] if a["kind"] == "stalled"]
        assert f"{int(inst['requests_running'])} running" in advice["message"]
        table = vsup(home, "status").stdout
        assert "ready STALLED" in table and "critical: cpu0: stalled:" in table, table
        exported = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text
        assert 'vsup_instance_stalled{name="cpu0"} 1.0' in exported
        assert 'vsup_instance_up{name="cpu0"} 1.0' in exported
        (event,) = wait_for(lambda: events(client, "stalled"), 10, "the stalled event")
        assert event["on_stall"] is False and event["requests_running"] > 0

        # 2. SIGCONT: tokens flow again, the flag clears, nothing was restarted.
        os.kill(core_pid, signal.SIGCONT)
        stopped.remove(core_pid)
        t_cont = time.monotonic()
        wait_for(lambda: instance(client)["stalled"] is False, 60, "the stall to clear")
        print(f"SIGCONT -> cleared: {time.monotonic() - t_cont:.1f} s")
        (cleared,) = wait_for(lambda: events(client, "stall_cleared"), 10, "stall_cleared")
        assert cleared["why"] in ("progress", "idle") and cleared["lasted_s"] >= STALL_AFTER_S
        load.join(300)
        assert load.answers == [200] * len(load.threads), load.answers
        assert instance(client)["restarts"] == 0 and instance(client)["pid"] == api_pid

        # 3. restart.on_stall = true (an update: no restart), then freeze again.
        layout.write_text(
            layout_text(tiny_model, port, vllm_env, metrics_port, ", on_stall = true")
        )
        up = vsup(home, "up", str(layout), "--detach", "--wait", "--yes", "--timeout", "400")
        assert up.returncode == 0, up.stdout + up.stderr
        assert instance(client)["pid"] == api_pid
        pgid = os.getpgid(api_pid)
        load, core_pid, t_stop = freeze_under_load(port, api_pid, stopped)
        (restart,) = wait_for(
            lambda: events(client, "stall_restart"), STALL_AFTER_S + 30, "stall_restart"
        )
        print(f"SIGSTOP -> stall_restart: {time.monotonic() - t_stop:.1f} s")
        assert "no token processed" in restart["why"] and restart["pid"] == api_pid
        back = wait_for(
            lambda: (lambda i: i if i["state"] == "ready" and i["pid"] != api_pid else None)(
                instance(client)
            ),
            400,
            "a new ready run",
            interval=1.0,
        )
        print(f"SIGSTOP -> ready again: {time.monotonic() - t_stop:.1f} s")
        assert back["restarts"] == 1 and back["last_exit"]["reason"] == "stalled"
        exits = [e for e in events(client, "exit") if e["reason"] == "stalled"]
        assert len(exits) == 1 and exits[0]["pid"] == api_pid
        scheduled = events(client, "restart_scheduled")
        assert [e["reason"] for e in scheduled] == ["stalled"]
        assert not psutil.pid_exists(core_pid) or psutil.Process(core_pid).status() == "zombie"
        stopped.remove(core_pid)
        left = [p.pid for p in psutil.process_iter() if _pgid(p.pid) == pgid]
        assert left == [], f"left of the frozen run: {left}"
        load.join(60)  # its requests failed with the run; the threads end
    finally:
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        client.close()
        down = vsup(home, "down", "--yes", timeout=180)
        assert down.returncode == 0, down.stdout + down.stderr


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None
