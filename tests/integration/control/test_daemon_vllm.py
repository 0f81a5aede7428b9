"""The control plane against real vLLM servers (CPU build), driven through the real CLI.

One scenario, because each vLLM start costs ~30 s and 2 GiB here:
two `vsup up --detach --wait` at once start one daemon and two instances; SIGKILL of the daemon
leaves the instances serving; the next `vsup status` starts a daemon that re-adopts them (same
pid, still ready, no restart counted); an instance killed while no daemon watched is found
vanished and restarted; an adopted instance's later death is detected and its restart scheduled
and queued behind its co-tenant's start; real telemetry reaches `status` and the Prometheus
export; `vsup down` leaves no process behind.

vLLM runs in one-process mode (VLLM_ONE_PROCESS, tests/conftest.py `vllm_env`): API server +
`VLLM::EngineCore` with the model worker inside, the tree of a GPU server at TP1. What is
adopted, watched and swept here is the API server's process group, and that tree still has a
child the SIGKILL of the server orphans (the EngineCore), which `vsup down` must not leave
behind. The three-level CPU tree (a `VLLM::Worker` under the EngineCore) stays covered by
tests/integration/engine/test_vllm.py (its sweep) and test_cpu_node_vllm.py.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import httpx
import psutil
import pytest

from vsup import paths
from vsup.control.client import JsonClient
from vsup.engine import rpcdir

from tests.conftest import free_port, outside_cwd, run_vsup

pytestmark = pytest.mark.vllm
VLLM_ONE_PROCESS = True


vsup = partial(run_vsup, timeout=120)


def start_vsup(home: Path, *args: str) -> subprocess.Popen:
    env = dict(os.environ, VSUP_HOME=str(home))
    return subprocess.Popen(
        [sys.executable, "-m", "vsup", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=outside_cwd(),
    )


def sockets(where: Path) -> set[str]:
    if not where.is_dir():
        return set()
    return {p.name for p in where.iterdir() if stat.S_ISSOCK(p.lstat().st_mode)}


def status(home: Path) -> dict:
    proc = vsup(home, "status", "--json")
    # 1 is "not all ready"; an error is 1 too, but then there is no document: say what it said
    assert proc.returncode in (0, 1) and proc.stdout.strip(), (proc.returncode, proc.stderr)
    return json.loads(proc.stdout)


def write_layout(
    path: Path, model: Path, ports: list[int], vllm_env: dict, metrics_port: int
) -> None:
    env = ", ".join(f'{k} = "{v}"' for k, v in vllm_env.items())
    cmd = json.dumps([sys.executable, "-m", "vllm.entrypoints.openai.api_server"])
    text = f"""
[layout]
name = "cpu-pair"
metrics_listen = "127.0.0.1:{metrics_port}"

[defaults]
model = "{model}"
command = {cmd}
host = "127.0.0.1"
args = {{ dtype = "float32", enforce-eager = true, max-model-len = 512 }}
env = {{ {env} }}
restart = {{ policy = "on-failure", backoff_s = 1, backoff_max_s = 5, stable_s = 600, max_failures = 5 }}
"""
    for i, port in enumerate(ports):
        text += f"""
