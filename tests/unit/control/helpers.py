"""Helpers for the control-plane unit tests: layouts of vLLM emulators
(`tests/programs/vllm_emulator.py`: real processes that answer like vLLM, without a model)."""

from __future__ import annotations

import json
import sys
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
