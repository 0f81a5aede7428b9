"""A data-parallel instance with real vLLM (CPU build, `--data-parallel-size 2`) under vsup,
through the real CLI: its status (shape, one entry per rank with its EngineCore_DP process) and
what vsup does when one rank's EngineCore dies (the instance ends as one, the exit names the
rank, it restarts as a unit; the second death trips the breaker, and `failed_why` names it).

One vLLM server at a time (two ranks: about 6 GiB here); every process it started is killed by
process group at the end.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from functools import partial
from pathlib import Path

import pytest

from tests.conftest import free_port, run_vsup

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(2400)]


vsup = partial(run_vsup, timeout=1200)


def status(home: Path) -> dict:
    out = vsup(home, "status", "--json", timeout=60)
    return json.loads(out.stdout)["instances"][0]


def events(home: Path) -> list[dict]:
    return [json.loads(x) for x in (home / "journal.jsonl").read_text().splitlines()]


def wait_for(what: str, check, timeout: float):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def title(pid: int) -> str:
    """The process title ('' once the process is gone)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def ranks_seen(home: Path) -> dict | None:
    inst = status(home)
    ranks = inst["ranks"]
    if inst["state"] == "ready" and len(ranks) == 2 and all(r["alive"] for r in ranks):
        return inst
    return None


def test_dp_instance_status_and_a_dead_rank(vsup_home, tiny_model, vllm_env, tmp_path):
    home = vsup_home
    port = free_port()
    env = ", ".join(f'{k} = "{v}"' for k, v in vllm_env.items())
    cmd = json.dumps([sys.executable, "-m", "vllm.entrypoints.openai.api_server"])
    layout = tmp_path / "dp.toml"
    layout.write_text(
        f"""
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
restart = {{ policy = "on-failure", backoff_s = 1, backoff_max_s = 5, stable_s = 600, max_failures = 2 }}
"""
    )
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

        # one rank's EngineCore dies: vsup sees it at once, ends the server, names the rank
        victim = inst["ranks"][1]["pid"]
        t0 = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        seen = wait_for(
            "the rank_exit event",
            lambda: [e for e in events(home) if e.get("kind") == "rank_exit"],
            30,
        )
        t_seen = time.monotonic() - t0
        assert seen[0]["rank"] == 1 and seen[0]["pid"] == victim and seen[0]["run"] == 1
        exit_ev = wait_for(
            "the exit",
            lambda: [e for e in events(home) if e.get("kind") == "exit"],
            120,
        )[0]
        t_exit = time.monotonic() - t0
        assert exit_ev["reason"] == "engine_dead" and exit_ev["rank"] == 1
        kinds = [e["kind"] for e in events(home) if e.get("instance") == "dp2"]
        assert kinds.index("rank_exit") < kinds.index("unhealthy") < kinds.index("exit")
        # nothing of the first run is left: every rank and worker ended with the group
        assert not any("EngineCore_DP" in title(r["pid"]) for r in inst["ranks"])
        # restarted as a unit: a new API server with two new ranks
        again = wait_for("the restart", lambda: ranks_seen(home), 1100)
        assert again["pid"] != inst["pid"] and again["restarts"] == 1
        assert {r["pid"] for r in again["ranks"]}.isdisjoint({r["pid"] for r in inst["ranks"]})
        assert again["last_exit"]["rank"] == 1 and again["last_exit"]["reason"] == "engine_dead"
        print(
            f"\nDP=2, SIGKILL of EngineCore_DP1: seen by vsup after {t_seen:.2f} s, "
            f"instance ended {t_exit:.1f} s after the kill"
        )

        # the second death (max_failures = 2): failed, and failed_why says which rank
        os.kill(again["ranks"][0]["pid"], signal.SIGKILL)
        failed = wait_for(
            "the breaker",
            lambda: (i := status(home))["state"] == "failed" and i,
            120,
        )
        assert "data-parallel rank 0 died" in failed["failed_why"], failed["failed_why"]
        assert failed["last_exit"]["rank"] == 0
        assert [r["alive"] for r in failed["ranks"]] == [None, None]  # no run now
    finally:
        vsup(home, "down", "--yes", timeout=120)
        journal = home / "journal.jsonl"
        if journal.exists():
            for line in journal.read_text().splitlines():
                ev = json.loads(line)
                if ev.get("kind") == "spawn":
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(ev["pgid"], signal.SIGKILL)
