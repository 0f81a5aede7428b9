"""A real vLLM (CPU build) started by `vsup up` from a hub id: the daemon pulls the tiny model
from the fake hub, then vLLM loads the local snapshot offline (HF_HUB_OFFLINE=1, no request of
its own at the hub), serves it under the hub id and answers a completion."""

from __future__ import annotations

import json
import sys
import urllib.request
from datetime import datetime

import pytest

from vsup.control.client import Client

from tests.conftest import free_port
from tests.conftest import run_vsup as vsup
from tests.integration.control.test_cli import cli_home  # noqa: F401 (fixture)
from tests.integration.pull.test_pull_cli import VLLM_FILES
from tests.integration.pull.test_up_pull import journal

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]


def test_real_vllm_starts_offline_from_the_pulled_snapshot(cli_home, hub, hf_cache, tmp_path):  # noqa: F811
    port = free_port()
    cmd = json.dumps([sys.executable, "-m", "vllm.entrypoints.openai.api_server"])
    path = tmp_path / "hub-model.toml"
    path.write_text(
        f"""[layout]
name = "from-the-hub"

[defaults]
model = "tiny/llama"
command = {cmd}
host = "127.0.0.1"
args = {{ dtype = "float32", enforce-eager = true, max-model-len = 512 }}
env = {{ VLLM_CPU_KVCACHE_SPACE = "1", TOKENIZERS_PARALLELISM = "false" }}
start_timeout_s = 600

[[instance]]
name = "cpu0"
gpus = []
port = {port}
"""
    )
    res = vsup(cli_home, "up", str(path), "--detach", "--wait", "--timeout", "600", timeout=700)
    assert res.returncode == 0, (res.stdout, res.stderr)
    assert "pulled tiny/llama" in res.stdout and "cpu0: ready" in res.stdout
    before = len(hub.requests)

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=30) as r:
        models = json.load(r)
    assert [m["id"] for m in models["data"]] == ["tiny/llama"]
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        data=json.dumps(
            {"model": "tiny/llama", "prompt": "the supervisor", "max_tokens": 5}
        ).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        answer = json.load(r)
    assert answer["choices"][0]["text"] is not None

    # the pull fetched each file once; vLLM asked the hub for nothing: no request came after
    # the pull ended (vLLM started after it) and none came from vLLM's libraries
    for name in VLLM_FILES:
        assert len(hub.gets(name, "tiny/llama")) == 1, name
    done = next(e for e in journal(cli_home) if e["kind"] == "pull_done")
    ended = datetime.fromisoformat(done["t"].replace("Z", "+00:00")).timestamp()
    assert not [r for r in hub.requests if r.wall > ended + 0.5], hub.requests
    assert not [r for r in hub.requests if "transformers" in (r.agent or "")]
    assert len(hub.requests) == before
    with Client(cli_home) as client:
        cfg = client.config("cpu0")
        log = client.logs("cpu0")["text"]
    snap = next((hf_cache / "models--tiny--llama" / "snapshots").iterdir())
    assert cfg["argv"][cfg["argv"].index("--model") + 1] == str(snap)
    assert cfg["env"]["HF_HUB_OFFLINE"] == "1"
    assert str(snap) in log
