"""`vsup rollback` against a real detached daemon and vLLM emulators (docs/canary.md,
"Rollback"): the previous layout applied again from the daemon's kept text, through `vsup up`'s
plan, consent and rolling restart. The processes' own command lines are the proof of what runs."""

from __future__ import annotations

import json

import psutil
import pytest

from tests.conftest import until
from tests.integration.control.test_cli import cli_home, vsup  # noqa: F401
from tests.unit.control.helpers import emulator_layout, free_port

pytestmark = pytest.mark.timeout(240)


def layout(ports: dict[str, int], name: str) -> str:
    # the emulator always reports a request running: each drain lasts drain_timeout_s
    text = emulator_layout(
        ports,
        extra_header="max_unavailable = 1\ndrain_timeout_s = 1",
        args=f'args = {{ say = "{name}", startup-s = 0.2 }}',
    )
    return text.replace('name = "fakes"', f'name = "{name}"')


def status(home) -> dict:
    return json.loads(vsup(home, "status", "--json").stdout)


def running(home) -> dict[str, tuple[int, str]]:
    """Each instance's pid and what its process was started with (`--say X`)."""
    out = {}
    for i in status(home)["instances"]:
        argv = psutil.Process(i["pid"]).cmdline()
        out[i["name"]] = (i["pid"], argv[argv.index("--say") + 1])
    return out


def test_rollback_applies_the_previous_layout_with_up_s_consent_and_rolling_restart(
    cli_home,  # noqa: F811
    tmp_path,
):
    home = cli_home
    none = vsup(home, "rollback", "--yes")
    assert none.returncode == 4 and "no vsup daemon" in none.stderr.lower(), none.stderr

    ports = {"a": free_port(), "b": free_port()}
    alpha, beta = tmp_path / "alpha.toml", tmp_path / "beta.toml"
    # a key that only warns: rollback says so too, from the daemon's dry run of the kept text
    warned = layout(ports, "alpha").replace("[layout]\n", "[layout]\ncanary_min_requests = 5\n")
    alpha.write_text(warned)
    beta.write_text(layout(ports, "beta"))
    up = vsup(home, "up", str(alpha), "--detach", "--wait", "--timeout", "90")
    assert up.returncode == 0, up.stdout + up.stderr
    only = vsup(home, "rollback", "--yes", "--detach")
    assert only.returncode == 1, only.stdout + only.stderr
    assert "vsup rollback: no previous layout: every kept layout is the running one" in (
        only.stderr
    )

    up = vsup(home, "up", str(beta), "--detach", "--wait", "--yes", "--timeout", "90")
    assert up.returncode == 0, up.stdout + up.stderr
    # the file is not what rollback reads: the text applied is
    alpha.write_text("this file was edited since\n")
    before = running(home)
    assert {n: say for n, (_, say) in before.items()} == {"a": "beta", "b": "beta"}

    # no terminal, no --yes: refused, nothing changed
    refused = vsup(home, "rollback", "--detach", "--wait")
    assert refused.returncode == 3, refused.stdout + refused.stderr
    assert "rolling back to layout alpha (seq " in refused.stdout
    assert f"from {alpha})" in refused.stdout
    assert "restart (changed, rolling): a, b" in refused.stdout
    assert "a: args.say: beta -> alpha" in refused.stdout, refused.stdout
    assert "vsup rollback: this stops or restarts serving instances (a, b)" in refused.stderr
    assert "key 'canary_min_requests': has no effect without a canary" in refused.stderr
    assert running(home) == before
    assert status(home)["supervisor"]["layout"] == "beta"

    listed = vsup(home, "rollback", "--list")
    assert listed.returncode == 0, listed.stderr
    rows = listed.stdout.splitlines()[1:]
    assert "beta" in rows[0] and "(running)" in rows[0], listed.stdout
    assert "alpha" in rows[1] and "<- vsup rollback" in rows[1] and str(alpha) in rows[1]
    alpha_seq = int(rows[1].split()[0])

    done = vsup(home, "rollback", "--yes", "--detach", "--wait", "--timeout", "90")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "rolling restart of 2 serving instance(s) under way" in done.stdout
    assert "rollout wave 2/2" in done.stdout, done.stdout
    after = running(home)
    assert {n: say for n, (_, say) in after.items()} == {"a": "alpha", "b": "alpha"}
    assert all(after[n][0] != before[n][0] for n in after)  # new processes, alpha's spec
    doc = status(home)
    assert doc["supervisor"]["layout"] == "alpha"
    assert doc["rollout"]["state"] == "done" and doc["rollout"]["waves"] == 2
    assert not any(i["outdated"] for i in doc["instances"])
    # the journal says it was a rollback, and to which kept layout
    events = vsup(home, "events")
    assert events.returncode == 0, events.stderr
    said = [line for line in events.stdout.splitlines() if "apply layout alpha" in line]
    assert len(said) == 2, events.stdout
    assert "operator: apply layout alpha" in said[0], said[0]
    assert f"operator: rollback to layout #{alpha_seq} (applied 20" in said[1], said[1]
    lines = vsup(home, "events", "--json").stdout.splitlines()
    applies = [
        e
        for e in map(json.loads, lines)
        if e["kind"] == "action" and e.get("action") == "apply" and "instance" not in e
    ]
    assert [e.get("rollback_of") for e in applies] == [None, None, alpha_seq], applies

    # a second rollback goes back to where the first one started (beta), not further
    again = vsup(home, "rollback", "--dry-run")
    assert again.returncode == 0 and "rolling back to layout beta" in again.stdout
    assert running(home) == after


def test_after_an_aborted_canary_rollback_makes_the_old_layout_the_running_one_again(
    cli_home,  # noqa: F811
    tmp_path,
):
    home = cli_home
    ports = {"a": free_port(), "b": free_port()}
    alpha, beta = tmp_path / "alpha.toml", tmp_path / "beta.toml"
    alpha.write_text(layout(ports, "alpha"))
    canary = 'canary_s = 600\ncanary_insufficient = "pass"\n'
    beta.write_text(layout(ports, "beta").replace("[layout]\n", "[layout]\n" + canary, 1))
    up = vsup(home, "up", str(alpha), "--detach", "--wait", "--timeout", "90")
    assert up.returncode == 0, up.stdout + up.stderr
    assert vsup(home, "up", str(beta), "--detach", "--yes").returncode == 0

    def rollout() -> dict:
        return status(home)["rollout"] or {}

    until(lambda: rollout().get("canary_state") == "watching", 60, "the canary's watch")
    assert vsup(home, "rollout", "abort").returncode == 0
    until(lambda: rollout().get("state") == "rolled_back", 60, "the canary rolled back")
    until(lambda: all(i["state"] == "ready" for i in status(home)["instances"]), 60, "a, b ready")
    before = running(home)
    assert {n: say for n, (_, say) in before.items()} == {"a": "alpha", "b": "alpha"}
    doc = status(home)
    assert doc["supervisor"]["layout"] == "beta" and all(i["outdated"] for i in doc["instances"])

    # every instance already runs alpha's spec: nothing restarts, so no consent is needed
    back = vsup(home, "rollback", "--detach", "--wait", "--timeout", "60")
    assert back.returncode == 0, back.stdout + back.stderr
    assert "rolling back to layout alpha" in back.stdout and "unchanged: a, b" in back.stdout
    assert "restart" not in back.stdout, back.stdout
    assert running(home) == before
    doc = status(home)
    assert doc["supervisor"]["layout"] == "alpha"
    assert not any(i["outdated"] for i in doc["instances"]), doc["instances"]
