"""`vsup probe` on captured payloads, on garbage, and against a real HTTP server."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from vsup.cli import main
from vsup.snapshot import WIRE_KEYS

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "vllm-0.32-cpu"
INSTANCE_KEYS = set(WIRE_KEYS)  # schema 1: an instance is one flat object


def probe(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, Any, str]:
    code = main(["probe", *args, "--json"])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if out.strip() else None), err


def test_a_captured_payload_and_log_give_the_instance_view(capsys) -> None:
    code, doc, err = probe(
        capsys, "--metrics-file", str(FIX / "metrics_load.txt"), "--log-file", str(FIX / "load.log")
    )
    assert code == 0 and err == ""
    assert set(doc) == INSTANCE_KEYS
    assert doc["kv_cache_usage"] == 0.4 and doc["kv_capacity_tokens"] == 768
    assert doc["preemptions_total"] == 2.0
    assert (doc["requests_running"], doc["requests_waiting"]) == (1.0, 9.0)
    assert doc["generation_tokens_per_s"] is None and doc["preemptions_per_min"] is None
    assert (doc["backend"], doc["backend_source"], doc["backend_name"]) == (
        "CPU_ATTN",
        "default",
        "CPU_ATTN",
    )
    assert doc["model"].endswith("tiny-llama")
    assert doc["hbm_bytes"] is None and doc["hbm_source"] == "unavailable"


def test_a_real_cuda_log_adds_vllms_memory_account(capsys) -> None:
    cuda = FIX.parent / "vllm-0.26-cuda"
    code, doc, _ = probe(
        capsys,
        "--metrics-file",
        str(cuda / "metrics_kvload.txt"),
        "--log-file",
        str(cuda / "startup.log"),
    )
    assert code == 0 and set(doc) == INSTANCE_KEYS
    assert doc["backend"] == "FLASH_ATTN"
    for key in ("vllm_requested_hbm_bytes", "vllm_non_torch_bytes", "vllm_cudagraph_bytes"):
        assert doc[key] and doc[key] > 0
    # the CPU build logs no memory line: unknown, not zero
    _, cpu, _ = probe(
        capsys, "--metrics-file", str(FIX / "metrics_load.txt"), "--log-file", str(FIX / "load.log")
    )
    assert cpu["vllm_non_torch_bytes"] is None


def test_the_legacy_payload_reads_the_same(capsys) -> None:
    _c, new, _e = probe(capsys, "--metrics-file", str(FIX / "metrics_load.txt"))
    _c, old, _e = probe(capsys, "--metrics-file", str(FIX / "metrics_load_legacy_names.txt"))
    assert {k: v for k, v in old.items() if k != "name"} == {
        k: v for k, v in new.items() if k != "name"
    }


def test_the_flag_is_reported_when_no_log_says(capsys) -> None:
    _c, doc, _e = probe(
        capsys,
        "--metrics-file",
        str(FIX / "metrics_idle.txt"),
        "--attention-backend",
        "rocm_aiter_fa",
    )
    assert (doc["backend"], doc["backend_source"], doc["backend_name"]) == (
        "AITER MHA",
        "flag",
        "ROCM_AITER_FA",
    )


@pytest.mark.parametrize(
    "content",
    [b"", b"\x00\xff\xfe garbage", b"<html>nope</html>", b"vllm:kv_cache_usage_perc{{{ 1\n"],
)
def test_garbage_gives_nulls_a_message_and_no_traceback(
    capsys, tmp_path: Path, content: bytes
) -> None:
    f = tmp_path / "junk.txt"
    f.write_bytes(content)
    code, doc, err = probe(capsys, "--metrics-file", str(f), "--log-file", str(f))
    assert code == 1
    assert "holds no vLLM metrics" in err and "Traceback" not in err
    assert doc["kv_cache_usage"] is None and doc["preemptions_total"] is None


def test_missing_files_are_usage_errors(capsys, tmp_path: Path) -> None:
    code, doc, err = probe(capsys, "--metrics-file", str(tmp_path / "none.txt"))
    assert code == 2 and doc is None and "none.txt" in err
    code, doc, err = probe(
        capsys,
        "--metrics-file",
        str(FIX / "metrics_idle.txt"),
        "--log-file",
        str(tmp_path / "none.log"),
    )
    assert code == 2 and "none.log" in err


def test_url_and_file_together_or_neither_is_a_usage_error(capsys) -> None:
    assert main(["probe"]) == 2
    assert main(["probe", "http://127.0.0.1:1", "--metrics-file", "x"]) == 2
    assert "one of them" in capsys.readouterr().err


class _Server(ThreadingHTTPServer):
    payloads: list[bytes]
    health: int


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        if self.path.partition("?")[0].rstrip("/") == "/metrics":
            body = (
                self.server.payloads.pop(0)
                if len(self.server.payloads) > 1
                else self.server.payloads[0]
            )
            status = 200
        elif self.path == "/health":
            body, status = b"", self.server.health
        else:
            body, status = b"", 404
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[_Server]:
    srv = _Server(("127.0.0.1", 0), _Handler)
    srv.payloads = [
        (FIX / "metrics_load.txt").read_bytes(),
        (FIX / "metrics_load_next.txt").read_bytes(),
    ]
    srv.health = 200
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()
    thread.join()


def test_a_url_is_scraped_twice_for_real_rates(capsys, server: _Server) -> None:
    url = f"http://127.0.0.1:{server.server_address[1]}"
    code, doc, err = probe(capsys, url + "/metrics", "--interval", "0.2")
    assert code == 0, err
    assert doc["state"] == "ready" and doc["port"] == server.server_address[1]
    assert doc["preemptions_total"] == 6.0  # the second payload
    assert doc["preemptions_per_min"] > 0 and doc["generation_tokens_per_s"] > 0
    assert doc["uptime_s"] is not None and doc["uptime_s"] >= 0


def test_once_leaves_the_rates_null_and_health_503_is_unhealthy(capsys, server: _Server) -> None:
    server.health = 503
    code, doc, _err = probe(capsys, f"127.0.0.1:{server.server_address[1]}", "--once")
    assert code == 0
    assert doc["state"] == "unhealthy" and doc["preemptions_total"] == 2.0
    assert doc["generation_tokens_per_s"] is None


def test_an_unreachable_url_is_a_clear_error(capsys) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, doc, err = probe(capsys, f"http://127.0.0.1:{port}", "--timeout", "2")
    assert code == 1 and doc is None
    assert f"cannot reach http://127.0.0.1:{port}" in err and "Traceback" not in err


def test_human_output_names_every_key(capsys) -> None:
    assert main(["probe", "--metrics-file", str(FIX / "metrics_load.txt")]) == 0
    out = capsys.readouterr().out
    assert "kv_cache_usage" in out and "preemptions_total" in out and "0.4" in out
