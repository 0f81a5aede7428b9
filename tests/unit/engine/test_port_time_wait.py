"""A port held only by TIME-WAIT connections (issue 35 item 18): no process holds it, so the
message must not say one does, and the start waits the TIME-WAIT out (vLLM could not bind it
either: a closed socket that did not set SO_REUSEADDR blocks even a SO_REUSEADDR bind on
Linux until its 60 s TIME-WAIT ends) instead of failing at once."""

from __future__ import annotations

import socket
import time

import psutil
import pytest

from vsup.engine import spawn
from vsup.engine.runlog import RunLogs
from vsup.engine.spawn import Refused, launch, port_holder

from tests.factories import instance_spec


def time_wait_port() -> int:
    """A loopback port whose only socket is in TIME-WAIT: a client bound to it (without
    SO_REUSEADDR, as clients are) that closed its connection first."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        client = socket.socket()
        client.bind(("127.0.0.1", 0))
        port = client.getsockname()[1]
        client.connect(server.getsockname())
        accepted, _ = server.accept()
        client.close()  # the active close: the client's side goes to TIME-WAIT
        time.sleep(0.1)
        accepted.close()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        states = {c.status for c in psutil.net_connections("tcp") if c.laddr.port == port}
        if states == {psutil.CONN_TIME_WAIT}:
            return port
        time.sleep(0.05)
    pytest.fail(f"no TIME-WAIT on port {port}: {states}")


def test_a_time_wait_port_is_said_to_be_held_by_no_process():
    port = time_wait_port()
    held = port_holder("127.0.0.1", port)
    assert held is not None and "TIME-WAIT" in held and "another process" not in held, held


def test_a_start_waits_for_the_time_wait_and_then_says_what_held_the_port(tmp_path, monkeypatch):
    port = time_wait_port()
    waited = []
    real = spawn.wait_out_time_wait

    def short_wait(host: str, p: int, limit_s: float | None = None):
        waited.append(p)
        return real(host, p, 0.5)  # the TIME-WAIT outlives it: the refusal's words

    monkeypatch.setattr(spawn, "wait_out_time_wait", short_wait)
    spec = instance_spec(name="tw", host="127.0.0.1", port=port, gpus=())
    result = launch(spec, RunLogs(tmp_path, "tw"), 1, "now")
    assert waited == [port]
    assert isinstance(result, Refused) and "TIME-WAIT" in result.excerpt
    assert "in use by another process" not in result.excerpt and "'tw'" in result.excerpt
