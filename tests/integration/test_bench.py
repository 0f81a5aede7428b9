"""`vsup bench` against real vLLM servers (CPU build, tiny model), through the real CLI.

One daemon for the module, serving the "orig" layout (cpu0). The bench compares "one" (cpu0
alone, the same spec: it keeps running) with "two" (cpu0 + cpu1), with an invalid layout in
between; afterwards "orig" is back with cpu0 never restarted. Then SIGTERM mid-run restores
it too, and `--keep` leaves the last layout. Each vLLM start costs ~30 s and 2 GiB here: at
most two servers run at once, and the workload is tiny (16 prompts of 32 in / 16 out).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.conftest import free_port, outside_cwd, run_vsup

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]
# the CPU build's worker inside its EngineCore, as on a GPU at TP1 (tests/conftest.py, vllm_env):
# this module tests vsup over vLLM's HTTP API, and a start costs about half as long that way
VLLM_ONE_PROCESS = True

WORKLOAD = ["--num-prompts", "16", "--input-len", "32", "--output-len", "16"]


vsup = partial(run_vsup, timeout=600)


def layout_text(name: str, model: Path, ports: list[int], env: dict) -> str:
    env_t = ", ".join(f'{k} = "{v}"' for k, v in env.items())
    cmd = json.dumps([sys.executable, "-m", "vllm.entrypoints.openai.api_server"])
    text = f"""
[layout]
name = "{name}"

