"""Bad input at the CLI and the control API: names checked before any request, bodies limited
while they are read, nesting bounded, and every CLI error one line, never a traceback."""

from __future__ import annotations

import json
import select
import socket

import psutil
import pytest

from tests.faults.helpers import daemons_of, vsup
from tests.unit.control.helpers import emulator_layout, free_port

pytestmark = pytest.mark.timeout(120)


def http(home, head: bytes, body_chunks=(), timeout: float = 60) -> tuple[int, dict, int]:
    """A raw HTTP/1.1 request on the control socket: (status, JSON body, body bytes sent).
    Body chunks stop being sent as soon as the daemon answers or hangs up."""
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(timeout)
    s.connect(str(home / "vsup.sock"))
    s.sendall(head)
    answer = b""
    sent = 0
    for chunk in body_chunks:
        if select.select([s], [], [], 0)[0]:
            break  # the daemon answered (or hung up) before the body ended
        try:
            s.sendall(chunk)
        except OSError:
            break  # it stopped reading and closed the connection
        sent += len(chunk)
    while b"\r\n\r\n" not in answer or len(answer.split(b"\r\n\r\n", 1)[1]) == 0:
        data = s.recv(65536)
        if not data:
            break
        answer += data
    s.close()
    head_part, _, body = answer.partition(b"\r\n\r\n")
    status = int(head_part.split()[1])
    return status, json.loads(body or b"{}"), sent


def test_bad_names_huge_and_deep_bodies_are_refused_clearly(fault_home, tmp_path):
    home = fault_home
    # Names no layout can hold: one line each, exit 2, and no daemon is even started for them.
    for args in (["logs", "a\nb"], ["stop", "a/b"], ["restart", "../x"]):
        res = vsup(home, *args)
        assert res.returncode == 2, (args, res.stdout, res.stderr)
        assert res.stderr.count("\n") == 1 and "is not an instance name" in res.stderr, res.stderr
        assert "Traceback" not in res.stderr
    assert daemons_of(home) == []

    layout = tmp_path / "a.toml"
    layout.write_text(emulator_layout({"a": free_port()}))
    # ready before the bodies arrive: the status at the end then says what they did, not how
    # far a start had come on a loaded machine
    up = vsup(home, "up", str(layout), "--detach", "--wait", "--timeout", "120")
    assert up.returncode == 0, up.stdout + up.stderr
    (daemon,) = daemons_of(home)
    rss0 = daemon.memory_info().rss

    # A declared 600 MB body: refused from its header. The client sends at most 4 MiB of it, so
    # a daemon that waited for the body would never answer; it answers 413 before the client
    # has sent all of that.
    declared = 600 * 1024 * 1024
    status, body, sent = http(
        home,
        b"POST /v1/apply HTTP/1.1\r\nHost: vsup\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {declared}\r\n\r\n".encode(),
        body_chunks=[b"x" * 65536] * 64,
    )
    assert status == 413 and "over" in body["error"]
    assert sent < 64 * 65536, sent
    declared_sent = sent

    # A chunked body with no length: reading stops at the 4 MiB limit, not at its end.
    chunk = b"x" * 65536
    framed = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
    status, body, sent = http(
        home,
        b"POST /v1/apply HTTP/1.1\r\nHost: vsup\r\nTransfer-Encoding: chunked\r\n\r\n",
        body_chunks=[framed] * (600 * 16),  # 600 MiB if it were all sent
    )
    # answered (or hung up on) once the limit was read: the client got to send 4 MiB and what
    # the socket's buffers hold, nowhere near the 600 MiB
    assert status == 413 and sent < 16 * 1024 * 1024, sent
    print(f"bodies sent before the 413: declared {declared_sent} B, chunked {sent} B")
    assert daemon.memory_info().rss - rss0 < 64 * 1024 * 1024

    # 100,000 levels of nesting: a 400 saying so, not a 500.
    deep = b"[" * 100_000 + b"]" * 100_000
    status, body, _ = http(
        home,
        b"POST /v1/actions HTTP/1.1\r\nHost: vsup\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(deep)}\r\n\r\n".encode()
        + deep,
    )
    assert status == 400 and "levels deep" in body["error"]
    assert daemon.is_running() and daemon.status() != psutil.STATUS_ZOMBIE
    assert vsup(home, "status").returncode == 0