[[instance]]
name = "cpu{i}"
gpus = []
port = {port}
"""
    path.write_text(text)


def daemons_of(home: Path) -> list[psutil.Process]:
    """Live daemon processes serving `home` (a spawned daemon runs in VSUP_HOME)."""
    out = []
    for p in psutil.process_iter(["cmdline", "cwd", "status"]):
        if (
            (p.info["cmdline"] or [])[-3:] == ["-m", "vsup", "daemon"]
            and p.info["cwd"] == str(home)
            and p.info["status"] != psutil.STATUS_ZOMBIE
        ):
            out.append(p)
    return out


def completion(port: int) -> httpx.Response:
    base = f"http://127.0.0.1:{port}"
    model = httpx.get(f"{base}/v1/models", timeout=30).json()["data"][0]["id"]
    return httpx.post(
        f"{base}/v1/completions",
        json={"model": model, "prompt": "the quick brown fox", "max_tokens": 5},
        timeout=60,
    )


def journal(home: Path) -> list[dict]:
    return [json.loads(x) for x in (home / "journal.jsonl").read_text().splitlines() if x.strip()]


def wait_for(pred, timeout: float, what: str, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def group_alive(pgid: int) -> list[int]:
    left = []
    for p in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                left.append(p.pid)
        except (ProcessLookupError, psutil.Error):
            pass
    return left


# Three vLLM starts (two at once, a vanished one; the killed adopted one is stopped while it
# waits for its turn): its own waits (300 s for `up`, 120 s for an exit) exceed the suite's
# 300 s default on a loaded 2-core machine.
@pytest.mark.timeout(900)
def test_daemon_crash_readoption_and_down(vsup_home, tiny_model, vllm_env, tmp_path):
    home = vsup_home
    ports = [free_port(), free_port()]
    layout = tmp_path / "pair.toml"
    metrics_port = free_port()
    write_layout(layout, tiny_model, ports, vllm_env, metrics_port)
    pgids: set[int] = set()
    try:
        # Two `up` at once: one daemon, each instance once.
        a = start_vsup(home, "up", str(layout), "--detach", "--wait", "--timeout", "300")
        b = start_vsup(home, "up", str(layout), "--detach", "--wait", "--timeout", "300")
        out_a, err_a = a.communicate(timeout=400)
        out_b, err_b = b.communicate(timeout=400)
        assert a.returncode == 0, out_a + err_a
        assert b.returncode == 0, out_b + err_b
        assert "start: cpu0, cpu1" in out_a + out_b  # said before doing it
        assert len(daemons_of(home)) == 1
        doc = status(home)
        insts = {i["name"]: i for i in doc["instances"]}
        assert [insts[n]["state"] for n in ("cpu0", "cpu1")] == ["ready", "ready"]
        for port in ports:
            servers = [
                p
                for p in psutil.process_iter(["cmdline"])
                if "--port" in (p.info["cmdline"] or []) and str(port) in (p.info["cmdline"] or [])
            ]
            assert len(servers) == 1, f"port {port}: {len(servers)} API servers"
        # vLLM's IPC sockets are in each instance's own directory (engine/rpcdir.py), not in
        # /tmp, where every killed run used to leave them for good
        rpc = {n: rpcdir.rpc_dir(paths.logs_dir(home) / n) for n in ("cpu0", "cpu1")}
        for name, where in rpc.items():
            assert sockets(where), f"{name}: no vLLM socket in {where}"

        # Real telemetry reaches the status and the Prometheus export.
        def telemetry():
            i = {x["name"]: x for x in status(home)["instances"]}["cpu0"]
            return i if i["kv_cache_usage"] is not None else None

        cpu0 = wait_for(telemetry, 10, "a scrape of cpu0", interval=0.5)
        assert cpu0["kv_capacity_tokens"] and cpu0["backend"] == "CPU_ATTN"
        assert cpu0["requests_running"] == 0 and cpu0["hbm_source"] == "unavailable"
        exported = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text
        assert 'vsup_instance_kv_cache_usage_ratio{name="cpu0"}' in exported
        assert 'vsup_instance_up{name="cpu1"} 1.0' in exported
        pids = {n: insts[n]["pid"] for n in insts}
        pgids = {os.getpgid(pid) for pid in pids.values()}
        restarts = {n: insts[n]["restarts"] for n in insts}
        old_daemon = doc["supervisor"]["pid"]

        # SIGKILL the daemon: the instances keep serving.
        os.kill(old_daemon, signal.SIGKILL)
        wait_for(
            lambda: (
                not psutil.pid_exists(old_daemon)
                or psutil.Process(old_daemon).status() == psutil.STATUS_ZOMBIE
            ),
            10,
            "daemon death",
        )
        resp = completion(ports[0])
        assert resp.status_code == 200, resp.text
        # While no daemon watches, cpu1's whole process group dies.
        pgid1 = os.getpgid(pids["cpu1"])
        os.killpg(pgid1, signal.SIGKILL)
        wait_for(lambda: group_alive(pgid1) == [], 10, "cpu1's processes to die")

        # `vsup daemon --detach` brings a daemon back (read-only commands start none); it
        # re-adopts cpu0 as it was.
        assert vsup(home, "daemon", "--detach").returncode == 0
        # the daemon answers once it has re-adopted; cpu0 shows ready after its first health
        # check, which the restore waits for at most 5 s (longer beside cpu1's vLLM start)
        doc = wait_for(
            lambda: (
                (d := status(home))
                and {i["name"]: i for i in d["instances"]}["cpu0"]["state"] == "ready"
                and d
            ),
            60,
            "cpu0 re-adopted and ready",
        )
        assert doc["supervisor"]["pid"] != old_daemon
        insts = {i["name"]: i for i in doc["instances"]}
        assert insts["cpu0"]["pid"] == pids["cpu0"]
        assert insts["cpu0"]["state"] == "ready"
        assert insts["cpu0"]["restarts"] == restarts["cpu0"]
        assert len(daemons_of(home)) == 1
        # cpu1 vanished: it is treated as exited and restarted by its policy.
        assert insts["cpu1"]["pid"] != pids["cpu1"]
        assert insts["cpu1"]["state"] in ("starting", "backoff", "ready")
        adopts = {e["instance"]: e["adopted"] for e in journal(home) if e["kind"] == "adopt"}
        assert adopts == {"cpu0": True, "cpu1": False}

        # An adopted instance (not the daemon's child) dying is seen at once and restarted.
        # "At once": through its pidfd, so the exit is journaled with no failed health check
        # before it (the health path would go ready -> unhealthy first). How fast a pidfd
        # sees an exit is benchmarks.crash_detect's (docs/benchmarks.md).
        before_kill = len(journal(home))
        os.kill(pids["cpu0"], signal.SIGKILL)

        def exit_event():
            return [
                e
                for e in journal(home)[before_kill:]
                if e["kind"] == "exit" and e["instance"] == "cpu0"
            ]

        seen = wait_for(exit_event, 120, "the daemon to see cpu0 die", interval=0.2)[0]
        assert seen["pid"] == pids["cpu0"], seen
        assert seen["reason"]  # a non-child's status is unknown; its log says why
        between = journal(home)[before_kill:]
        between = between[: between.index(seen)]
        assert not [
            e
            for e in between
            if e.get("instance") == "cpu0"
            and (e["kind"] == "unhealthy" or (e["kind"] == "state" and e.get("to") == "unhealthy"))
        ], between

        # Restarted by its policy: scheduled at the exit, then queued behind cpu1's start
        # (restarting since the re-adoption, a vLLM start of 20 s or more), which holds the
        # device `cpu`: first for the stop turn that sweeps what the SIGKILL left of its run
        # (its EngineCore, orphaned), then for its start turn. Queued there, the adopted
        # instance's runner is in the loop every instance runs after an exit; a spawn and a
        # restarted vLLM's return to ready are test_vllm's (after a SIGKILL) and
        # test_stall_vllm's (after a stall restart). Waiting for the spawn here cost cpu1's
        # whole start. `vsup down` then has to sweep those orphans (checked below).
        def scheduled():
            return [
                e
                for e in journal(home)[before_kill:]
                if e["kind"] == "restart_scheduled" and e["instance"] == "cpu0"
            ]

        plan = wait_for(scheduled, 30, "cpu0's restart to be scheduled")[0]
        after = journal(home)[before_kill:]
        assert after.index(plan) > after.index(seen), after  # decided at the exit
        assert plan["reason"] == seen["reason"], plan

        def queued_or_spawned():
            with JsonClient(home) as client:
                i = {x["name"]: x for x in client.status()["instances"]}
            c0 = i["cpu0"]
            if c0["pid"] is None and "cpu1" in ((c0["wait"] or {}).get("instances") or []):
                return i
            return i if c0["pid"] not in (None, pids["cpu0"]) else None

        now = wait_for(queued_or_spawned, 120, "cpu0's restart to queue or spawn", interval=0.5)
        back = now["cpu0"]
        if back["pid"] is None:
            # queued: not spawned (a restart is counted at its spawn), waiting for cpu1's start
            assert back["state"] in ("backoff", "starting"), now
            assert back["wait"]["kind"] == "co_tenant", now
            assert back["last_exit"]["reason"] == seen["reason"], now
            assert back["restarts"] == restarts["cpu0"], now
            assert now["cpu1"]["state"] == "starting", now
        else:
            # cpu1 was ready before cpu0's turn came: spawned at once, as the next run
            assert back["restarts"] == restarts["cpu0"] + 1, now
            assert back["state"] in ("starting", "ready"), now

        # `vsup down`: every instance stopped, the daemon gone, no process left.
        doc = status(home)
        for inst in doc["instances"]:
            if inst["pid"]:
                pgids.add(os.getpgid(inst["pid"]))
        down = vsup(home, "down", timeout=300)
        assert down.returncode == 0, down.stdout + down.stderr
        assert daemons_of(home) == []
        for pgid in pgids:
            assert group_alive(pgid) == [], f"process group {pgid} left behind"
        assert not (home / "vsup.sock").exists()
        # nothing is left of the runs' sockets: two SIGKILLed runs', and the last ones'
        assert {n: sockets(where) for n, where in rpc.items()} == {"cpu0": set(), "cpu1": set()}
        # nor their directories (one per instance in /tmp where the log path is long)
        assert [where for where in rpc.values() if where.exists()] == []
    finally:
        if daemons_of(home):
            vsup(home, "down", timeout=300)
        for p in daemons_of(home):
            p.kill()
        for pgid in pgids:
            for pid in group_alive(pgid):
                with __import__("contextlib").suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
