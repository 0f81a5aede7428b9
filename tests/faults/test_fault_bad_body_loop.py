"""Malformed bodies never freeze the daemon: while a client sends bad bodies back to back (an
unclosed string of 24,000 escaped quotes, the audit's 48 KB case, and 4 MiB ones), the daemon
answers pings and sees an instance that is SIGKILLed, and every bad body gets its 400."""

from __future__ import annotations

import os
import signal
import socket
import threading

import pytest

from tests.faults.helpers import instance, vsup, wait_for
from tests.faults.test_fault_bad_input import http
from tests.unit.control.helpers import emulator_layout, free_port

pytestmark = pytest.mark.timeout(240)

MIB = 1024 * 1024
BAD_BODIES = [
    b'{"toml": "' + b'\\"' * 24_000,  # the audit's: 48 KB, no closing quote
    b'{"toml": "' + b'\\"' * (2 * MIB - 8),  # the same, 4 MiB
    b'{"toml": "' + b"\\" * (4 * MIB - 16),
    b'"' * (4 * MIB - 1),
    b"[" * (2 * MIB) + b"]" * (2 * MIB - 1),
]


def _post(home, body: bytes) -> int:
    head = (
        b"POST /v1/apply HTTP/1.1\r\nHost: vsup\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
    )
    status, _, _ = http(home, head + body, timeout=120)
    return status


def test_the_loop_answers_and_supervises_while_bad_bodies_arrive(fault_home, tmp_path):
    home = fault_home
    layout = tmp_path / "a.toml"
    layout.write_text(emulator_layout({"a": free_port()}))
    assert vsup(home, "up", str(layout), "--detach", "--wait", "--timeout", "60").returncode == 0
    pid = instance(home, "a")["pid"]

    statuses: list[int] = []
    errors: list[BaseException] = []
    sent_one = threading.Event()
    stop = threading.Event()

    def flood() -> None:
        try:
            while not stop.is_set():
                for body in BAD_BODIES:
                    statuses.append(_post(home, body))
                    sent_one.set()
        except BaseException as exc:  # the test fails on it below
            errors.append(exc)
            sent_one.set()

    flooder = threading.Thread(target=flood, daemon=True)
    flooder.start()
    try:
        assert sent_one.wait(120), "no bad body was answered"
        from vsup.control.client import Client

        # Generous timeouts: a ping takes milliseconds; the old quadratic check held the loop
        # for 14.8 s on the 48 KB body and for hours on the 4 MiB ones.
        with Client(home, timeout=30) as client:
            for _ in range(5):
                assert client.ping()["pid"]
            os.kill(pid, signal.SIGKILL)
            seen = wait_for(
                lambda: [
                    e
                    for e in client.events(0).to_json()["events"]
                    if e["kind"] == "exit" and e.get("pid") == pid
                ],
                60,
                "the SIGKILLed instance's exit in the journal",
            )
            assert seen[0]["signal"] in ("SIGKILL", signal.SIGKILL), seen[0]
            wait_for(lambda: instance(home, "a")["state"] == "ready", 60, "a restarted")
            rounds = len(statuses)
            wait_for(lambda: len(statuses) >= rounds + len(BAD_BODIES), 120, "another round")
    finally:
        stop.set()
        flooder.join(180)
    assert not errors, errors
    assert statuses and set(statuses) == {400}, statuses
    with socket.socket(socket.AF_UNIX) as s:  # the socket still takes connections
        s.connect(str(home / "vsup.sock"))
