"""Alerts from a running daemon: a crash-looping emulator and a daemon restart reach a webhook
receiver on 127.0.0.1."""

from __future__ import annotations

import asyncio

import pytest

from tests.unit.control.helpers import emulator_layout, free_port
from tests.unit.control.webhook_receiver import Receiver

pytestmark = pytest.mark.timeout(90)


def alerts_table(kinds: str) -> str:
    return f'\n[alerts]\nwebhook_env = "VSUP_TEST_HOOK"\nkinds = {kinds}\nresolve_after_s = 0\n'


async def wait_for_text(receiver: Receiver, needle: str, timeout: float = 40.0) -> str:
    for _ in range(int(timeout / 0.1)):
        for text in receiver.texts:
            if needle in text:
                return text
        await asyncio.sleep(0.1)
    raise AssertionError(f"no alert with {needle!r}; got {receiver.texts}")


async def test_a_crash_loop_is_alerted_once_per_severity(daemons, monkeypatch) -> None:
    receiver = Receiver()
    monkeypatch.setenv("VSUP_TEST_HOOK", receiver.url)
    try:
        daemon, client = await daemons.start()
        layout = emulator_layout({"a": free_port()}, args="args = { exit-after = 0.3 }")
        await client.apply(layout + alerts_table('["crash_loop", "failed"]'), "/tmp/fakes.toml")
        text = await wait_for_text(receiver, "CRITICAL crash_loop: a: failed")
        assert text.startswith(f"[vsup {daemon.node.hostname}] CRITICAL crash_loop: a: failed")
        await asyncio.sleep(1.0)  # more polls: the same incident is not sent again
        assert sum("CRITICAL crash_loop" in t for t in receiver.texts) == 1
    finally:
        receiver.close()


async def test_a_daemon_that_takes_over_running_instances_says_so(daemons, monkeypatch) -> None:
    receiver = Receiver()
    monkeypatch.setenv("VSUP_TEST_HOOK", receiver.url)
    try:
        daemon, client = await daemons.start()
        layout = emulator_layout({"a": free_port()}) + alerts_table('["daemon_restarted"]')
        await client.apply(layout, "/tmp/fakes.toml")
        await daemon.engine.wait("a", ("ready",), timeout=20)
        await daemons.stop(daemon)  # like SIGTERM: the instance keeps running
        assert receiver.texts == []
        await daemons.start()
        text = await wait_for_text(receiver, "daemon_restarted")
        assert "re-adopted 1 running instance(s) (a)" in text
    finally:
        receiver.close()
