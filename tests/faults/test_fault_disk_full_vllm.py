"""The full-disk case with a real CPU vLLM, where vLLM's own behaviour matters: its log file is
on the full disk too. A SIGKILLed vLLM is swept (EngineCore), restarted, and serves again
although neither its log, nor the journal, nor the state file can grow."""

from __future__ import annotations

import json
import os
import signal
import sys

import httpx
import pytest

from tests.conftest import daemon_status, free_port
from tests.faults.helpers import alive, instance, vsup, wait_for
from tests.faults.test_fault_disk_full import fill

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]
# The worker inside its EngineCore (tests/conftest.py, vllm_env): what is tested is the full disk,
# the kill and the restart; a SIGKILLed API server still leaves its EngineCore to sweep.
VLLM_ONE_PROCESS = True


def polled(home) -> dict:
    """cpu0's entry of the status document, in this process (`daemon_status`): the restart is
    waited for with a poll a second (one CLI call below still reads it on the full disk)."""
    return {i["name"]: i for i in daemon_status(home)["instances"]}["cpu0"]


def test_a_killed_vllm_restarts_and_serves_on_a_full_disk(
    tmpfs_home, tmp_path, tiny_model, vllm_env
):
    home = tmpfs_home
    port = free_port()
    env = ", ".join(f'{k} = "{v}"' for k, v in vllm_env.items())
    cmd = json.dumps([sys.executable, "-m", "vllm.entrypoints.openai.api_server"])
    layout = tmp_path / "cpu.toml"
    layout.write_text(
        f"""[layout]
name = "cpu-full-disk"

[defaults]
model = "{tiny_model}"
command = {cmd}
host = "127.0.0.1"
args = {{ dtype = "float32", enforce-eager = true, max-model-len = 512 }}
env = {{ {env} }}
restart = {{ policy = "on-failure", backoff_s = 1, backoff_max_s = 5, stable_s = 600, max_failures = 5 }}

[[instance]]
name = "cpu0"
gpus = []
port = {port}
"""
    )
    up = vsup(home, "up", str(layout), "--detach", "--wait", "--timeout", "240", timeout=300)
    assert up.returncode == 0, up.stdout + up.stderr
    first = polled(home)

    fill(home)
    os.kill(first["pid"], signal.SIGKILL)
    back = wait_for(
        lambda: (i := polled(home))["state"] == "ready" and i["pid"] != first["pid"] and i,
        300,
        "cpu0 (real vLLM) to be restarted and ready on the full disk",
        interval=1.0,
    )
    # and `vsup status` itself answers on the full disk, as every poll above did until they
    # went in-process: the same restarted instance
    shown = instance(home, "cpu0")
    assert (shown["state"], shown["pid"]) == ("ready", back["pid"]), shown
    assert alive(back["pid"]) and back["restarts"] >= 1
    assert not alive(first["pid"])
    base = f"http://127.0.0.1:{port}"
    model = httpx.get(f"{base}/v1/models", timeout=30).json()["data"][0]["id"]
    answer = httpx.post(
        f"{base}/v1/completions",
        json={"model": model, "prompt": "the quick brown fox", "max_tokens": 5},
        timeout=120,
    )
    assert answer.status_code == 200, answer.text
