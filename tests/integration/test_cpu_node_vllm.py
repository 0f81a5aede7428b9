"""A CPU node with real vLLM (CPU build) under vsup (issue 25): each CPU instance binds its
OpenMP threads to cores of its own (vLLM's "auto" put every instance on core 0); a stop under
the demo's load ends with vLLM draining, not with SIGKILL after the grace; a misspelt flag is
refused against the installed vLLM, and when let through, its bad_args advice says to edit the
layout and `vsup up`.

One two-instance fleet for the module (a start costs ~30 s and 2 GiB here).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import pytest

from tests.conftest import free_port, outside_cwd, run_vsup

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]
vsup = partial(run_vsup, timeout=900)
VLLM = json.dumps([sys.executable, "-m", "vllm.entrypoints.openai.api_server"])


def layout_text(model: Path, ports: list[int], extra: str = "") -> str:
    text = f"""[layout]
name = "cpu-node"
profiles = ["cpu"]

[defaults]
model = "{model}"
host = "127.0.0.1"
start_timeout_s = 600
args = {{ max-model-len = 512, served-model-name = "tiny-llama", num-gpu-blocks-override = 24 }}
restart = {{ policy = "on-failure", backoff_s = 1, backoff_max_s = 5, max_failures = 3 }}
{extra}
"""
    for i, port in enumerate(ports):
        text += f'\n[[instance]]\nname = "cpu{i}"\ngpus = []\nport = {port}\n'
    return text


def journal(home: Path) -> list[dict]:
    return [json.loads(x) for x in (home / "journal.jsonl").read_text().splitlines() if x.strip()]


def status(home: Path) -> dict:
    res = vsup(home, "status", "--json")
    assert res.returncode in (0, 1), res.stderr
    return json.loads(res.stdout)


def end_all(home: Path) -> None:
    vsup(home, "down")
    if (home / "journal.jsonl").exists():
        for ev in journal(home):
            if ev.get("kind") == "spawn" and ev.get("pgid"):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(ev["pgid"], signal.SIGKILL)


@pytest.fixture(scope="module")
def node(tiny_model):
    home = Path(tempfile.mkdtemp(prefix="vsup-cpu-", dir="/tmp"))
    ports = [free_port(), free_port()]
    layout = home.parent / f"{home.name}.toml"
    layout.write_text(layout_text(tiny_model, ports))
    try:
        up = vsup(home, "up", str(layout), "--detach", "--wait", "--timeout", "600")
        assert up.returncode == 0, up.stdout + up.stderr
        yield home, ports
    finally:
        end_all(home)
        layout.unlink(missing_ok=True)


def core_ids(log: Path) -> list[str]:
    return re.findall(r"local_rank=\d+, core ids=(\[[\d, ]*\])", log.read_text(errors="replace"))


def test_each_cpu_instance_binds_its_own_cores(node):
    home, _ports = node
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("this machine gives one core: nothing to split")
    ids = {name: core_ids(home / "logs" / name / "run-0001.log") for name in ("cpu0", "cpu1")}
    assert all(len(v) == 1 for v in ids.values()), ids
    assert ids["cpu0"] != ids["cpu1"], f"both instances bound the same cores: {ids}"
    for name in ids:
        text = (home / "logs" / name / "run-0001.log").read_text(errors="replace")
        assert "VLLM_CPU_OMP_THREADS_BIND='auto'" not in text


def test_a_stop_under_the_demo_load_drains_instead_of_running_into_sigkill(node):
    home, ports = node
    load = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vsup.demo.load",
            str(ports[0]),
            "--concurrency",
            "4",
            "--duration-s",
            "300",
            "--pause-s",
            "0",
        ],  # fmt: skip
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        cwd=outside_cwd(),
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            cpu0 = {i["name"]: i for i in status(home)["instances"]}["cpu0"]
            if (cpu0.get("requests_running") or 0) >= 1:
                break
            time.sleep(0.5)
        else:
            pytest.fail("the demo load never had a request running on cpu0")
        seq = max(e["seq"] for e in journal(home))
        t0 = time.monotonic()
        stop = vsup(home, "stop", "cpu0")
        took = time.monotonic() - t0
        assert stop.returncode == 0 and "cpu0: stopped" in stop.stdout, stop.stderr
    finally:
        os.killpg(load.pid, signal.SIGTERM)
        load.wait(30)
    after = [e for e in journal(home) if e["seq"] > seq and e.get("instance") == "cpu0"]
    (stopped,) = [e for e in after if e["kind"] == "stop"]
    (exited,) = [e for e in after if e["kind"] == "exit"]
    print(
        f"\nstop of cpu0 under the demo load: {took:.1f} s (vLLM drained {stopped['waited_s']} s)"
    )
    assert stopped["kill"] is False, f"SIGKILL after the grace: {stopped}"
    assert exited["signal"] is None and exited["code"] == 0, exited
    log = (home / "logs" / "cpu0" / "run-0001.log").read_text(errors="replace")
    assert "mode=drain" in log


def test_a_misspelt_flag_is_refused_and_its_bad_args_advice_says_edit_the_layout(
    tiny_model, tmp_path
):
    home = Path(tempfile.mkdtemp(prefix="vsup-flag-", dir="/tmp"))
    layout = tmp_path / "typo.toml"
    text = layout_text(tiny_model, [free_port()]).replace(
        "num-gpu-blocks-override = 24 }", "num-gpu-blocks-override = 24, max-modle-len = 256 }"
    )
    layout.write_text(text)
    try:
        val = vsup(home, "validate", str(layout))
        assert val.returncode == 2, val.stdout + val.stderr
        assert (
            "the installed vLLM 0.32" in val.stderr and "has no flag --max-modle-len" in val.stderr
        )
        assert "did you mean 'max-model-len'" in val.stderr
        up = vsup(home, "up", str(layout), "--detach")
        assert up.returncode == 2 and not (home / "vsup.sock").exists()

        # let it through: vLLM itself refuses it, and the advice says what to do
        layout.write_text(text + 'unchecked_args = ["max-modle-len"]\n')
        assert vsup(home, "validate", str(layout)).returncode == 0
        up = vsup(home, "up", str(layout), "--detach", "--wait", "--timeout", "600")
        assert up.returncode == 1, up.stdout + up.stderr
        assert "cpu0: failed (last exit: bad_args)" in up.stderr
        assert "Edit the layout" in up.stderr and "`vsup up LAYOUT`" in up.stderr
        (advice,) = [a for a in status(home)["advice"] if a.get("instance") == "cpu0"]
        assert "bad_args fails fast" in advice["message"]
        assert "unrecognized arguments: --max-modle-len" in advice["message"]
    finally:
        end_all(home)
