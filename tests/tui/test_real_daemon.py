"""The dashboard against a real daemon running real vLLM servers (CPU build).

One scenario, because each vLLM start costs ~30 s and ~2 GiB here: `vsup up --detach --wait`
starts the daemon and two instances (cpu1 has 6 KV blocks, so a burst of requests makes it
preempt for real). Then, in a real terminal (tmux, 160x45), bare `vsup` attaches the
dashboard: it shows both instances ready with their attention backend, the live preemptions
under load, the full-screen log, and a restart through the confirm dialog that the daemon
carries out; `q` detaches and the instances keep running. In-process, the same dashboard on
the real `AsyncClient` is checked and, with VSUP_SCREENSHOTS=DIR, saves SVG screenshots of
the real node. `vsup down` leaves no process behind.

Run it alone, under the machine's vLLM lock:
    flock /tmp/vsup-vllm.lock python -m pytest tests/tui/test_real_daemon.py -m "vllm and tmux"
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import httpx
import psutil
import pytest
from textual.widgets import Static

from vsup.control.client import JsonClient
from vsup.tui import fmt

from tests.conftest import free_port, outside_cwd, run_vsup

pytestmark = [pytest.mark.vllm, pytest.mark.tmux]
# the CPU build's worker inside its EngineCore, as on a GPU at TP1 (tests/conftest.py, vllm_env):
# this module tests vsup over vLLM's HTTP API, and a start costs about half as long that way
VLLM_ONE_PROCESS = True

ROOT = Path(__file__).parents[2]


vsup = partial(run_vsup, timeout=300)


def status(home: Path) -> dict:
    proc = vsup(home, "status", "--json", timeout=60)
    assert proc.returncode in (0, 1), proc.stderr
    return json.loads(proc.stdout)


def write_layout(path: Path, model: Path, ports: list[int], vllm_env: dict[str, str]) -> None:
    env = ", ".join(f'{k} = "{v}"' for k, v in vllm_env.items())
    command = json.dumps([sys.executable, "-m", "vllm.entrypoints.openai.api_server"])
    path.write_text(f"""
[layout]
name = "tui-real"

[defaults]
model = "{model}"
command = {command}
host = "127.0.0.1"
args = {{ dtype = "float32", enforce-eager = true, max-model-len = 512, served-model-name = "tiny" }}
env = {{ {env} }}
restart = {{ policy = "on-failure", backoff_s = 1, backoff_max_s = 5, stable_s = 600, max_failures = 5 }}

[[instance]]
name = "cpu0"
gpus = []
port = {ports[0]}

