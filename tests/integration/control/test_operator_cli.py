"""An operator's day on the command line (issue 25), as operators run it: real subprocesses, a
real detached daemon, vLLM emulators as instances and the real vllm-router in front of them.

Read-only commands never start a daemon; `vsup logs` follows every log, counts lines and shows
the router's; the router has start/stop/restart verbs; `vsup events` reads the journal in words;
`vsup service` writes a unit whose daemon, started as systemd would after every process was
killed (a reboot), starts the layout fresh and adopts nothing; the demo says how to re-attach.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import outside_cwd
from tests.conftest import run_vsup as vsup
from tests.integration.control.test_cli import daemons_of
from tests.unit.control.helpers import emulator_layout, free_port

pytestmark = pytest.mark.timeout(240)
ROUTER = Path(sys.executable).parent / "vllm-router"
LOCAL_TIME = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d  ")


def wait_for(check, timeout: float = 60.0, what: str = "it"):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            assert value, f"timed out waiting for {what}"
            return value
        time.sleep(0.1)


def status(home: Path) -> dict:
    res = vsup(home, "status", "--json")
    assert res.returncode in (0, 1), res.stderr
    return json.loads(res.stdout)


def journal(home: Path) -> list[dict]:
    return [json.loads(x) for x in (home / "journal.jsonl").read_text().splitlines() if x.strip()]


def kill_everything(home: Path) -> None:
    for p in daemons_of(home):
        p.kill()
    if (home / "journal.jsonl").exists():
        for ev in journal(home):
            if ev.get("kind") == "spawn" and ev.get("pgid"):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(ev["pgid"], signal.SIGKILL)


@pytest.fixture
def home(vsup_home):
    yield vsup_home
    if daemons_of(vsup_home):
        vsup(vsup_home, "down", timeout=120)
    kill_everything(vsup_home)


def popen(home: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "vsup", *args],
        env=dict(os.environ, VSUP_HOME=str(home)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=outside_cwd(),
    )


def read_until(proc: subprocess.Popen, want, timeout: float = 60.0) -> str:
    """What `proc` wrote to stdout until `want(text)` holds (or the time is up)."""
    import select

    fd = proc.stdout.fileno()
    seen = b""
    deadline = time.monotonic() + timeout
    while not want(seen.decode(errors="replace")) and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            seen += chunk
    return seen.decode(errors="replace")


# -- read-only commands ---------------------------------------------------------------------


def test_read_only_commands_never_start_a_daemon(home, tmp_path):
    for args in (
        ("status",),
        ("status", "--json"),
        ("logs", "a"),
        ("logs", "-f"),
        ("events",),
        ("save", str(tmp_path / "x.toml")),
        ("tui", "--readonly"),
    ):
        res = vsup(home, *args)
        assert res.returncode == 4, (args, res.stdout, res.stderr)
        assert f"no vsup daemon runs for VSUP_HOME={home}" in res.stderr, (args, res.stderr)
        assert "0/0 ready" not in res.stdout
        assert daemons_of(home) == [], f"`vsup {' '.join(args)}` started a daemon"
        assert not (home / "vsup.sock").exists()
    assert not (tmp_path / "x.toml").exists()
    # what changes something starts it, and says so
    started = vsup(home, "daemon", "--detach")
    assert started.returncode == 0 and f"started for VSUP_HOME={home}" in started.stderr
    assert json.loads(started.stdout)["home"] == str(home)  # the ping answer, for scripts
    assert len(daemons_of(home)) == 1
    doc = status(home)
    assert doc["instances"] == []
    again = vsup(home, "daemon", "--detach")
    assert f"(pid {doc['supervisor']['pid']}) already serves" in again.stderr
    assert json.loads(again.stdout)["pid"] == doc["supervisor"]["pid"]


# -- the router, logs and events ------------------------------------------------------------


def router_layout(tmp_path: Path) -> Path:
    path = tmp_path / "routed.toml"
    text = emulator_layout({"a": free_port(), "b": free_port()})
    text += (
        f'\n[router]\nport = {free_port()}\nmetrics_port = {free_port()}\nhost = "127.0.0.1"\n'
        f'policy = "round_robin"\ncommand = ["{ROUTER}"]\n'
    )
    path.write_text(text)
    return path


@pytest.mark.skipif(not ROUTER.exists(), reason="vllm-router (the router extra) is not installed")
def test_the_router_has_verbs_logs_and_events_like_an_instance(home, tmp_path):
    up = vsup(home, "up", str(router_layout(tmp_path)), "--detach", "--wait", "--timeout", "120")
    assert up.returncode == 0, up.stdout + up.stderr
    first = status(home)["router"]
    assert first["state"] == "ready"

    # its log, by either name
    for name in ("@router", "router"):
        res = vsup(home, "logs", name)
        assert res.returncode == 0, res.stderr
        assert "vllm_router" in res.stdout or "Starting" in res.stdout, res.stdout[:500]

    restarted = vsup(home, "restart", "@router", "--wait", "--timeout", "60")
    assert restarted.returncode == 0 and "@router: ready" in restarted.stdout, restarted.stderr
    second = status(home)["router"]
    assert second["pid"] != first["pid"] and second["run"] == first["run"] + 1

    stopped = vsup(home, "stop", "router")
    assert stopped.returncode == 0 and "@router: stopped" in stopped.stdout, stopped.stderr
    assert status(home)["router"]["state"] == "stopped"
    assert not psutil.pid_exists(second["pid"]) or (
        psutil.Process(second["pid"]).status() == psutil.STATUS_ZOMBIE
    )
    started = vsup(home, "start", "@router", "--wait", "--timeout", "60")
    assert started.returncode == 0 and "@router: ready" in started.stdout, started.stderr
    drain = vsup(home, "drain", "@router")
    assert drain.returncode == 2 and "no requests of its own" in drain.stderr

    # the previous run's log too
    prev = vsup(home, "logs", "@router", "--previous")
    assert prev.returncode == 0 and prev.stdout

    # -n counts lines; without a name every log, each line prefixed with its name
    three = vsup(home, "logs", "a", "-n", "3")
    assert three.returncode == 0 and len(three.stdout.splitlines()) == 3, three.stdout
    whole = vsup(home, "logs", "a").stdout.splitlines()
    assert three.stdout.splitlines() == whole[-3:]
    every = vsup(home, "logs", "-n", "2")
    assert every.returncode == 0, every.stderr
    by_name: dict[str, int] = {}
    for line in every.stdout.splitlines():
        who, sep, _ = line.partition(" | ")
        assert sep, f"an unprefixed line: {line!r}"
        by_name[who.strip()] = by_name.get(who.strip(), 0) + 1
    assert by_name == {"a": 2, "b": 2, "@router": 2}, every.stdout

    # following all of them: a restart of b shows, prefixed, with the new run's lines
    follower = popen(home, "logs", "-f", "-n", "1")
    try:
        read_until(follower, lambda t: "@router | " in t and re.search(r"^b\s+\| ", t, re.M))
        assert vsup(home, "restart", "b", "--wait", "--timeout", "60").returncode == 0
        seen = read_until(follower, lambda t: "--- run 2 ---" in t and "startup complete" in t)
    finally:
        follower.terminate()
        follower.wait(10)
    b_lines = [ln for ln in seen.splitlines() if ln.startswith("b ")]
    assert any("--- run 2 ---" in ln for ln in b_lines), seen
    assert any("startup complete" in ln for ln in b_lines), seen

    # the journal in words: local time, whose, what
    events = vsup(home, "events", "--since", "1h")
    assert events.returncode == 0, events.stderr
    lines = events.stdout.splitlines()
    assert lines and all(LOCAL_TIME.match(ln) for ln in lines), lines[:5]
    text = events.stdout
    assert re.search(r"vsup\s+operator: restart @router", text), text
    assert re.search(r"@router\s+ready after \d+\.\d s \(run 2", text), text
    assert re.search(r"@router\s+stopped \(run 2", text), text
    assert re.search(r"b\s+stopped \(run 1, killed by SIGTERM\)", text), text
    assert re.search(r"@router\s+workers: added a, b", text), text
    assert " state " not in text and '"from"' not in text  # transitions stay out of the text
    only_b = vsup(home, "events", "--instance", "b").stdout.splitlines()
    assert only_b and all(re.match(r"^\S+ \S+  (b|vsup) ", ln) for ln in only_b), only_b
    assert any("operator: restart b" in ln for ln in only_b)
    as_json = [json.loads(ln) for ln in vsup(home, "events", "--json").stdout.splitlines()]
    assert {e["kind"] for e in as_json} >= {"spawn", "ready", "state", "router_workers"}
    assert [e["seq"] for e in as_json] == sorted(e["seq"] for e in as_json)
    future = vsup(home, "events", "--since", "1s")
    assert future.returncode == 0
    bad = vsup(home, "events", "--since", "yesterday-ish")
    assert bad.returncode == 2 and "--since" in bad.stderr

    # once it printed what was there (b's restart), it follows: a's stop is new to it
    watcher = popen(home, "events", "-f", "--since", "1h")
    try:
        read_until(watcher, lambda t: "operator: restart b" in t)
        assert vsup(home, "stop", "a").returncode == 0
        # a's own line: b's "stopped (run 1" is already in what it printed
        seen = read_until(
            watcher, lambda t: "operator: stop a" in t and re.search(r"\ba\s+stopped \(run 1", t)
        )
    finally:
        watcher.terminate()
        watcher.wait(10)
    assert "operator: stop a" in seen and re.search(r"\ba\s+stopped \(run 1", seen), seen


def test_plain_router_means_the_instance_of_that_name_when_there_is_one(home, tmp_path):
    layout = tmp_path / "named.toml"
    layout.write_text(emulator_layout({"router": free_port(), "b": free_port()}))
    assert vsup(home, "up", str(layout), "--detach", "--wait", "--timeout", "60").returncode == 0
    pid = {i["name"]: i["pid"] for i in status(home)["instances"]}["router"]
    res = vsup(home, "restart", "router", "--wait", "--timeout", "60")
    assert res.returncode == 0 and "router: ready" in res.stdout and "@router" not in res.stdout
    assert {i["name"]: i["pid"] for i in status(home)["instances"]}["router"] != pid
    assert "Starting vLLM server" in vsup(home, "logs", "router").stdout
    none = vsup(home, "restart", "@router")
    assert none.returncode == 2 and "no [router]" in none.stderr


def test_plain_router_without_a_router_or_such_instance_says_so(home, tmp_path):
    layout = tmp_path / "plain.toml"
    layout.write_text(emulator_layout({"a": free_port()}))
    assert vsup(home, "up", str(layout), "--detach", "--wait", "--timeout", "60").returncode == 0
    res = vsup(home, "stop", "router")
    assert res.returncode == 2
    assert "no instance is named 'router' and the running layout has no [router]" in res.stderr


# -- the daemon across reboots --------------------------------------------------------------


def unit_env(unit: dict) -> dict[str, str]:
    from vsup.commands.service import unquote_words

    env = {}
    for value in unit["Service"].get("Environment", ()):
        for word in unquote_words(value):
            key, _, val = word.partition("=")
            env[key] = val
    return env


def test_service_unit_brings_the_layout_back_fresh_after_a_reboot(home, tmp_path):
    from vsup.commands.service import parse_unit, unquote_words

    config = tmp_path / "config"
    env = {"XDG_CONFIG_HOME": str(config)}
    inst = subprocess.run(
        [sys.executable, "-m", "vsup", "service", "install"],
        env=dict(os.environ, VSUP_HOME=str(home), **env),
        capture_output=True,
        text=True,
        cwd=outside_cwd(),
    )
    assert inst.returncode == 0, inst.stderr
    path = config / "systemd" / "user" / "vsup.service"
    assert f"wrote {path}" in inst.stdout
    assert "systemctl --user enable --now vsup.service" in inst.stdout
    assert "loginctl enable-linger" in inst.stdout and "sudo" not in inst.stderr
    text = path.read_text()
    unit = parse_unit(text)
    service = unit["Service"]
    assert unquote_words(service["ExecStart"][0]) == [sys.executable, "-m", "vsup", "daemon"]
    assert unit_env(unit)["VSUP_HOME"] == str(home)
    assert service["KillMode"] == ["process"] and service["Restart"] == ["on-failure"]
    assert unit["Install"]["WantedBy"] == ["default.target"]
    analyze = shutil.which("systemd-analyze")
    if analyze:  # not on this project's machines; where it exists, systemd checks the file too
        check = subprocess.run([analyze, "verify", str(path)], capture_output=True, text=True)
        assert check.returncode == 0, check.stderr

    # A layout runs; then "the reboot": every process of it dies at once, daemon included.
    layout = tmp_path / "l.toml"
    layout.write_text(emulator_layout({"a": free_port(), "b": free_port()}))
    assert vsup(home, "up", str(layout), "--detach", "--wait", "--timeout", "60").returncode == 0
    before = {i["name"]: i["pid"] for i in status(home)["instances"]}
    kill_everything(home)
    wait_for(lambda: not daemons_of(home), 10, "the daemon to die")
    wait_for(lambda: not any(psutil.pid_exists(p) for p in before.values()), 10, "instances")
    seq = max(e["seq"] for e in journal(home))

    # The daemon starts as the unit starts it: its ExecStart, its environment, its directory.
    boot = subprocess.Popen(
        unquote_words(service["ExecStart"][0]),
        env={"HOME": os.environ.get("HOME", "/"), **unit_env(unit)},
        cwd=unquote_words(service["WorkingDirectory"][0])[0],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_for(lambda: vsup(home, "status").returncode != 4, 60, "the boot daemon to answer")
        after = wait_for(
            lambda: (
                ((doc := status(home)) and all(i["state"] == "ready" for i in doc["instances"]))
                and doc
            ),
            60,
            "the layout to serve again",
        )
        assert after["supervisor"]["pid"] == boot.pid
        now = {i["name"]: i["pid"] for i in after["instances"]}
        assert set(now) == {"a", "b"} and not set(now.values()) & set(before.values())
        since = [e for e in journal(home) if e["seq"] > seq]
        adopts = [e for e in since if e["kind"] == "adopt"]
        assert adopts and not [e for e in adopts if e.get("adopted")], adopts
        st = subprocess.run(
            [sys.executable, "-m", "vsup", "service", "status"],
            env=dict(os.environ, VSUP_HOME=str(home), **env),
            capture_output=True,
            text=True,
        )
        assert st.returncode == 0, st.stdout + st.stderr
        assert f"VSUP_HOME: {home}" in st.stdout and f"daemon: pid {boot.pid} answers" in st.stdout
    finally:
        vsup(home, "down", timeout=120)
        boot.wait(30)

    un = subprocess.run(
        [sys.executable, "-m", "vsup", "service", "uninstall"],
        env=dict(os.environ, VSUP_HOME=str(home), **env),
        capture_output=True,
        text=True,
    )
    assert un.returncode == 0 and not path.exists()
    assert "systemctl --user disable vsup.service" in un.stdout
    path.write_text("[Service]\nExecStart=/bin/true\n")  # someone else's unit
    refused = subprocess.run(
        [sys.executable, "-m", "vsup", "service", "uninstall"],
        env=dict(os.environ, VSUP_HOME=str(home), **env),
        capture_output=True,
        text=True,
    )
    assert refused.returncode == 1 and path.exists()


def test_service_never_writes_a_secret_into_the_unit(home, tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "vsup", "service", "install", "--print", "--env", "HF_TOKEN"],
        env=dict(os.environ, VSUP_HOME=str(home), HF_TOKEN="hf_secret"),
        capture_output=True,
        text=True,
    )
    assert res.returncode == 2 and "hf_secret" not in res.stdout + res.stderr
    assert "service.env" in res.stderr


# -- the demo -------------------------------------------------------------------------------


def test_the_demos_detach_message_names_what_really_reattaches(home, tmp_path):
    layout = tmp_path / "demo.toml"
    layout.write_text(emulator_layout({"a": free_port()}))
    res = subprocess.run(
        [sys.executable, "-m", "vsup.demo", "--layout", str(layout), "--no-load", "--no-tui"],
        env=dict(os.environ, VSUP_HOME=str(home)),
        capture_output=True,
        text=True,
        cwd=outside_cwd(),
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert "make demo-attach" in res.stdout
    (command,) = re.findall(r"or:  (VSUP_HOME=\S+ \S+)", res.stdout)
    assert command.startswith(f"VSUP_HOME={home} ")
    # what it names attaches to the demo's daemon (here: a read-only look through it)
    program = shlex.split(command.split(" ", 1)[1])
    attach = subprocess.run(
        [*program, "status"],
        env=dict(os.environ, VSUP_HOME=str(home)),
        capture_output=True,
        text=True,
        cwd=outside_cwd(),
    )
    assert attach.returncode in (0, 1) and re.search(r"\ba\s+(ready|starting)", attach.stdout)


# -- messages -------------------------------------------------------------------------------


def test_port_in_use_says_which_port_and_who_holds_it(home, tmp_path):
    import socket

    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        layout = tmp_path / "taken.toml"
        layout.write_text(emulator_layout({"a": port}))
        up = vsup(home, "up", str(layout), "--detach", "--wait", "--timeout", "60")
        assert up.returncode == 1 and "a: failed (last exit: port_in_use)" in up.stderr
        assert f"port {port} is taken" in up.stderr and "port_in_use fails fast" in up.stderr
        table = vsup(home, "status")
        assert table.returncode == 1
        (line,) = [ln for ln in table.stdout.splitlines() if ln.startswith("a: last exit")]
        assert "(?)" not in line and "port_in_use (refused before it started)" in line
        assert f"port {port} on 127.0.0.1 is in use by pid {os.getpid()}" in line, line
    finally:
        holder.close()
