"""Alerts: incidents from advice, de-duplication, minimum interval, resolved messages, delivery
to a real HTTP receiver on 127.0.0.1 and to a real command, retries, and the `[alerts]` table's
validation."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import threading
import time

import psutil
import pytest

from vsup.control.alerts import AlertConfig, Alerts
from vsup.layout.model import loads_layout
from vsup.layout.validate import validate
from vsup.snapshot import Advice

from tests.support.clock import FakeClock
from tests.unit.control.webhook_receiver import Receiver


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


async def alerts_for(url: str, clock: FakeClock, **table) -> Alerts:
    alerts = Alerts(clock, "node1", env={"HOOK": url}, retry_delays_s=(0.05, 0.05))
    alerts.configure(AlertConfig.from_table({"webhook_env": "HOOK", **table}))
    await alerts.start()
    return alerts


async def settle(alerts: Alerts) -> None:
    # generous: a command's Python start took over 10 s once on the suite's loaded 2 cores
    # (a fresh clone, 2026-12-06), and the test then hung in aclose (noted in docs/testing.md)
    await asyncio.wait_for(alerts.idle.wait(), 120)


CRASH = Advice("crash_loop", "warning", "a: crash loop, 3 failures in the last 10 min", "a")
ECC = Advice("gpu_ecc", "critical", "GPU 3: 2 uncorrectable ECC errors since boot: ...", gpu=3)


async def test_an_incident_is_sent_once_while_it_lasts_then_resolved(receiver) -> None:
    clock = FakeClock()
    alerts = await alerts_for(receiver.url, clock, resolve_after_s=60)
    try:
        for _ in range(5):
            alerts.observe([ECC])
            clock.advance(1)
        await settle(alerts)
        assert receiver.texts == [
            "[vsup node1] CRITICAL gpu_health: GPU 3: 2 uncorrectable ECC errors since boot: ..."
        ]
        assert set(receiver.bodies[0]) == {"text"}  # Slack's incoming-webhook body
        clock.advance(30)
        alerts.observe([])  # gone for 30 s: maybe flapping, not resolved yet
        await settle(alerts)
        assert len(receiver.texts) == 1
        clock.advance(31)
        alerts.observe([])
        await settle(alerts)
        assert receiver.texts[1].startswith("[vsup node1] RESOLVED gpu_health: GPU 3: 2 uncorr")
    finally:
        await alerts.aclose()


async def test_an_alert_that_comes_back_soon_waits_for_the_minimum_interval(receiver) -> None:
    clock = FakeClock()
    alerts = await alerts_for(receiver.url, clock, min_interval_s=300, resolve_after_s=0)
    try:
        alerts.observe([CRASH])
        clock.advance(10)
        alerts.observe([])  # resolved at once (resolve_after_s = 0)
        clock.advance(10)
        alerts.observe([CRASH])  # back within 300 s of the last message: held back
        await settle(alerts)
        assert [t.split(" ")[2] for t in receiver.texts] == ["WARNING", "RESOLVED"]
        clock.advance(281)
        alerts.observe([CRASH])  # still there once the interval has passed: sent
        await settle(alerts)
        assert [t.split(" ")[2] for t in receiver.texts] == ["WARNING", "RESOLVED", "WARNING"]
    finally:
        await alerts.aclose()


async def test_a_kind_no_longer_chosen_is_dropped_without_a_resolved_message(receiver) -> None:
    clock = FakeClock()
    alerts = await alerts_for(receiver.url, clock, resolve_after_s=0)
    try:
        alerts.observe([CRASH])
        alerts.configure(AlertConfig.from_table({"webhook_env": "HOOK", "kinds": ["failed"]}))
        clock.advance(5)
        alerts.observe([CRASH])
        await settle(alerts)
        assert [t.split(" ")[2] for t in receiver.texts] == ["WARNING"]
    finally:
        await alerts.aclose()


async def test_a_rise_in_severity_is_sent_at_once(receiver) -> None:
    clock = FakeClock()
    alerts = await alerts_for(receiver.url, clock)
    try:
        kv = Advice("kv_exhausted", "warning", "a: preempting (4/min)", "a")
        alerts.observe([kv])
        clock.advance(5)
        alerts.observe([Advice("kv_exhausted", "critical", "a: preempting (40/min)", "a")])
        await settle(alerts)
        assert receiver.texts == [
            "[vsup node1] WARNING preempting: a: preempting (4/min)",
            "[vsup node1] CRITICAL preempting: a: preempting (40/min)",
        ]
    finally:
        await alerts.aclose()


async def test_only_the_chosen_kinds_at_or_above_the_minimum_severity_are_sent(receiver) -> None:
    clock = FakeClock()
    alerts = await alerts_for(receiver.url, clock, kinds=["gpu_health"], min_severity="warning")
    try:
        alerts.observe(
            [
                CRASH,  # kind not chosen
                Advice("gpu_throttle", "info", "GPU 1: held at its power cap", gpu=1),  # info
                Advice("hbm_over_plan", "warning", "a: over plan", "a"),  # no alert kind
                ECC,
            ]
        )
        await settle(alerts)
        assert len(receiver.texts) == 1 and "gpu_health: GPU 3" in receiver.texts[0]
    finally:
        await alerts.aclose()


async def test_a_failing_receiver_is_retried_and_supervision_never_waits_for_it() -> None:
    """observe() only queues. The receiver holds every delivery on an event this test holds:
    both observe() calls return while the first delivery is still held there, then the
    deliveries are retried and arrive once the receiver answers. (A blocking observe() would
    return only when the safety timer opens the gate, and the first assert would fail.)"""
    gate = threading.Event()
    opener = threading.Timer(60, gate.set)
    opener.start()
    slow = Receiver(statuses=[500, 503], gate=gate)
    clock = FakeClock()
    alerts = await alerts_for(slow.url, clock)
    try:
        alerts.observe([ECC])
        alerts.observe([ECC, CRASH])
        assert not gate.is_set(), "observe() returned only once the receiver answered"
        for _ in range(600):  # the first delivery reaches the receiver, which holds it
            if slow.arrived:
                break
            await asyncio.sleep(0.05)
        assert slow.arrived >= 1 and slow.bodies == [] and not gate.is_set()
        gate.set()
        await settle(alerts)
        assert sorted(t.split(": ")[0] for t in slow.texts) == [
            "[vsup node1] CRITICAL gpu_health",
            "[vsup node1] WARNING crash_loop",
        ]
        assert alerts.failed == 2 and alerts.delivered == 2
    finally:
        gate.set()
        opener.cancel()
        await alerts.aclose()
        slow.close()


async def test_a_receiver_that_keeps_failing_is_given_up_on_and_logged(caplog) -> None:
    down = Receiver(statuses=[500] * 10)
    alerts = await alerts_for(down.url, FakeClock())
    try:
        with caplog.at_level(logging.WARNING, logger="vsup.control.alerts"):
            alerts.observe([ECC])
            await settle(alerts)
        assert alerts.failed == 3 and alerts.delivered == 0  # one try + two retries
        assert "gave up after 3 attempts (RuntimeError: HTTP 500" in caplog.text
    finally:
        await alerts.aclose()
        down.close()


async def test_an_unset_webhook_variable_is_logged_with_what_to_do(caplog) -> None:
    alerts = Alerts(FakeClock(), "node1", env={}, retry_delays_s=(0.01,))
    alerts.configure(AlertConfig.from_table({"webhook_env": "VSUP_ALERT_WEBHOOK"}))
    await alerts.start()
    try:
        with caplog.at_level(logging.ERROR, logger="vsup.control.alerts"):
            alerts.observe([ECC])
            await settle(alerts)
        assert "$VSUP_ALERT_WEBHOOK is not set in the daemon's environment" in caplog.text
        assert alerts.failed == 1  # not retried: retrying cannot set it
    finally:
        await alerts.aclose()


async def test_the_command_gets_the_alert_as_json_on_stdin_and_in_its_environment(
    tmp_path,
) -> None:
    out = tmp_path / "alert.json"
    script = (
        "import json, os, sys; d = json.load(sys.stdin); "
        "d['env_kind'] = os.environ['VSUP_ALERT_KIND']; "
        f"open({str(out)!r}, 'w').write(json.dumps(d))"
    )
    clock = FakeClock()
    alerts = Alerts(clock, "node1", retry_delays_s=(0.05,))
    alerts.configure(AlertConfig.from_table({"command": [sys.executable, "-c", script]}))
    await alerts.start()
    try:
        alerts.notify("daemon_restarted", "vsup daemon restarted on node1: re-adopted 2")
        await settle(alerts)
        doc = json.loads(out.read_text())
        assert doc["state"] == "firing" and doc["kind"] == "daemon_restarted"
        assert doc["env_kind"] == "daemon_restarted"
        assert doc["message"] == "vsup daemon restarted on node1: re-adopted 2"
        assert doc["node"] == "node1" and doc["at"].endswith("Z")
    finally:
        await alerts.aclose()


async def test_the_command_gets_no_secret_of_the_daemons_environment(tmp_path, monkeypatch) -> None:
    out = tmp_path / "env.json"
    script = f"import json, os; open({str(out)!r}, 'w').write(json.dumps(dict(os.environ)))"
    secret = "hf_" + "aB3dE6gH9jK2mN5pQ8sT1vW4yZ7bC0eF3h"
    for name, value in (
        ("HF_TOKEN", secret),
        ("VLLM_API_KEY", "k" * 24),
        ("VSUP_ALERT_WEBHOOK", "https://hooks.example/T0/B0/x"),
        ("AWS_SECRET_ACCESS_KEY", "y" * 40),
        ("LC_ALL", "C.UTF-8"),
    ):
        monkeypatch.setenv(name, value)  # fmt: skip
    alerts = Alerts(FakeClock(), "n", retry_delays_s=())
    alerts.configure(
        AlertConfig(webhook_env="VSUP_ALERT_WEBHOOK", command=(sys.executable, "-c", script))
    )
    await alerts.start()
    try:
        alerts.notify("daemon_restarted", "restarted")
        await settle(alerts)
        env = json.loads(out.read_text())
        assert set(env) - {"PATH", "HOME", "LANG", "TZ", "USER", "LOGNAME", "LC_ALL"} == {
            f"VSUP_ALERT_{k}"
            for k in ("TEXT", "STATE", "KIND", "ADVICE_KIND", "SEVERITY", "INSTANCE", "GPU",
                      "MESSAGE", "NODE", "AT")
        }  # fmt: skip
        assert env["LC_ALL"] == "C.UTF-8" and env["PATH"]
        assert secret not in out.read_text() and "hooks.example" not in out.read_text()
    finally:
        await alerts.aclose()


async def test_a_hung_target_delays_only_itself(tmp_path, receiver) -> None:
    """A command that hangs on every alert; the webhook gets all of them at once."""
    script = "import time; time.sleep(60)"
    alerts = Alerts(
        FakeClock(), "n", env={"HOOK": receiver.url}, retry_delays_s=(), command_timeout_s=30
    )
    alerts.configure(AlertConfig(webhook_env="HOOK", command=(sys.executable, "-c", script)))
    await alerts.start()
    try:
        alerts.observe(
            [Advice("crash_loop", "critical", f"i{n}: failed", f"i{n}") for n in range(8)]
        )
        for _ in range(100):
            if len(receiver.texts) == 8:
                break
            await asyncio.sleep(0.1)
        assert len(receiver.texts) == 8, receiver.texts
        assert not alerts.idle.is_set()  # the command is still on its first alert
    finally:
        await alerts.aclose()


async def test_what_was_sent_is_kept_for_the_next_daemon(tmp_path, receiver) -> None:
    state = tmp_path / "alerts.json"
    clock = FakeClock()
    first = Alerts(clock, "n", env={"HOOK": receiver.url}, retry_delays_s=(), state_path=state)
    first.configure(AlertConfig(webhook_env="HOOK", resolve_after_s=10))
    await first.start()
    first.observe([ECC, CRASH])
    await settle(first)
    await first.aclose()
    assert len(receiver.texts) == 2
    clock.advance(5)
    second = Alerts(clock, "n", env={"HOOK": receiver.url}, retry_delays_s=(), state_path=state)
    second.configure(AlertConfig(webhook_env="HOOK", resolve_after_s=10))
    await second.start()
    try:
        second.observe([ECC, CRASH])  # still there: nothing new to say
        await settle(second)
        assert len(receiver.texts) == 2
        clock.advance(11)
        second.observe([CRASH])  # the ECC incident cleared: it is resolved, once
        await settle(second)
        assert len(receiver.texts) == 3 and receiver.texts[2].startswith("[vsup n] RESOLVED")
    finally:
        await second.aclose()


async def test_a_failing_command_is_retried(tmp_path) -> None:
    marker = tmp_path / "tried"
    # fails the first time, succeeds the second
    script = (
        "import os, sys; p = sys.argv[1]; "
        "sys.exit(0) if os.path.exists(p) else (open(p, 'w').close(), sys.exit('busy'))"
    )
    alerts = Alerts(FakeClock(), "n", retry_delays_s=(0.05,))
    alerts.configure(AlertConfig(command=(sys.executable, "-c", script, str(marker))))
    await alerts.start()
    try:
        alerts.observe([ECC])
        await settle(alerts)
        assert (alerts.failed, alerts.delivered) == (1, 1)
    finally:
        await alerts.aclose()


async def test_a_command_that_hangs_is_killed_with_what_it_started(tmp_path) -> None:
    pidfile = tmp_path / "child.pid"
    script = (
        "import subprocess, sys, time; "
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        f"open({str(pidfile)!r}, 'w').write(str(c.pid)); time.sleep(60)"
    )
    # 5 s: the command's Python and its child must start and write the pid first (a start
    # took seconds on a loaded 2-core run)
    alerts = Alerts(FakeClock(), "n", retry_delays_s=(), command_timeout_s=5.0)
    alerts.configure(AlertConfig(command=(sys.executable, "-c", script)))
    await alerts.start()
    try:
        alerts.observe([ECC])
        await settle(alerts)
        assert (alerts.failed, alerts.delivered) == (1, 0)
        child = int(pidfile.read_text())
        for _ in range(50):  # the kernel reaps it a moment after SIGKILL
            try:
                if psutil.Process(child).status() == psutil.STATUS_ZOMBIE:
                    break
            except psutil.NoSuchProcess:
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError(f"pid {child} outlived the alert command")
    finally:
        await alerts.aclose()


def test_alerts_are_off_without_a_table_or_a_target() -> None:
    assert AlertConfig.from_table(None) is None
    assert AlertConfig.from_table({"kinds": ["failed"]}) is None
    cfg = AlertConfig.from_table({"webhook_env": "H", "kinds": ["failed"], "resolved": False})
    assert cfg is not None and cfg.kinds == {"failed"} and cfg.resolved is False


# ---------------------------------------------------------------------------------- layout

LAYOUT = """\
[defaults]
model = "org/model"