[[instance]]
name = "cpu1"
gpus = []
port = {ports[1]}
args = {{ num-gpu-blocks-override = 6 }}
""")


class Tmux:
    """A dashboard in a real terminal: keys in, screen text out."""

    def __init__(self, session: str, command: str, env: dict[str, str]) -> None:
        self.session = session
        self.socket = f"vsup-test-{os.getpid()}"
        env_args = [a for k, v in env.items() for a in ("-e", f"{k}={v}")]
        subprocess.run(
            [
                "tmux",
                "-L",
                self.socket,
                "new-session",
                "-d",
                "-s",
                session,
                "-x",
                "160",
                "-y",
                "45",
                *env_args,
                command,
            ],
            check=True,
            cwd=outside_cwd(),
        )

    def screen(self) -> str:
        out = subprocess.run(
            ["tmux", "-L", self.socket, "capture-pane", "-p", "-t", self.session],
            capture_output=True,
            text=True,
        )
        return out.stdout

    def keys(self, *keys: str) -> None:
        subprocess.run(
            ["tmux", "-L", self.socket, "send-keys", "-t", self.session, *keys], check=True
        )

    def alive(self) -> bool:
        return (
            subprocess.run(
                ["tmux", "-L", self.socket, "has-session", "-t", self.session], capture_output=True
            ).returncode
            == 0
        )

    def wait_for(self, what: str | Callable[[str], bool], timeout: float = 60) -> str:
        """The screen once it shows `what` (a regex or a predicate)."""
        deadline = time.monotonic() + timeout
        text = ""
        while time.monotonic() < deadline:
            text = self.screen()
            if what(text) if callable(what) else re.search(what, text):
                return text
            time.sleep(0.25)  # a real terminal: the screen is polled, nothing to await
        raise AssertionError(f"the dashboard never showed {what!r}; it shows:\n{text}")

    def kill(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True)


def row(screen: str, name: str) -> str:
    for line in screen.splitlines():
        if re.search(rf"\b{name}\b", line) and (
            "ready" in line or "starting" in line or "backoff" in line or "stopp" in line
        ):
            return line
    return ""


def load(port: int, requests: int = 12, max_tokens: int = 150) -> threading.Thread:
    """Concurrent completions that overflow a 6-block KV cache: vLLM preempts."""

    def one() -> None:
        with contextlib.suppress(httpx.HTTPError):
            httpx.post(
                f"http://127.0.0.1:{port}/v1/completions",
                timeout=120,
                json={
                    "model": "tiny",
                    "prompt": "hello " * 20,
                    "max_tokens": max_tokens,
                    "ignore_eos": True,
                    "temperature": 1.0,
                },
            )

    def burst() -> None:
        threads = [threading.Thread(target=one) for _ in range(requests)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    runner = threading.Thread(target=burst, daemon=True)
    runner.start()
    return runner


def vllm_pids(home: Path) -> set[int]:
    """vLLM processes of `home`'s daemon (they inherit its VSUP_HOME): other tests may run
    servers or emulators titled VLLM::... at the same time."""
    out = set()
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(p.info.get("cmdline") or ())
        if "vllm.entrypoints" in cmd or "VLLM::" in cmd:
            with contextlib.suppress(psutil.Error):
                if p.environ().get("VSUP_HOME") == str(home):
                    out.add(p.info["pid"])
    return out


@pytest.fixture
def home():
    path = Path(tempfile.mkdtemp(prefix="vsup-tui-", dir="/tmp"))
    yield path
    vsup(path, "down", timeout=120)
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_dashboard_in_a_real_terminal_on_real_vllm(home, tiny_model, vllm_env, tmp_path):
    before = vllm_pids(home)
    ports = [free_port(), free_port()]
    layout = tmp_path / "tui-real.toml"
    write_layout(layout, tiny_model, ports, vllm_env)
    up = vsup(home, "up", str(layout), "--detach", "--wait", "--timeout", "300", timeout=360)
    assert up.returncode == 0, up.stdout + up.stderr
    ours = vllm_pids(home) - before

    # pytest exports COLUMNS/LINES, which the terminal size detection would prefer to tmux's
    term = Tmux(
        "dash", f"env -u COLUMNS -u LINES {sys.executable} -m vsup", {"VSUP_HOME": str(home)}
    )
    try:
        screen = term.wait_for(r"ready 2/2")
        assert "no GPUs (CPU node)" in screen and "MODEL" in screen  # the wide layout
        for name in ("cpu0", "cpu1"):
            assert "● ready" in row(screen, name), screen
        # the CPU build logs no backend line: the dashboard says it inferred CPU_ATTN
        assert "CPU_ATTN ~" in row(screen, "cpu0"), screen

        # live telemetry: a burst on cpu1 makes the real vLLM preempt, and the table shows
        # the daemon's count
        daemon = JsonClient(home)
        burst = load(ports[1])

        def preemptions_shown(screen: str) -> bool:
            cpu1 = instance(daemon, "cpu1")
            total = cpu1["preemptions_total"] or 0
            return total > 0 and fmt.count(total) in row(screen, "cpu1").split()

        term.wait_for(preemptions_shown, timeout=150)
        burst.join(timeout=180)

        # the full-screen log of cpu0, then back
        term.keys("l")
        term.wait_for(r"log of cpu0 · this run")
        term.wait_for(r"Starting vLLM (API )?server on http://127\.0\.0\.1")
        term.keys("Escape")
        term.wait_for(r"ready 2/2")

        # the same dashboard in-process on the real AsyncClient (while both serve)
        _in_process_checks(home)

        # restart cpu1 through the confirm dialog; the daemon does it: a new process starts
        # (that a restarted vLLM comes back ready is tests/integration/engine/test_vllm.py's;
        # waiting for it here cost a whole start)
        pid_before = instance(daemon, "cpu1")["pid"]
        term.keys("Down")
        term.wait_for(r"cpu1 · ● ready")
        term.keys("r")
        term.wait_for(r"Restart cpu1\?")
        term.keys("y")
        term.wait_for(lambda s: "starting" in row(s, "cpu1"), timeout=60)
        cpu1 = instance(daemon, "cpu1")
        assert cpu1["pid"] not in (None, pid_before) and cpu1["state"] == "starting", cpu1

        # q detaches: the dashboard ends, the instances keep running
        term.keys("q")
        deadline = time.monotonic() + 20
        while term.alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not term.alive(), term.screen()
        assert [i["state"] for i in status(home)["instances"]] in (
            ["ready", "starting"],
            ["ready", "ready"],
        )
    finally:
        term.kill()

    down = vsup(home, "down", timeout=180)
    assert down.returncode == 0, down.stdout + down.stderr
    deadline = time.monotonic() + 30
    while vllm_pids(home) and time.monotonic() < deadline:
        time.sleep(0.5)
    # none of this home's vLLM processes is left: the first runs' nor cpu1's restart, still
    # starting when `down` came
    assert ours and not vllm_pids(home), "vLLM processes left behind"


def instance(client, name: str) -> dict:
    return next(i for i in client.status()["instances"] if i["name"] == name)


def _in_process_checks(home: Path) -> None:
    """The dashboard on the real AsyncClient, headless: real snapshots, real logs, config."""
    import asyncio

    os.environ["VSUP_HOME"] = str(home)
    try:
        from vsup.control.client import AsyncClient
        from vsup.tui.app import DashboardApp
        from vsup.tui.widgets.instances import InstanceTable

        async def run() -> None:
            app = DashboardApp(AsyncClient(home), refresh_s=0.5)
            async with app.run_test(size=(160, 45)) as pilot:
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline and (
                    app.snapshot is None or "cpu1" not in app.history.seeded
                ):
                    await pilot.pause(0.1)
                    if app.selected == "cpu0":
                        await pilot.press("down")
                table = app.screen.query_one(InstanceTable)
                assert table.order == ["cpu0", "cpu1"]
                config = app.screen.query_one("#config", Static).content.plain
                assert "--num-gpu-blocks-override 6" in config
                assert "num_gpu_blocks" in config  # vLLM's own cache config, scraped
                shots = os.environ.get("VSUP_SCREENSHOTS")
                if shots:
                    app.save_screenshot(str(Path(shots) / "real-cpu-node-160x45.svg"))
                    await pilot.resize_terminal(80, 24)
                    await pilot.pause(0.5)
                    app.save_screenshot(str(Path(shots) / "real-cpu-node-80x24.svg"))

        asyncio.run(run())
    finally:
        os.environ.pop("VSUP_HOME", None)
