"""The cpu profile's command line starts a real vLLM (CPU build) of the demo layout."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
import signal
import sys
from pathlib import Path

import httpx
import pytest

from vsup.layout.model import load_layout

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.vllm
async def test_cpu_demo_instance_serves_with_its_block_override(tiny_model, tmp_path, port):
    copy = tmp_path / "repo"
    (copy / "layouts").mkdir(parents=True)
    shutil.copy(REPO / "layouts" / "cpu-demo.toml", copy / "layouts")
    (copy / ".demo" / "models").mkdir(parents=True)
    (copy / ".demo" / "models" / "tiny-llama").symlink_to(tiny_model)
    specs = {s.name: s for s in load_layout(copy / "layouts" / "cpu-demo.toml").resolve()}
    spec = dataclasses.replace(specs["cpu1"], port=port)
    env = spec.child_env(os.environ)
    # What the engine does for a "python" command: the supervisor's interpreter comes first.
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    proc = await asyncio.create_subprocess_exec(
        *spec.argv(),
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )
    tail: list[str] = []
    try:

        async def ready() -> bool:
            assert proc.stdout is not None
            while line := await proc.stdout.readline():
                text = line.decode(errors="replace").rstrip()
                tail.append(text)
                if "Application startup complete" in text:
                    return True
            return False

        started = await asyncio.wait_for(ready(), timeout=spec.start_timeout_s)
        assert started, "\n".join(tail[-30:])
        async with httpx.AsyncClient(base_url=spec.base_url, timeout=10) as client:
            assert (await client.get("/health")).status_code == 200
            models = (await client.get("/v1/models")).json()["data"]
            assert [(m["id"], m["max_model_len"]) for m in models] == [("tiny-llama", 512)]
            metrics = (await client.get("/metrics")).text
        info = next(
            line for line in metrics.splitlines() if line.startswith("vllm:cache_config_info{")
        )
        assert 'num_gpu_blocks="6"' in info and 'block_size="128"' in info
    finally:
        if proc.returncode is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), timeout=30)
            except TimeoutError:
                os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()
        # The API server exits first; its EngineCore (same process group) follows within a
        # second or two. No event announces a group becoming empty, so look until a deadline.
        deadline = asyncio.get_running_loop().time() + 15
        while _group_alive(proc.pid) and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.1)
        if _group_alive(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail("processes of the vLLM group outlived SIGTERM by 15 s")


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True
