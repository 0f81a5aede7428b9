"""Helpers for the control-plane unit tests: layouts of vLLM emulators
(`tests/programs/vllm_emulator.py`: real processes that answer like vLLM, without a model)."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

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


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A loopback TCP port nobody listens on right now, and not one this process handed out
    before: ports asked for in a row are not bound until a layout starts, and the kernel may
    give the same one twice (seen in CI: two instances of one layout on one port)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
