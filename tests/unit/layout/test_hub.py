"""`vsup plan` on a hub id without its weights: a local fake hub speaking the hub's file API.

The fake answers what huggingface_hub asks: HEAD/GET `/{repo}/resolve/{revision}/{file}` (with
`Range`, `ETag`, `X-Repo-Commit`, and the hub's `X-Error-Code` on 404/401) and
`/api/models/{repo}`. `HF_ENDPOINT` points vsup at it; nothing leaves 127.0.0.1.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.conftest import outside_cwd

COMMIT = "0123456789abcdef0123456789abcdef01234567"
GATED = "org/gated-model"
CONFIG = {
    "architectures": ["GptOssForCausalLM"],
    "model_type": "gpt_oss",
    "hidden_size": 2880,
    "head_dim": 64,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "num_hidden_layers": 4,
    "layer_types": ["sliding_attention", "full_attention"] * 2,
    "sliding_window": 128,
    "num_local_experts": 32,
    "vocab_size": 201088,
    "max_position_embeddings": 131072,
    "torch_dtype": "bfloat16",
}
TENSOR_BYTES = 3 * 2**20  # more than the 100 kB huggingface_hub reads for a header


def safetensors_file(tensors: dict[str, tuple[str, list[int], int]]) -> bytes:
    """A real safetensors file: 8-byte header length, JSON header, zeroed tensor data."""
    header, offset = {}, 0
    for name, (dtype, shape, nbytes) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + bytes(offset)


REPO_FILES = {
    "org/tiny-oss": {
        "config.json": json.dumps(CONFIG).encode(),
        "model.safetensors": safetensors_file(
            {
                "model.embed_tokens.weight": ("BF16", [768, 2048], TENSOR_BYTES // 2),
                "lm_head.weight": ("BF16", [768, 2048], TENSOR_BYTES // 2),
            }
        ),
    },
}


class FakeHub(BaseHTTPRequestHandler):
    served: dict[str, int] = {}  # path -> body bytes sent

    def log_message(self, *args):  # quiet
        pass

    def _repo_file(self) -> tuple[str, str] | None:
        parts = self.path.split("?")[0].lstrip("/").split("/")
        if len(parts) >= 5 and parts[2] == "resolve":
            return "/".join(parts[:2]), "/".join(parts[4:])
        return None

    def _error(self, status: int, code: str, message: str) -> None:
        self.send_response(status)
        self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _answer(self, head: bool) -> None:
        if self.path.startswith("/api/models/"):
            repo = self.path[len("/api/models/") :].split("?")[0].strip("/")
            if repo not in REPO_FILES:
                return self._error(404, "RepoNotFound", "Repository not found")
            body = json.dumps(
                {
                    "id": repo,
                    "sha": COMMIT,
                    "siblings": [{"rfilename": f} for f in REPO_FILES[repo]],
                }
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head:
                self.wfile.write(body)
            return None
        found = self._repo_file()
        if found is None:
            return self._error(404, "EntryNotFound", "no such route")
        repo, name = found
        if repo == GATED:
            return self._error(401, "GatedRepo", "Access to model org/gated-model is restricted")
        if repo not in REPO_FILES:
            return self._error(401, "RepoNotFound", "Repository Not Found")
        data = REPO_FILES[repo].get(name)
        if data is None:
            return self._error(404, "EntryNotFound", "Entry not found")
        start, end = 0, len(data) - 1
        rng = self.headers.get("Range") or self.headers.get("range")
        status = 200
        if rng and rng.startswith("bytes="):
            lo, _, hi = rng[6:].partition("-")
            start, end = int(lo), min(int(hi) if hi else len(data) - 1, len(data) - 1)
            status = 206
        body = data[start : end + 1]
        self.send_response(status)
        self.send_header("ETag", '"' + hashlib.sha256(data).hexdigest() + '"')
        self.send_header("X-Repo-Commit", COMMIT)
        self.send_header("Accept-Ranges", "bytes")
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
        self.send_header("Content-Length", str(len(body) if not head else len(data)))
        self.end_headers()
        if not head:
            self.wfile.write(body)
            FakeHub.served[name] = FakeHub.served.get(name, 0) + len(body)
        return None

    def do_HEAD(self):
        self._answer(head=True)

    def do_GET(self):
        self._answer(head=False)


@pytest.fixture
def hub():
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeHub)
    FakeHub.served = {}
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "VSUP_"))}
    e.update(
        {
            "VSUP_HOME": str(tmp_path / "home"),
            "HF_HOME": str(tmp_path / "hf"),
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "HF_HUB_DISABLE_PROGRESS_BARS": "1",
            "HF_HUB_ETAG_TIMEOUT": "5",
            "HF_HUB_DOWNLOAD_TIMEOUT": "5",
        }
    )
    return e


def plan(model: str, env: dict[str, str], *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "vsup",
            "plan",
            "--model",
            model,
            "--gpus",
            "0",
            "--gpu",
            "H200",
            "--max-model-len",
            "8192",
            *extra,
        ],
        cwd=outside_cwd(),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_plans_a_hub_id_from_config_and_headers_without_the_weights(hub, env, tmp_path):
    env["HF_ENDPOINT"] = hub
    r = plan("org/tiny-oss", env)
    assert r.returncode == 0, r.stderr
    # weights: the header's tensor bytes, read with range requests
    assert "weights    0.00 GiB (safetensors headers (1 files))" in r.stderr
    assert FakeHub.served["model.safetensors"] < 200_000  # the header, never the 3 MiB of data
    # KV from the config: 2 full + 2 sliding layers share a pool of 2-layer slots
    assert "2 full + 2 sliding (window 128) layers" in r.stderr
    assert "4.0 KiB per token per GPU" in r.stderr
    assert f"the hub ({hub})" in r.stderr
    cached = tmp_path / "home" / "cache" / "hub" / "org--tiny-oss.json"
    doc = json.loads(cached.read_text())
    assert doc["config"]["num_hidden_layers"] == 4 and doc["weights"]["bytes"] == TENSOR_BYTES

    # the next plan needs no hub: vsup's cache answers (even offline)
    env["HF_HUB_OFFLINE"] = "1"
    FakeHub.served = {}
    r = plan("org/tiny-oss", env)
    assert r.returncode == 0, r.stderr
    assert "vsup's cache of the hub's files" in r.stderr and FakeHub.served == {}


def test_unknown_and_gated_models_say_what_to_do(hub, env):
    env["HF_ENDPOINT"] = hub
    r = plan("org/no-such-model", env)
    assert r.returncode == 2
    assert "has no model org/no-such-model" in r.stderr and "--params" in r.stderr
    r = plan(GATED, env)
    assert r.returncode == 2 and "gated" in r.stderr and "HF_TOKEN" in r.stderr


def test_unreachable_hub_and_offline_mode(env):
    env["HF_ENDPOINT"] = "http://127.0.0.1:9"  # discard port: nothing listens
    r = plan("org/tiny-oss", env)
    assert r.returncode == 2, r.stderr
    assert "cannot be reached" in r.stderr and "--params B (billions)" in r.stderr
    env["HF_HUB_OFFLINE"] = "1"
    r = plan("org/tiny-oss", env)
    assert r.returncode == 2 and "HF_HUB_OFFLINE is set" in r.stderr
    # --params and --dtype still plan it, without KV figures
    r = plan("org/tiny-oss", env, "--params", "20", "--dtype", "mxfp4")
    assert r.returncode == 0, r.stderr
    assert "KV tokens are unknown" in r.stderr


def test_the_local_hf_cache_comes_first(hub, env, tmp_path):
    snap = tmp_path / "hf" / "hub" / "models--org--tiny-oss" / "snapshots" / COMMIT
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps({**CONFIG, "num_hidden_layers": 2}))
    env["HF_ENDPOINT"] = hub
    r = plan("org/tiny-oss", env)
    assert r.returncode == 0, r.stderr
    assert f"local files ({snap})" in r.stderr and FakeHub.served == {}
    assert "1 full + 1 sliding" in r.stderr


def test_validation_reads_vsups_cache_but_never_the_hub(tmp_path, monkeypatch):
    from vsup.layout.hub import HubModel, WeightSummary, _write_cache
    from vsup.layout.modelinfo import model_info

    monkeypatch.setenv("VSUP_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    assert model_info("org/tiny-oss").config is None  # nothing cached: no network either
    _write_cache("org/tiny-oss", HubModel(CONFIG, WeightSummary(1, 10, 5, "BF16"), "test"))
    info = model_info("org/tiny-oss")
    assert info.config == CONFIG and info.safetensors.bytes == 10
    assert "vsup's cache" in info.source


def test_without_huggingface_hub_the_message_says_so(tmp_path, monkeypatch):
    from vsup.layout.hub import hub_model

    monkeypatch.setenv("VSUP_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import fails as on a bare node
    found = hub_model("org/tiny-oss")
    assert found.config is None and "huggingface_hub is not installed" in (found.problem or "")
