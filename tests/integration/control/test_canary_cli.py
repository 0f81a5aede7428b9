"""A canary against a real detached daemon and vLLM emulators (docs/canary.md): what `vsup
status` says while it is watched, `vsup rollout promote|abort`, and a daemon SIGKILLed during
the watch. The emulators' figures carry no request between two reads, so the watch runs its
whole `canary_s` unless ended by hand (the gate on real vLLM: tests/integration/router/
test_router_vsup.py)."""

from __future__ import annotations

import json
import signal

import pytest

from tests.integration.control.test_cli import cli_home, daemons_of, vsup  # noqa: F401
from tests.integration.control.test_status_during_rollout import wait_for
from tests.unit.control.helpers import emulator_layout, free_port

pytestmark = pytest.mark.timeout(240)

CANARY = 'canary_s = 600\ncanary_insufficient = "pass"\ndrain_timeout_s = 1'


def layout(ports: dict[str, int], say: str, header: str = CANARY) -> str:
    return emulator_layout(
        ports, extra_header=header, args=f'args = {{ say = "{say}", startup-s = 0.3 }}'
    )


def rollout(home) -> dict:
    return json.loads(vsup(home, "status", "--json").stdout)["rollout"] or {}


def watching(home) -> bool:
    r = rollout(home)
    return r.get("state") == "running" and r.get("canary_state") == "watching"


def test_promote_and_abort_end_the_watch_and_say_so(cli_home, tmp_path):  # noqa: F811
    ports = {"a": free_port(), "b": free_port()}
    path = tmp_path / "l.toml"
    path.write_text(layout(ports, "v1"))
    assert vsup(cli_home, "up", str(path), "--detach", "--wait").returncode == 0
    none = vsup(cli_home, "rollout", "promote")
    assert none.returncode == 1 and "no canary is being watched" in none.stderr

    path.write_text(layout(ports, "v2"))
    assert vsup(cli_home, "up", str(path), "--detach", "--yes").returncode == 0
    wait_for(lambda: watching(cli_home), 60, "the canary's watch")
    out = vsup(cli_home, "status").stdout
    assert "ROLLOUT wave 1/2: watching canary a for 600 s beside b (old config)" in out, out
    promoted = vsup(cli_home, "rollout", "promote")
    assert promoted.returncode == 0 and "canary promoted" in promoted.stdout
    wait_for(lambda: rollout(cli_home).get("state") == "done", 60, "the rollout's end")
    assert rollout(cli_home)["verdict"].startswith("canary a: promoted by hand after")

    path.write_text(layout(ports, "v3"))
    assert vsup(cli_home, "up", str(path), "--detach", "--yes").returncode == 0
    wait_for(lambda: watching(cli_home), 60, "the second canary's watch")
    aborted = vsup(cli_home, "rollout", "abort")
    assert aborted.returncode == 0 and "canary aborted" in aborted.stdout
    wait_for(lambda: rollout(cli_home).get("state") == "rolled_back", 60, "the rollback")
    doc = json.loads(vsup(cli_home, "status", "--json").stdout)
    a = next(i for i in doc["instances"] if i["name"] == "a")
    assert a["state"] == "ready" and a["outdated"]  # back on v2 while the layout says v3
    assert any(x["kind"] == "canary_rolled_back" for x in doc["advice"])
    events = vsup(cli_home, "events").stdout
    assert "canary a: aborted by hand after" in events and "; rolled back" in events, events


def test_a_daemon_killed_during_the_watch_leaves_it_interrupted(cli_home, tmp_path):  # noqa: F811
    ports = {"a": free_port(), "b": free_port()}
    path = tmp_path / "l.toml"
    path.write_text(layout(ports, "v1"))
    assert vsup(cli_home, "up", str(path), "--detach", "--wait").returncode == 0
    path.write_text(layout(ports, "v2"))
    assert vsup(cli_home, "up", str(path), "--detach", "--yes").returncode == 0
    wait_for(lambda: watching(cli_home), 60, "the canary's watch")
    (daemon,) = daemons_of(cli_home)
    daemon.send_signal(signal.SIGKILL)
    daemon.wait(30)
    # the next daemon finds the rollout in the state file
    assert vsup(cli_home, "daemon", "--detach").returncode == 0
    r = wait_for(lambda: rollout(cli_home), 30, "the restored rollout")
    assert r["state"] == "interrupted" and r["canary"] == ["a"], r
    assert r["old_config"] == ["b"]  # the canary keeps the new spec, b the old one
    # re-adopted instances show ready after their first health check (the restore waits for
    # it at most 5 s)
    doc = wait_for(
        lambda: (
            (d := json.loads(vsup(cli_home, "status", "--json").stdout))
            and {i["name"]: i["state"] for i in d["instances"]} == {"a": "ready", "b": "ready"}
            and d
        ),
        60,
        "a and b re-adopted and ready",
    )
    assert any(x["kind"] == "rollout_interrupted" for x in doc["advice"])
