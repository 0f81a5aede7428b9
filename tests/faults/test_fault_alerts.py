"""Alerts from a real daemon to a webhook receiver on 127.0.0.1 and to a command that hangs:
16 crash-looping instances all reach the webhook while the command sleeps; the command gets a
clean environment (none of the daemon's secrets); and a restarted daemon does not page again
for incidents the previous one sent."""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import outside_cwd
from tests.faults.helpers import daemons_of, instance, status, wait_for
from tests.unit.control.helpers import EMULATOR, free_port
from tests.unit.control.webhook_receiver import Receiver

pytestmark = pytest.mark.timeout(300)

HF = "hf_" + "aB3dE6gH9jK2mN5pQ8sT1vW4yZ7bC0eF3h"  # the shape of a Hugging Face token
CRASHERS = [f"f{i:02d}" for i in range(16)]
# dumps its environment, then hangs (the daemon kills it after its 30 s timeout)
HANG = "import os, sys, time; open(sys.argv[1] + '/env-%d' % os.getpid(), 'w').write(repr(dict(os.environ))); time.sleep(600)"


def layout_text(ports: dict[str, int], crashers: list[str], command: list[str] | None) -> str:
    cmd = json.dumps([sys.executable, str(EMULATOR)])
    alert_command = f"command = {json.dumps(command)}" if command else ""
    text = f"""[layout]
name = "alerting"

[defaults]
model = "test/fake"
command = {cmd}
host = "127.0.0.1"
health_interval_s = 0.1
api_key_env = "VSUP_TEST_KEY"
restart = {{ policy = "on-failure", backoff_s = 0.1, backoff_max_s = 0.2, stable_s = 60, max_failures = 2 }}

[alerts]
webhook_env = "VSUP_TEST_HOOK"
{alert_command}
kinds = ["crash_loop"]
min_severity = "critical"

[[instance]]
name = "ok"
gpus = []
port = {ports["ok"]}
restart = {{ max_failures = 3 }}
"""
    for name in crashers:
        text += f'\n[[instance]]\nname = "{name}"\ngpus = []\nport = {ports[name]}\ncommand = ["false"]\n'
    return text


def run(home: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """`vsup ARGS` with `env` added: a daemon it starts has the secrets in its environment."""
    return subprocess.run(
        [sys.executable, "-m", "vsup", *args],
        env=dict(os.environ, VSUP_HOME=str(home), **env),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=outside_cwd(),
        stdin=subprocess.DEVNULL,
    )


def critical(receiver: Receiver) -> dict[str, int]:
    """How many CRITICAL crash_loop alerts each instance got."""
    out: dict[str, int] = {}
    for t in receiver.texts:
        if "CRITICAL crash_loop: " in t:
            name = t.split("CRITICAL crash_loop: ", 1)[1].split(":", 1)[0]
            out[name] = out.get(name, 0) + 1
    return out


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def secrets_for(receiver: Receiver) -> dict[str, str]:
    return {"VSUP_TEST_HOOK": receiver.url, "VSUP_TEST_KEY": "k-" + "x" * 20, "HF_TOKEN": HF}


def test_a_hung_alert_command_delays_no_webhook_alert_and_sees_no_secret(
    fault_home, tmp_path, receiver
):
    home = fault_home
    envs = tmp_path / "envs"
    envs.mkdir()
    secrets = secrets_for(receiver)
    ports = {name: free_port() for name in ["ok", *CRASHERS]}
    layout = tmp_path / "alerting.toml"
    hang = [sys.executable, "-c", HANG, str(envs)]
    layout.write_text(layout_text(ports, CRASHERS, hang))
    res = run(home, secrets, "up", str(layout), "--detach", "--yes")
    assert res.returncode == 0, res.stdout + res.stderr

    # Every crasher's incident reaches the webhook although the command hangs 30 s a call
    # (one after another on one worker, the 16th would come after 7 minutes).
    wait_for(lambda: set(critical(receiver)) >= set(CRASHERS), 120, "16 alerts on the webhook")
    assert critical(receiver) == dict.fromkeys(CRASHERS, 1)
    # The command ran, with the alert and without any of the daemon's secrets.
    dumps = wait_for(lambda: list(envs.glob("env-*")), 60, "the alert command's env dump")
    env = wait_for(lambda: dumps[0].read_text(), 10, "the dump written")
    env = ast.literal_eval(env)
    assert env["VSUP_ALERT_KIND"] == "crash_loop" and "CRITICAL" in env["VSUP_ALERT_TEXT"]
    assert "PATH" in env
    leaked = [k for k, v in env.items() if k in secrets or v in secrets.values()]
    assert leaked == [], leaked


def test_a_restarted_daemon_does_not_page_again_for_what_was_sent(fault_home, tmp_path, receiver):
    home = fault_home
    secrets = secrets_for(receiver)
    crashers = CRASHERS[:3]
    ports = {name: free_port() for name in ["ok", *crashers]}
    layout = tmp_path / "alerting.toml"
    layout.write_text(layout_text(ports, crashers, None))
    res = run(home, secrets, "up", str(layout), "--detach", "--yes")
    assert res.returncode == 0, res.stdout + res.stderr
    wait_for(lambda: set(critical(receiver)) >= set(crashers), 120, "3 alerts on the webhook")

    # A new daemon (the old one SIGTERMed: instances stay as they are) keeps what was sent.
    (daemon,) = daemons_of(home)
    daemon.send_signal(signal.SIGTERM)
    daemon.wait(60)
    start = run(home, secrets, "daemon", "--detach")  # the next daemon, with the secrets
    assert start.returncode == 0, start.stderr
    res = run(home, secrets, "status", "--json")
    assert json.loads(res.stdout)["supervisor"]["pid"] != daemon.pid
    # Something new to send, queued behind whatever the new daemon's first polls queued:
    # "ok" is SIGKILLed until its breaker trips (3 failures), a critical crash_loop.
    for _ in range(3):
        pid = wait_for(
            lambda: instance(home, "ok")["state"] == "ready" and instance(home, "ok")["pid"],
            60,
            "ok ready",
        )
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda p=pid: instance(home, "ok")["pid"] != p, 60, "ok's exit seen")
    advice = {(a["kind"], a.get("instance")) for a in status(home)["advice"]}
    assert {("crash_loop", n) for n in crashers} <= advice  # still open incidents
    wait_for(lambda: "ok" in critical(receiver), 120, "ok's alert")
    sent = critical(receiver)
    assert {n: sent[n] for n in crashers} == dict.fromkeys(crashers, 1), receiver.texts
