"""CPU a request costs a CPU vLLM with OpenMP threads that spin while they wait, against one
whose threads wait passively (`OMP_WAIT_POLICY=PASSIVE`, configs/cpu.toml, tests/conftest.py).

Two servers of the generated tiny model (one-process mode, as the tests run them), one of each,
on this machine at once; rounds of requests (1, 16 and 64 tokens out) sent to each in turns,
one at a time; the CPU of each server's process tree per request. Spinning costs most where
other work shares the cores, so run it beside what you care about (the suite on 2 cores).

    python -m benchmarks.omp_wait [--requests 20] [--rounds 3]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

from vsup.demo.tinymodel import generate

POLICIES = {"spinning (default)": None, "passive": "PASSIVE"}


def start(model: Path, port: int, policy: str | None) -> subprocess.Popen:
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        VLLM_CPU_KVCACHE_SPACE="1",
        TOKENIZERS_PARALLELISM="false",
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
    )
    env.pop("OMP_WAIT_POLICY", None)
    if policy:
        env["OMP_WAIT_POLICY"] = policy
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model)]
    argv += ["--dtype", "float32", "--enforce-eager", "--max-model-len", "512"]
    argv += ["--host", "127.0.0.1", "--port", str(port)]
    return subprocess.Popen(
        argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )


def wait_ready(port: int, proc: subprocess.Popen, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server on port {port} exited with {proc.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"the server on port {port} was not ready in {timeout:g} s")


def tree_cpu(pid: int) -> float:
    root = psutil.Process(pid)
    total = 0.0
    for p in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            total += sum(p.cpu_times()[:2])
    return total


def cost(port: int, pid: int, model: Path, tokens: int, n: int) -> float:
    """CPU-seconds of the server per request, over `n` requests one at a time."""
    body: dict[str, object] = {"model": str(model), "max_tokens": tokens, "ignore_eos": True}
    body["prompt"] = "the quick brown fox jumps over the lazy dog"
    c0 = tree_cpu(pid)
    with httpx.Client(timeout=120) as client:
        for _ in range(n):
            r = client.post(f"http://127.0.0.1:{port}/v1/completions", json=body)
            r.raise_for_status()
    return (tree_cpu(pid) - c0) / n


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="vsup-omp-") as tmp:
        model = generate(Path(tmp) / "tiny-llama")
        servers = {}
        try:
            for name, policy in POLICIES.items():
                port = free_port()
                servers[name] = (port, start(model, port, policy))
            for port, proc in servers.values():
                wait_ready(port, proc)
            figures: dict[tuple[str, int], list[float]] = {}
            for _ in range(args.rounds):
                for name, (port, proc) in servers.items():
                    for tokens in (1, 16, 64):
                        c = cost(port, proc.pid, model, tokens, args.requests)
                        figures.setdefault((name, tokens), []).append(c)
            print(f"CPU-s per request, median of {args.rounds} rounds of {args.requests}:")
            for tokens in (1, 16, 64):
                row = {name: statistics.median(figures[(name, tokens)]) for name in POLICIES}
                spin, passive = row["spinning (default)"], row["passive"]
                print(
                    f"  {tokens:>2} tokens out: spinning {spin:.3f}, passive {passive:.3f} "
                    f"({spin / passive:.2f}x)"
                )
        finally:
            for _port, proc in servers.values():
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, 9)
                proc.wait(timeout=30)


if __name__ == "__main__":
    main()