[defaults]
model = "{model}"
command = {cmd}
host = "127.0.0.1"
args = {{ dtype = "float32", enforce-eager = true, max-model-len = 512 }}
env = {{ {env_t} }}
restart = {{ policy = "on-failure", backoff_s = 1, backoff_max_s = 5, stable_s = 600, max_failures = 3 }}
"""
    for i, port in enumerate(ports):
        # one core each: vLLM CPU binds every instance's OpenMP threads to core 0 otherwise
        bind = i % max(1, os.cpu_count() or 1)
        text += (
            f'\n[[instance]]\nname = "cpu{i}"\ngpus = []\nport = {port}\n'
            f'env = {{ VLLM_CPU_OMP_THREADS_BIND = "{bind}" }}\n'
        )
    return text


def status(home: Path) -> dict:
    proc = vsup(home, "status", "--json", timeout=60)
    assert proc.returncode in (0, 1), proc.stderr
    return json.loads(proc.stdout)


class BenchWatch(threading.Thread):
    """Polls the daemon's status (in-process client: cheap) while a bench runs and keeps every
    distinct `bench` record it saw, as the dashboard would."""

    def __init__(self, home: Path) -> None:
        super().__init__(daemon=True)
        from vsup.control.client import JsonClient

        self.client = JsonClient(home)
        self.seen: list[dict | None] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                bench = self.client.status().get("bench")
            except Exception:
                bench = "error"
            key = (
                None
                if not isinstance(bench, dict)
                else {k: v for k, v in bench.items() if k not in ("elapsed_s", "age_s")}
            )
            if not self.seen or key != self.seen[-1]:
                self.seen.append(key)
            self.stop.wait(0.2)

    def finish(self) -> list[dict | None]:
        self.stop.set()
        self.join(10)
        self.client.close()
        return self.seen


def wait_bench_phase(home: Path, phase: str, timeout: float, with_status: bool = False) -> Any:
    """The daemon's `bench` record once it is in `phase` (`with_status`: and the status it
    came in)."""
    from vsup.control.client import JsonClient

    seen = []
    with JsonClient(home) as client:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            doc = client.status()
            bench = doc.get("bench")
            seen.append(bench and bench["phase"])
            if bench and bench["phase"] == phase:
                return (bench, doc) if with_status else bench
            time.sleep(0.2)
    raise AssertionError(f"no bench in phase {phase} within {timeout} s: {seen[-20:]}")


def bench_clients(home: Path) -> list[psutil.Process]:
    """Live vLLM bench clients that a bench of `home` started (their bootstrap carries the
    ready marker; they inherit VSUP_HOME): other tests may run benches at the same time."""
    out = []
    for p in psutil.process_iter(["cmdline", "status"]):
        cmd = p.info["cmdline"] or []
        marked = len(cmd) > 2 and cmd[1] == "-c" and "vsup-bench-ready" in cmd[2]
        if marked and p.info["status"] != psutil.STATUS_ZOMBIE:
            with contextlib.suppress(psutil.Error):
                if p.environ().get("VSUP_HOME") == str(home):
                    out.append(p)
    return out


@pytest.fixture(scope="module")
def node(tiny_model: Path, vllm_env: dict):
    """A daemon serving "orig" (cpu0), and the layout files; everything stopped at the end."""
    home = Path(tempfile.mkdtemp(prefix="vsup-b-", dir="/tmp"))
    files = Path(tempfile.mkdtemp(prefix="vsup-bench-layouts-"))
    ports = [free_port(), free_port()]
    paths = {}
    for name, used in (("orig", ports[:1]), ("one", ports[:1]), ("two", ports)):
        paths[name] = files / f"{name}.toml"
        paths[name].write_text(layout_text(name, tiny_model, used, vllm_env))
    # Two instances on one port: does not validate.
    paths["bad"] = files / "bad.toml"
    paths["bad"].write_text(layout_text("bad", tiny_model, [ports[0], ports[0]], vllm_env))
    try:
        up = vsup(home, "up", str(paths["orig"]), "--detach", "--wait", "--timeout", "400")
        assert up.returncode == 0, up.stdout + up.stderr
        yield home, paths, ports
    finally:
        vsup(home, "down", timeout=300)
        shutil.rmtree(home, ignore_errors=True)
        shutil.rmtree(files, ignore_errors=True)


def test_without_a_terminal_the_bench_needs_yes_and_changes_nothing(node):
    home, paths, _ = node
    before = status(home)
    proc = vsup(home, "bench", str(paths["one"]), str(paths["two"]), *WORKLOAD)
    assert proc.returncode == 3, proc.stderr
    assert "replaces the running layout orig (serving: cpu0)" in proc.stderr
    assert "--yes" in proc.stderr
    after = status(home)
    assert after["supervisor"]["layout"] == "orig"
    assert [i["pid"] for i in after["instances"]] == [i["pid"] for i in before["instances"]]


def test_one_instance_vs_two_side_by_side_and_the_original_comes_back(node, tmp_path):
    home, paths, ports = node
    cpu0_pid = {i["name"]: i["pid"] for i in status(home)["instances"]}["cpu0"]
    out_json, out_md = tmp_path / "bench.json", tmp_path / "bench.md"
    watch = BenchWatch(home)
    watch.start()
    try:
        proc = vsup(
            home, "bench", str(paths["one"]), str(paths["bad"]), str(paths["two"]), *WORKLOAD,
            "--yes", "--json", str(out_json), "--markdown", str(out_md),
        )  # fmt: skip
    finally:
        seen = watch.finish()
    # exit 1: one layout did not validate; the two others ran
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "layout bad.toml does not validate" in proc.stderr
    assert "[3/3] two: running" in proc.stderr  # progress while it runs
    doc = json.loads(out_json.read_text())
    one, bad, two = doc["runs"]
    assert bad["outcome"] == "invalid" and "port" in bad["problems"][0]
    assert one["outcome"] == "ok" and two["outcome"] == "ok", (one["problems"], two["problems"])
    assert [i["name"] for i in one["instances"]] == ["cpu0"]
    assert [i["name"] for i in two["instances"]] == ["cpu0", "cpu1"]
    assert [i["prompts"] for i in two["instances"]] == [8, 8]
    for run in (one, two):
        t = run["totals"]
        assert t["completed"] == 16 and t["failed"] == 0 and t["output_tokens"] > 0
        assert t["output_throughput"] > 0 and t["ttft_ms"]["p50"] > 0
        assert t["tpot_ms"]["p99"] >= t["tpot_ms"]["p50"]
        for inst in run["instances"]:
            c = inst["client"]
            assert c["exit_code"] == 0 and c["error"] is None
            assert c["argv"][0] == sys.executable and c["argv"][1] == "-c"
            assert f"--base-url http://127.0.0.1:{inst['port']}" in c["command"]
            assert c["equivalent"].startswith("vllm bench serve ")
            assert c["summary"]["completed"] == inst["prompts"]
            assert inst["telemetry"]["samples"] >= 2
            assert inst["telemetry"]["kv_capacity_tokens"] > 0
            assert inst["telemetry"]["preemptions"] == 0
            assert inst["telemetry"]["died"] is None
    assert one["ratio_to_first"] == 1.0 and two["ratio_to_first"] > 0
    # one client process per instance for the whole bench: layout two's cpu0 client ran in
    # the process of layout one's (no second vLLM import); cpu1's is new
    assert [i["client"]["reused_process"] for i in one["instances"]] == [False]
    assert [i["client"]["reused_process"] for i in two["instances"]] == [True, False]
    assert doc["vllm_version"] and doc["workload"]["num_prompts"] == 16
    assert doc["restore"] == {"outcome": "restored", "layout": "orig"}
    # the table on stdout, a column per layout
    header = proc.stdout.splitlines()[0].split()
    assert header == ["one", "bad", "two"]
    assert "ratio to first" in proc.stdout
    md = out_md.read_text()
    assert "| outcome | ok | invalid | ok |" in md and "vllm bench serve" in md
    # the original layout is back; cpu0 kept serving throughout; cpu1 is gone
    after = status(home)
    assert after["supervisor"]["layout"] == "orig"
    insts = {i["name"]: i for i in after["instances"]}
    # the bench waited for cpu1's stop; the daemon drops a removed instance once stopped
    assert insts.get("cpu1", {"state": "stopped"})["state"] == "stopped"
    assert insts["cpu0"]["state"] == "ready"
    assert insts["cpu0"]["pid"] == cpu0_pid
    assert not bench_clients(home)
    # the daemon showed the bench's progress while it ran (what the dashboard draws)
    records = [b for b in seen if b]
    phases = {(b["layout"], b["phase"]) for b in records}
    for want in (("two", "waiting_ready"), ("two", "warming"), ("two", "collecting")):
        assert want in phases, seen
    assert ("orig", "restoring") in phases, seen
    assert ("bad", "applying") not in phases  # an invalid layout is never applied
    assert {b["pid"] for b in records} == {records[0]["pid"]}
    two = [b for b in records if b["layout"] == "two"]
    assert {(b["index"], b["count"]) for b in two} == {(3, 3)}
    # the requests done, from the clients' own progress: all 16 once they finished
    collecting = [b for b in two if b["phase"] == "collecting"]
    assert collecting[-1]["requests_done"] == collecting[-1]["requests_total"] == 16
    assert all(b["requests_done"] <= 16 for b in two if b["requests_done"] is not None)
    assert status(home)["bench"] is None  # gone once the bench ended


def test_an_instance_killed_mid_run_is_named_and_the_original_comes_back(node, tmp_path):
    home, paths, _ = node
    out_json = tmp_path / "bench.json"
    # long enough to be killed while it runs (384 prompts: the run must outlast the poll)
    proc = subprocess.Popen(
        [sys.executable, "-m", "vsup", "bench", str(paths["one"]), "--num-prompts", "384",
         "--input-len", "64", "--output-len", "400", "--yes", "--json", str(out_json)],
        env=dict(os.environ, VSUP_HOME=str(home)),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=outside_cwd(),
    )  # fmt: skip
    try:
        seen = []
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            seen.append(line)
            if line.rstrip().endswith("one: running") or not line:
                break
        assert "running" in seen[-1], "".join(seen)
        # past the client's test request, the daemon shows the measured run going on; the
        # kill follows at once (the run takes seconds: a sleep or a `vsup status` here let it
        # end first, and then no request could fail)
        bench, doc = wait_bench_phase(home, "running", 120, with_status=True)
        pid = {i["name"]: i["pid"] for i in doc["instances"]}["cpu0"]
        os.killpg(os.getpgid(pid), signal.SIGKILL)
        assert bench["layout"] == "one" and (bench["index"], bench["count"]) == (1, 1)
        assert bench["requests_total"] == 384 and 0 <= bench["requests_done"] < 384
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, "".join(seen) + err
    run = json.loads(out_json.read_text())["runs"][0]
    assert run["outcome"] in ("partial", "failed")
    died = run["instances"][0]["telemetry"]["died"]
    assert died is not None and died["state"] != "ready"
    assert any("cpu0 stopped serving during the run" in p for p in run["problems"])
    t = run["totals"]
    # killed mid-run: not every request completed, and every one is counted: the requests
    # in flight to the killed server (or a client's whole share, when it saved nothing) fail
    assert t["prompts"] == 384 and t["completed"] < 384, t
    assert t["completed"] + t["failed"] == 384, t
    assert t["failed"] > 0 or run["instances"][0]["client"]["error"]
    assert "cpu0 stopped serving during the run" in out  # below the table
    # the restore waited for cpu0 to be back (restarted by its policy)
    assert json.loads(out_json.read_text())["restore"]["outcome"] == "restored"
    insts = {i["name"]: i for i in status(home)["instances"]}
    assert insts["cpu0"]["state"] == "ready" and insts["cpu0"]["pid"] != pid


def test_sigterm_mid_run_stops_the_clients_and_restores(node, tmp_path):
    home, paths, _ = node
    out_json = tmp_path / "bench.json"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vsup",
            "bench",
            str(paths["one"]),
            *WORKLOAD,
            "--yes",
            "--json",
            str(out_json),
        ],  # fmt: skip
        env=dict(os.environ, VSUP_HOME=str(home)),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=outside_cwd(),
    )
    try:
        seen = []
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            seen.append(line)
            if "vLLM client(s)" in line or not line:
                break
        assert "vLLM client(s)" in seen[-1], "".join(seen)
        # the client is importing vLLM (before its barrier): stop the bench now
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, "".join(seen) + err
    assert "interrupted" in err and "the original layout orig is back" in err
    doc = json.loads(out_json.read_text())
    assert doc["interrupted"] and doc["runs"][0]["outcome"] == "interrupted"
    assert doc["restore"]["outcome"] == "restored"
    assert status(home)["supervisor"]["layout"] == "orig"
    deadline = time.monotonic() + 15
    while bench_clients(home) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not bench_clients(home)


def layout_on_disk(home: Path) -> str:
    """What a new daemon takes the running layout from: the state file's layout and journal
    position, and the journal's apply events (seq, layout), last ones last."""
    state = json.loads((home / "state.json").read_text())
    layout = state.get("layout") or {}
    applies = [
        (ev["seq"], ev.get("layout"))
        for line in (home / "journal.jsonl").read_text().splitlines()
        if '"action":"apply"' in line and (ev := json.loads(line))
    ]
    return f"state {layout.get('name')}, journal_seq {state.get('journal_seq')}; applies {applies}"


