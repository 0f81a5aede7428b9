"""`vsup up` as operators run it: the plan is printed first, stopping or restarting serving
instances needs a terminal's yes or --yes (exit 3 and nothing changed otherwise), --dry-run
changes nothing, and --wait follows a rolling apply wave by wave. vLLM emulators stand in for
vLLM (tests/programs/vllm_emulator.py); router/test_router_vsup.py does the rollout with real vLLM."""

from __future__ import annotations

import json

import pytest

from tests.integration.control.test_cli import cli_home, vsup  # noqa: F401 (fixture)
from tests.unit.control.helpers import emulator_layout, free_port

pytestmark = pytest.mark.timeout(180)


def states(home) -> dict[str, tuple[str, int | None]]:
    doc = json.loads(vsup(home, "status", "--json").stdout)
    return {i["name"]: (i["state"], i["pid"]) for i in doc["instances"]}


def test_up_refuses_to_stop_or_restart_serving_instances_without_consent(cli_home, tmp_path):  # noqa: F811
    home = cli_home
    ports = {"a": free_port(), "b": free_port(), "c": free_port()}
    full = tmp_path / "full.toml"
    full.write_text(emulator_layout(ports))
    first = vsup(home, "up", str(full), "--detach", "--wait", "--timeout", "60")
    assert first.returncode == 0, first.stderr
    assert "start: a, b, c" in first.stdout
    before = states(home)
    assert {s for s, _ in before.values()} == {"ready"}

    # A half-written layout (the file cut after the first instance) would stop b and c.
    half = tmp_path / "half.toml"
    text = full.read_text()
    half.write_text(text[: text.index("[[instance]]", text.index("[[instance]]") + 1)])
    res = vsup(home, "up", str(half), "--detach")
    assert res.returncode == 3, (res.stdout, res.stderr)
    assert "stop (removed): b (serving), c (serving)" in res.stdout
    assert (
        "no terminal" in res.stderr
        and "--yes" in res.stderr
        and "nothing was changed" in res.stderr
    )
    assert states(home) == before

    # --dry-run prints the plan and changes nothing.
    changed = tmp_path / "changed.toml"
    # the emulator always reports requests running: each drain lasts drain_timeout_s
    changed.write_text(emulator_layout(ports, args='args = { say = "v2" }\ndrain_timeout_s = 1'))
    dry = vsup(home, "up", str(changed), "--detach", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "restart (changed, rolling): a, b, c" in dry.stdout
    assert states(home) == before
    dry_all = vsup(home, "up", str(changed), "--detach", "--dry-run", "--all-at-once")
    assert "restart (changed, at once): a (serving), b (serving), c (serving)" in dry_all.stdout

    # With --yes the change rolls: one instance at a time, followed by --wait.
    go = vsup(home, "up", str(changed), "--detach", "--yes", "--wait", "--timeout", "90")
    assert go.returncode == 0, go.stderr
    out = go.stdout
    assert "rolling restart of 3 serving instance(s) under way" in out
    # --wait prints what its status polls see: a poll on a loaded machine can miss a wave's
    # line, so the order of those it printed is checked, and the waves in the journal
    printed = [
        w for w in ("1/3: restarting a", "2/3: restarting b", "3/3: restarting c") if w in out
    ]
    assert printed and [out.index(w) for w in printed] == sorted(out.index(w) for w in printed)
    assert out.index(printed[-1]) < out.index("rollout done (3/3 restarted)")
    journal = [json.loads(line) for line in (home / "journal.jsonl").read_text().splitlines()]
    waves = [
        (e["wave"], e["current"])
        for e in journal
        if e["kind"] == "rollout" and e["state"] == "running" and e["current"]
    ]
    assert waves == [(1, ["a"]), (2, ["b"]), (3, ["c"])], waves
    after = states(home)
    assert all(s == "ready" and pid != before[n][1] for n, (s, pid) in after.items())
    doc = json.loads(vsup(home, "status", "--json").stdout)
    assert doc["schema"] == 1
    assert doc["rollout"]["state"] == "done" and doc["rollout"]["done"] == 3
    assert doc["rollout"]["total"] == 3 and doc["rollout"]["failure"] is None


def test_the_layouts_max_unavailable_is_validated(cli_home, tmp_path):  # noqa: F811
    layout = tmp_path / "bad.toml"
    header = "max_unavailable = 0\ndrain_timeout_s = -1"
    layout.write_text(emulator_layout({"a": free_port()}, extra_header=header))
    res = vsup(cli_home, "validate", str(layout))
    said = res.stdout + res.stderr
    assert res.returncode == 2
    assert "max_unavailable" in said and "must be 1 or more" in said
    assert "drain_timeout_s" in said and "greater than 0" in said
    good = tmp_path / "good.toml"
    good.write_text(
        emulator_layout({"a": free_port()}, extra_header="max_unavailable = 2\ndrain_timeout_s = 5")
    )
    assert vsup(cli_home, "validate", str(good)).returncode == 0
