"""A real vLLM (CPU build) started by `vsup up` from a hub id: the daemon pulls the tiny gated
model from the fake hub with the token the layout names, then vLLM loads the local snapshot
offline (HF_HUB_OFFLINE=1, no request of its own at the hub, no token in its environment),
serves it under the layout's served-model-name and answers a completion asked with that name."""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from datetime import datetime

import psutil
import pytest

from vsup.control.client import JsonClient

from tests.conftest import fork_core_env, free_port
from tests.conftest import run_vsup as vsup
from tests.integration.control.test_cli import cli_home  # noqa: F401 (fixture)
from tests.integration.pull.conftest import DENIED, TOKEN
from tests.integration.pull.test_pull_cli import VLLM_FILES
from tests.integration.pull.test_up_pull import journal

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]


def environ(pid: int) -> dict[str, str]:
    """/proc/PID/environ: the environment the process was started with."""
    with open(f"/proc/{pid}/environ", "rb") as f:
        items = f.read().decode(errors="replace").split("\0")
    return dict(item.partition("=")[::2] for item in items if item)


def completion(port: int, model: str) -> int:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        data=json.dumps({"model": model, "prompt": "the supervisor", "max_tokens": 5}).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            answer = json.load(r)
            assert answer["choices"][0]["text"] is not None
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_real_vllm_starts_offline_from_the_pulled_snapshot(
    cli_home,  # noqa: F811
    hub,
    hf_cache,
    tmp_path,
    monkeypatch,
):
    port = free_port()
    cmd = json.dumps([sys.executable, "-m", "vllm.entrypoints.openai.api_server"])
    # the EngineCore forked, as on a GPU (tests/support/forkcore; tests/conftest.py `vllm_env`)
    fork = "".join(f', {k} = "{v}"' for k, v in fork_core_env().items())
    path = tmp_path / "hub-model.toml"
    path.write_text(
        f"""[layout]
name = "from-the-hub"

[defaults]
model = "gated/llama"
hf_token_env = "MY_HUB_TOKEN"
command = {cmd}
host = "127.0.0.1"
args = {{ dtype = "float32", enforce-eager = true, max-model-len = 512, served-model-name = "tiny" }}
env = {{ VLLM_CPU_KVCACHE_SPACE = "1", TOKENIZERS_PARALLELISM = "false", VLLM_ENABLE_V1_MULTIPROCESSING = "0", OMP_WAIT_POLICY = "PASSIVE"{fork} }}
start_timeout_s = 600

[[instance]]
name = "cpu0"
gpus = []
port = {port}
"""
    )
    # VLLM_ENABLE_V1_MULTIPROCESSING=0 (one-process mode, tests/conftest.py `vllm_env`): the
    # worker runs inside the EngineCore, a vLLM import less per start; what is tested is the
    # start from the pulled snapshot, and the engine is still a process of its own whose
    # environment is checked below.

    # the daemon (started by `vsup up`) inherits both: the token the layout names, and a
    # huggingface_hub default the hub refuses for this model (the pull must not use it)
    monkeypatch.setenv("MY_HUB_TOKEN", TOKEN)
    monkeypatch.setenv("HF_TOKEN", DENIED)
    res = vsup(cli_home, "up", str(path), "--detach", "--wait", "--timeout", "600", timeout=700)
    assert res.returncode == 0, (res.stdout, res.stderr)
    assert "pulled gated/llama" in res.stdout and "cpu0: ready" in res.stdout
    before = len(hub.requests)
    # the pull's requests (the model's info and files) carried the token the layout names
    assert {r.token for r in hub.requests if "gated/llama" in r.path} == {TOKEN}

    # the model's processes (the API server and its engine core) hold no hub token
    with JsonClient(cli_home) as client:
        doc = client.status()
    (inst,) = doc["instances"]
    assert inst["served_model_name"] == "tiny"
    server = psutil.Process(inst["pid"])
    procs = [server, *server.children(recursive=True)]
    assert len(procs) >= 2, procs  # vLLM's engine core runs in a child process
    assert environ(server.pid).get("HF_HUB_OFFLINE") == "1"  # the environment vsup gave
    for proc in procs:
        env = environ(proc.pid)
        assert env, proc
        assert not {"MY_HUB_TOKEN", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"} & set(env), proc
        assert not [k for k, v in env.items() if TOKEN in v or DENIED in v], proc

    # served under the layout's name: a client asking for it gets 200, the hub id is unknown
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=30) as r:
        models = json.load(r)
    assert [m["id"] for m in models["data"]] == ["tiny"]
    assert completion(port, "tiny") == 200
    assert completion(port, "gated/llama") == 404

    # the pull fetched each file once; vLLM asked the hub for nothing: no request came after
    # the pull ended (vLLM started after it) and none came from vLLM's libraries
    for name in VLLM_FILES:
        assert len(hub.gets(name, "gated/llama")) == 1, name
    done = next(e for e in journal(cli_home) if e["kind"] == "pull_done")
    ended = datetime.fromisoformat(done["t"].replace("Z", "+00:00")).timestamp()
    assert not [r for r in hub.requests if r.wall > ended + 0.5], hub.requests
    assert not [r for r in hub.requests if "transformers" in (r.agent or "")]
    assert len(hub.requests) == before
    with JsonClient(cli_home) as client:
        cfg = client.config("cpu0")
        log = client.logs("cpu0")["text"]
    snap = next((hf_cache / "models--gated--llama" / "snapshots").iterdir())
    argv = cfg["argv"]
    assert argv[argv.index("--model") + 1] == str(snap)
    assert argv.count("--served-model-name") == 1
    assert argv[argv.index("--served-model-name") + 1] == "tiny"
    assert cfg["env"]["HF_HUB_OFFLINE"] == "1"
    assert str(snap) in log