def test_keep_leaves_the_last_layout_running(node):
    home, paths, _ = node
    proc = vsup(home, "bench", str(paths["one"]), "--num-prompts", "4", "--input-len", "32",
                "--output-len", "8", "--yes", "--keep")  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "keeping layout one (--keep)" in proc.stderr
    assert status(home)["supervisor"]["layout"] == "one"


def test_a_layout_left_down_comes_back_down_with_no_daemon(node):
    """After `vsup down` the layout stays loaded with its instances stopped: the bench must
    not leave them serving (seen on the H200: it restarted the 0.90 instance at the end)."""
    home, paths, _ = node
    down = vsup(home, "down", "--yes", timeout=300)
    assert down.returncode == 0, down.stdout + down.stderr
    left = layout_on_disk(home)
    assert left.startswith("state one,"), left
    proc = vsup(home, "bench", str(paths["one"]), "--num-prompts", "4", "--input-len", "32",
                "--output-len", "8", "--yes")  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    shown = f"{proc.stderr}; left by vsup down: {left}; now: {layout_on_disk(home)}"
    assert "replaces the loaded layout one (none of its instances serves)" in proc.stderr, shown
    assert "stopping the daemon" in proc.stderr
    # a new daemon finds the layout loaded and cpu0 down
    assert vsup(home, "daemon", "--detach").returncode == 0
    after = status(home)
    assert after["supervisor"]["layout"] == "one"
    assert {i["name"]: i["state"] for i in after["instances"]} == {"cpu0": "stopped"}
