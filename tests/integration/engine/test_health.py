"""A ready server that stops answering /health: frozen for real with SIGSTOP (the kernel still
accepts connections on its socket, nothing answers). Shorter than `unhealthy_grace_s` it is a
busy server and is left alone; longer, it is hung and is ended and restarted."""

from __future__ import annotations

import asyncio
import os
import signal
import time

from tests.integration.engine.test_processes import until


async def test_a_server_silent_past_the_grace_is_ended_and_restarted(engine, emulator_spec, events):
    eng = engine(health_timeout_s=0.3)
    await eng.apply([emulator_spec("a", unhealthy_grace_s=1.5)], wait=True)
    first = eng.instances["a"].pid
    t0 = time.monotonic()
    os.kill(first, signal.SIGSTOP)
    (unhealthy,) = await events.wait(lambda e: e["kind"] == "unhealthy", timeout=20)
    silent = time.monotonic() - t0
    assert unhealthy["status"] is None and "no answer" in unhealthy["error"]
    assert silent >= 1.5, f"unhealthy after {silent:.2f} s of silence, inside the grace"
    (exit_,) = await events.wait(lambda e: e["kind"] == "exit", timeout=20)
    # a stopped process does not act on SIGTERM; the SIGKILL after stop_grace_s ends it
    assert exit_["reason"] == "unhealthy" and exit_["signal"] == "SIGKILL"
    await eng.wait("a", ("ready",), timeout=20)
    assert eng.instances["a"].pid != first and eng.instances["a"].restarts == 1


async def test_a_server_silent_for_less_than_the_grace_is_left_alone(engine, emulator_spec, events):
    eng = engine(health_timeout_s=0.2)
    await eng.apply([emulator_spec("a", unhealthy_grace_s=6)], wait=True)
    pid = eng.instances["a"].pid
    os.kill(pid, signal.SIGSTOP)
    try:
        # checks every 0.05 s, each timing out after 0.2 s: well past unhealthy_after (2)
        await asyncio.sleep(2.0)
        assert eng.instances["a"].lifecycle.health_failures >= 2
        assert eng.instances["a"].state == "ready"
    finally:
        os.kill(pid, signal.SIGCONT)
    await until(lambda: eng.instances["a"].lifecycle.health_failures == 0)
    await asyncio.sleep(0.3)
    assert eng.instances["a"].state == "ready" and eng.instances["a"].pid == pid
    assert events.of("unhealthy", "a") == [] and len(events.of("spawn", "a")) == 1
