"""`vsup up` of a layout naming a hub model: the daemon pulls it once, visibly, then starts
every replica from the local snapshot offline; a pull that fails leaves its instances stopped
with the reason. The replicas are vLLM emulators with `--load-model` (tests/programs): like
vLLM they look for the model's files before they listen, and fetch a hub id themselves -
so a replica that downloaded on its own would show at the fake hub. test_pull_vllm.py starts a
real vLLM from a pulled snapshot."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vsup.control.client import JsonClient

from tests.conftest import free_port
from tests.conftest import run_vsup as vsup
from tests.integration.control.test_cli import cli_home, popen  # noqa: F401 (fixture)
from tests.integration.pull.conftest import TOKEN
from tests.integration.pull.test_pull_cli import VLLM_FILES, small_disk  # noqa: F401
from tests.unit.control.helpers import EMULATOR

pytestmark = pytest.mark.timeout(300)


def layout(model: str, n: int, extra: str = "") -> str:
    cmd = json.dumps([sys.executable, str(EMULATOR)])
    text = f"""[layout]
name = "pulled"

[defaults]
model = "{model}"
command = {cmd}
host = "127.0.0.1"
health_interval_s = 0.2
stop_grace_s = 5
args = {{ load-model = true }}
restart = {{ policy = "on-failure", backoff_s = 0.2, backoff_max_s = 1, max_failures = 2 }}
{extra}
"""
    for i in range(n):
        text += f'\n[[instance]]\nname = "r{i}"\ngpus = []\nport = {free_port()}\n'
    return text


def journal(home: Path) -> list[dict]:
    return [json.loads(line) for line in (home / "journal.jsonl").read_text().splitlines()]


def test_eight_replicas_of_one_hub_model_fetch_each_file_once(
    cli_home,  # noqa: F811
    hub,
    hf_cache,
    tmp_path,
    monkeypatch,
):
    home = cli_home
    # huggingface_hub gives up on a read after 10 s and resumes with a new GET, which the hold
    # does not stop: on a loaded machine the steps below took longer and the pull ended early
    monkeypatch.setenv("HF_HUB_DOWNLOAD_TIMEOUT", "300")
    path = tmp_path / "eight.toml"
    path.write_text(layout("tiny/llama", 8))
    # the weights stop half-way until the test has watched the pull
    hub.hold("tiny/llama", "model.safetensors", 512 * 1024)
    first = vsup(home, "up", str(path), "--detach")
    assert first.returncode == 0, first.stderr
    assert f"pull first: tiny/llama into {hf_cache}" in first.stdout
    assert "pulling tiny/llama in the daemon" in first.stdout

    # while it pulls: a `pulling` phase on the pull, on each instance, in `vsup status`
    seen = None
    with JsonClient(home) as client:
        deadline = time.monotonic() + 60
        while seen is None and time.monotonic() < deadline:
            doc = client.status()
            pulls = doc["pulls"]
            weights = [f for f in pulls[0]["current"] if f == "model.safetensors"] if pulls else []
            if weights and pulls[0]["state"] == "pulling":
                seen = doc
            time.sleep(0.05)
    assert seen is not None, "never saw the pull in progress"
    (pull,) = seen["pulls"]
    assert pull["model"] == "tiny/llama" and pull["instances"] == [f"r{i}" for i in range(8)]
    assert pull["bytes_done"] < pull["bytes_total"]
    for inst in seen["instances"]:
        assert inst["state"] == "stopped" and inst["pull"]["state"] == "pulling", inst
    text = vsup(home, "status").stdout
    assert "PULL tiny/llama for r0, r1" in text and "(pulling" in text, text

    # a second `vsup up` meanwhile joins the pull under way; --wait follows it to the end
    second_up = popen(home, "up", str(path), "--detach", "--wait", "--timeout", "120")
    deadline = time.monotonic() + 60
    while sum(1 for e in journal(home) if e.get("action") == "apply") < 2:
        assert second_up.poll() is None, second_up.communicate()
        assert time.monotonic() < deadline, "the second apply never reached the daemon"
        time.sleep(0.1)
    hub.release()
    out, err = second_up.communicate(timeout=180)
    second = subprocess.CompletedProcess(second_up.args, second_up.returncode, out, err)
    assert second.returncode == 0, second.stderr
    assert "pulled tiny/llama" in second.stdout
    assert all(f"r{i}: ready" in second.stdout for i in range(8)), second.stdout

    # one GET per file for eight replicas; nothing vLLM does not load
    for name in VLLM_FILES:
        assert len(hub.gets(name, "tiny/llama")) == 1, (name, hub.gets(name))
    fetched = {g.path.rsplit("/", 1)[-1] for g in hub.gets(model="tiny/llama")}
    assert fetched == VLLM_FILES
    snap = next((hf_cache / "models--tiny--llama" / "snapshots").iterdir())
    events = journal(home)
    assert [e["kind"] for e in events if e["kind"] in ("pull_start", "pull_done")] == [
        "pull_start",
        "pull_done",
    ]
    done = next(e for e in events if e["kind"] == "pull_done")
    assert done["snapshot"] == str(snap)
    with JsonClient(home) as client:
        for i in range(8):
            cfg = client.config(f"r{i}")
            argv = cfg["argv"]
            assert argv[argv.index("--model") + 1] == str(snap)
            assert argv[argv.index("--served-model-name") + 1] == "tiny/llama"
            assert cfg["env"]["HF_HUB_OFFLINE"] == "1"
            log = client.logs(f"r{i}")["text"]
            assert f"emulator loaded model={snap} files=5" in log and "offline=1" in log, log
        status = client.status()
    assert status["pulls"][0]["state"] == "done"
    assert all(i["pull"] is None for i in status["instances"])

    # the next `vsup up` finds the model in the cache: nothing to pull, nothing restarts
    again = vsup(home, "up", str(path), "--detach", "--wait", "--timeout", "60")
    assert again.returncode == 0, again.stderr
    assert "pull first" not in again.stdout
    assert "unchanged: r0, r1, r2, r3, r4, r5, r6, r7" in again.stdout
    assert sum(len(hub.gets(n, "tiny/llama")) for n in VLLM_FILES) == len(VLLM_FILES)


def expect_not_started(home: Path, path: Path, reason: str) -> dict:
    res = vsup(home, "up", str(path), "--detach", "--wait", "--timeout", "90", timeout=150)
    assert res.returncode == 1, (res.stdout, res.stderr)
    assert f"failed ({reason})" in res.stderr and "not started" in res.stderr, res.stderr
    with JsonClient(home) as client:
        doc = client.status()
    for inst in doc["instances"]:
        assert inst["state"] == "stopped", inst
        assert inst["pull"]["state"] == "failed" and inst["pull"]["reason"] == reason, inst
    assert any(a["kind"] == "pull_failed" for a in doc["advice"]), doc["advice"]
    status = vsup(home, "status")
    assert status.returncode == 1 and "(pull failed)" in status.stdout, status.stdout
    return doc


def test_a_failed_pull_leaves_the_instances_stopped_with_its_reason(
    cli_home,  # noqa: F811
    hub,
    tmp_path,
    small_disk,  # noqa: F811
):
    home = cli_home
    gated = tmp_path / "gated.toml"
    gated.write_text(layout("gated/llama", 2, 'hf_token_env = "MY_HUB_TOKEN"'))
    os.environ.pop("MY_HUB_TOKEN", None)
    doc = expect_not_started(home, gated, "no_token")
    assert "MY_HUB_TOKEN" in doc["instances"][0]["pull"]["message"]

    anonymous = tmp_path / "anonymous.toml"
    anonymous.write_text(layout("gated/llama", 2))
    expect_not_started(home, anonymous, "unauthorized")

    full = tmp_path / "full.toml"
    full.write_text(layout("big/sharded", 2, f'env = {{ HF_HUB_CACHE = "{small_disk}" }}'))
    doc = expect_not_started(home, full, "no_space")
    assert f"more free space is needed in {small_disk}" in doc["pulls"][0]["message"]

    cut = tmp_path / "cut.toml"
    cut.write_text(layout("tiny/llama", 2))
    hub.cut("tiny/llama", "model.safetensors", 512 * 1024, then_down=True)
    expect_not_started(home, cut, "network")
    hub.up()

    # nothing was ever spawned: a failed pull is no crash loop
    assert not [e for e in journal(home) if e["kind"] in ("spawn", "exit", "restart_scheduled")]

    # with the token in the daemon's environment the gated model is pulled and serves
    assert vsup(home, "down", "--yes").returncode == 0
    os.environ["MY_HUB_TOKEN"] = TOKEN
    try:
        ok = vsup(home, "up", str(gated), "--detach", "--wait", "--timeout", "90", timeout=150)
    finally:
        os.environ.pop("MY_HUB_TOKEN", None)
    assert ok.returncode == 0, ok.stderr
    assert "r0: ready" in ok.stdout and "r1: ready" in ok.stdout
    with JsonClient(home) as client:
        env = client.config("r0")["env"]
    # pulled: vLLM runs offline and gets no token
    assert env["HF_HUB_OFFLINE"] == "1" and "HF_TOKEN" not in env
