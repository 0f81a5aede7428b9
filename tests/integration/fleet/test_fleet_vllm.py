"""The fleet with a node that runs real vLLM (CPU build, the generated tiny model), over real
SSH, beside an emulated node. One vLLM start serves every case here (~40 s).

Run it under the machine's heavy lock:
    flock /tmp/vsup-heavy.lock make test TESTS=tests/integration/fleet/test_fleet_vllm.py
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import threading
import time

import httpx
import pytest

from tests.integration.fleet.conftest import node_layout
from tests.integration.fleet.sshnodes import SshFleet, free_port

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]
# the CPU build's worker inside its EngineCore, as on a GPU at TP1 (tests/conftest.py, vllm_env):
# this module tests vsup over vLLM's HTTP API, and a start costs about half as long that way
VLLM_ONE_PROCESS = True


@pytest.fixture(scope="module")
def fleet(tiny_model, vllm_env):
    f = SshFleet(["emu", "real"], fleet_name="mixed").start()
    try:
        emu = f.root / "emu.toml"
        emu.write_text(node_layout("emulated", {"e1": free_port()}))
        res = f.nodes["emu"].vsup("up", str(emu), "--detach", "--wait", "--timeout", "90")
        assert res.returncode == 0, res.stderr
        port = free_port()
        env = ", ".join(f'{k} = "{v}"' for k, v in vllm_env.items())
        command = json.dumps([sys.executable, "-m", "vllm.entrypoints.openai.api_server"])
        real = f.root / "real.toml"
        real.write_text(f"""[layout]
name = "tiny-real"

[defaults]
model = "{tiny_model}"
command = {command}
host = "127.0.0.1"
args = {{ dtype = "float32", enforce-eager = true, max-model-len = 512, served-model-name = "tiny" }}
env = {{ {env} }}

[[instance]]
name = "v0"
gpus = []
port = {port}
""")
        res = f.nodes["real"].vsup(
            "up", str(real), "--detach", "--wait", "--timeout", "400", timeout=450
        )
        assert res.returncode == 0, res.stderr
        f.vllm_port = port  # type: ignore[attr-defined]
        yield f
    finally:
        f.close()


def generate(port: int, stop: threading.Event) -> threading.Thread:
    def loop() -> None:
        while not stop.is_set():
            with contextlib.suppress(httpx.HTTPError):
                httpx.post(
                    f"http://127.0.0.1:{port}/v1/completions",
                    timeout=60,
                    json={
                        "model": "tiny",
                        "prompt": "hello " * 8,
                        "max_tokens": 64,
                        "ignore_eos": True,
                    },
                )

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    return t


def test_status_shows_the_real_vllm_node_with_its_version_and_throughput(fleet):
    stop = threading.Event()
    threads = [generate(fleet.vllm_port, stop) for _ in range(2)]
    try:
        deadline = time.monotonic() + 120
        while True:
            nodes = fleet.status()
            if (nodes["real"]["tokens_per_s"] or 0) > 0 or time.monotonic() > deadline:
                break
            time.sleep(1)
    finally:
        stop.set()
        for t in threads:
            t.join(70)
    real, emu = nodes["real"], nodes["emu"]
    assert real["reachable"] and real["ready"] == 1 and real["total"] == 1, real
    assert real["layout"] == "tiny-real"
    assert real["tokens_per_s"] > 0, real  # vLLM's own counters, through the node's daemon
    from importlib import metadata

    assert real["vllm_version"] == metadata.version(metadata.packages_distributions()["vllm"][0])
    assert emu["reachable"] and emu["layout"] == "emulated" and emu["ready"] == 1
    text = fleet.fleet("status")
    assert text.returncode == 0, text.stdout + text.stderr
    assert "2/2 nodes answer, 2/2 instances ready" in text.stdout


def test_the_dashboard_opens_the_real_vllm_node(fleet, monkeypatch):
    from vsup.fleet.model import load_fleet
    from vsup.tui.fleet_app import FleetApp
    from vsup.tui.screens.dashboard import Dashboard
    from vsup.tui.screens.fleet import FleetScreen

    monkeypatch.setenv("VSUP_HOME", str(fleet.operator_home))

    async def scenario() -> None:
        app = FleetApp(load_fleet(fleet.fleet_file), refresh_s=0.5, node_refresh_s=0.5)
        async with app.run_test(size=(160, 45)) as pilot:

            async def until(cond, what: str, timeout: float = 60) -> None:
                for _ in range(int(timeout / 0.1)):
                    if cond():
                        return
                    await pilot.pause(0.1)
                raise AssertionError(f"timed out waiting for {what}")

            await until(lambda: len(app.views) == 2, "the fleet's first poll")
            await pilot.press("down", "enter")
            await until(lambda: app.snapshot is not None, "the real node's snapshot")
            assert isinstance(app.screen, Dashboard) and app.open_node == "real"
            inst = app.snapshot.instance("v0")
            assert inst is not None and inst.lifecycle.state == "ready" and inst.telemetry.backend
            await until(lambda: app.selected == "v0", "v0 selected")
            await pilot.press("q")
            await until(lambda: isinstance(app.screen, FleetScreen), "the fleet screen")
            await pilot.press("q")

    asyncio.run(scenario())
