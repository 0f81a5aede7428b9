"""Helpers for the control-plane unit tests: layouts of vLLM emulators
(`tests/programs/vllm_emulator.py`: real processes that answer like vLLM, without a model)."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

from tests.ports import free_port  # noqa: F401  (re-exported for the control tests)

EMULATOR = Path(__file__).parents[2] / "programs" / "vllm_emulator.py"


def emulator_layout(ports: dict[str, int], extra_header: str = "", args: str = "") -> str:
    """A layout of vLLM emulator instances (CPU: `gpus = []`), restarted at once on failure."""
    cmd = json.dumps([sys.executable, str(EMULATOR)])
    text = f"""[layout]
name = "fakes"
{extra_header}

[defaults]
model = "test/fake"
command = {cmd}
host = "127.0.0.1"
health_interval_s = 0.1
stop_grace_s = 5
restart = {{ policy = "on-failure", backoff_s = 0.2, backoff_max_s = 1, stable_s = 60, max_failures = 3 }}
{args}
"""
    for name, port in ports.items():
        text += f"""
[[instance]]
name = "{name}"
gpus = []
port = {port}
"""
    return text


async def instance(client, name: str) -> dict:
    """One instance of the daemon's status (an asyncio client of vsup.control.client)."""
    doc = await client.status()
    return next(i for i in doc["instances"] if i["name"] == name)


async def until(client, name: str, check, timeout: float = 30.0) -> dict:
    """The instance's status once `check(it)` holds; fails naming it after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        inst = await instance(client, name)
        if check(inst):
            return inst
        assert time.monotonic() < deadline, f"{name} never got there: {inst}"
        await asyncio.sleep(0.1)
