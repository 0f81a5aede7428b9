"""Helpers for the control-plane unit tests: layouts of `tests/programs/fakevllm.py` servers
(real processes that answer /health like vLLM, without a model)."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

FAKEVLLM = Path(__file__).parents[2] / "programs" / "fakevllm.py"


def fake_layout(ports: dict[str, int], extra_header: str = "", args: str = "") -> str:
    """A layout of fakevllm instances (CPU: `gpus = []`), restarted at once on failure."""
    cmd = json.dumps([sys.executable, str(FAKEVLLM)])
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


def free_port() -> int:
    """A loopback TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