[[instance]]
name = "c0"
gpus = []
port = 8101

[alerts]
"""


def errors(alerts_table: str) -> list[str]:
    layout = loads_layout(LAYOUT + alerts_table, "/tmp/l.toml")
    return [d.format() for d in validate(layout, node_gpus=0) if d.is_error]


def test_a_valid_alerts_table_passes_and_is_read_back() -> None:
    table = 'webhook_env = "VSUP_ALERT_WEBHOOK"\nkinds = ["failed", "gpu_health"]\n'
    assert errors(table) == []
    layout = loads_layout(LAYOUT + table)
    assert AlertConfig.from_table(layout.alerts).kinds == {"failed", "gpu_health"}


@pytest.mark.parametrize(
    ("table", "says"),
    [
        ("min_interval_s = 60\n", "says nowhere to send alerts"),
        ('webhook_env = "https://hooks.slack.com/x"\n', "not an environment variable name"),
        ('webhook_env = "H"\nkinds = ["crashloop"]\n', "unknown alert kind 'crashloop'"),
        ('webhook_env = "H"\nmin_severity = "high"\n', "must be one of info, warning, critical"),
        ('webhook_env = "H"\nretries = 3\n', "unknown key"),
        ("command = []\n", "must name the program"),
        (
            'command = ["page", "--api-key", "k"]\n',
            "--api-key takes a secret; a secret must not be written in the layout",
        ),
        ('command = ["page", "xoxb-1234567890-abcdefghij"]\n', "the value looks like"),
    ],
)
def test_a_bad_alerts_table_is_an_error_naming_the_key(table: str, says: str) -> None:
    found = errors(table)
    assert found and says in found[0], found
    assert "[alerts]" in found[0] or "alerts" in found[0]


async def test_a_write_in_flight_at_close_ends_before_close_returns(tmp_path, monkeypatch) -> None:
    """aclose() while the persist loop's write runs in its thread (slow disk): the write is
    waited for and the newest state is on disk when aclose returns, never an older one after."""
    import vsup.control.alerts as alerts_mod

    real_write = alerts_mod.write_atomic
    started = threading.Event()
    writes: list[str] = []

    def slow_first_write(path, text, **kw):
        writes.append(text)
        if len(writes) == 1:
            started.set()
            time.sleep(0.5)
        real_write(path, text, **kw)

    monkeypatch.setattr(alerts_mod, "write_atomic", slow_first_write)
    state = tmp_path / "alerts.json"
    alerts = Alerts(FakeClock(), "n", env={}, retry_delays_s=(), state_path=state)
    alerts.configure(AlertConfig(command=("true",), resolve_after_s=10))
    await alerts.start()
    alerts.observe([ECC])
    await asyncio.to_thread(started.wait, 10)
    alerts.observe([ECC, CRASH])  # a change while the first write is on its way
    await alerts.aclose()
    on_disk = json.loads(state.read_text())
    assert {i["kind"] for i in on_disk["incidents"]} == {"gpu_ecc", "crash_loop"}
    await asyncio.sleep(0.6)  # an older write overtaking the last one would land by now
    assert {i["kind"] for i in json.loads(state.read_text())["incidents"]} == {
        "gpu_ecc",
        "crash_loop",
    }
