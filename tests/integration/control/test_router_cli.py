"""The router on the command line as operators meet it (issue 25): real subprocesses, a real
detached daemon, vLLM emulators as instances and the real vllm-router in front of them.

A `[router]` change restarts the router, which takes its endpoint down: `vsup up` says what
that costs and needs a terminal's yes or --yes like a disruptive instance change. A router
whose command is not installed says so (and how to get it) in `vsup validate`, `vsup up` and
the live advice, instead of "bad_args recurs".
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.conftest import run_vsup as vsup
from tests.integration.control.test_operator_cli import home  # noqa: F401 (fixture)
from tests.unit.control.helpers import emulator_layout, free_port

pytestmark = pytest.mark.timeout(240)
ROUTER = Path(sys.executable).parent / "vllm-router"


def routed(path: Path, ports: dict[str, int], policy: str, command: str = str(ROUTER)) -> Path:
    router_port, metrics_port = ports["router"], ports["metrics"]
    text = emulator_layout({"a": ports["a"], "b": ports["b"]})
    text += (
        f'\n[router]\nport = {router_port}\nmetrics_port = {metrics_port}\nhost = "127.0.0.1"\n'
        f'policy = "{policy}"\ncommand = ["{command}"]\n'
    )
    path.write_text(text)
    return path


def status(where: Path) -> dict:
    res = vsup(where, "status", "--json")
    assert res.returncode in (0, 1), res.stderr
    return json.loads(res.stdout)


def new_ports() -> dict[str, int]:
    return {k: free_port() for k in ("a", "b", "router", "metrics")}


def test_a_router_change_needs_consent_and_the_plan_says_what_it_costs(home, tmp_path):  # noqa: F811
    ports = new_ports()
    first = routed(tmp_path / "rr.toml", ports, "round_robin")
    up = vsup(home, "up", str(first), "--detach", "--wait", "--timeout", "120")
    assert up.returncode == 0, up.stdout + up.stderr
    before = status(home)["router"]
    assert before["state"] == "ready" and before["policy"] == "round_robin"

    changed = routed(tmp_path / "random.toml", ports, "random")
    # the plan says what the restart costs, and --dry-run changes nothing
    dry = vsup(home, "up", str(changed), "--detach", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    line = next(ln for ln in dry.stdout.splitlines() if ln.startswith("router: restart"))
    assert "(serving)" in line and "endpoint is down until the new router serves" in line, line
    assert "finishes the requests it is running" in line, line
    assert "requests sent to it meanwhile fail" in line, line
    assert "unchanged: a, b" in dry.stdout

    # no terminal and no --yes: refused, nothing changed
    refused = vsup(home, "up", str(changed), "--detach")
    assert refused.returncode == 3, refused.stdout + refused.stderr
    assert "router: restart" in refused.stdout
    assert "@router (the router)" in refused.stderr and "--yes" in refused.stderr
    assert "nothing was changed" in refused.stderr
    after = status(home)["router"]
    assert (after["pid"], after["run"], after["policy"]) == (
        before["pid"],
        before["run"],
        "round_robin",
    )

    # with --yes it restarts with the new policy and serves both members again
    go = vsup(home, "up", str(changed), "--detach", "--yes", "--wait", "--timeout", "120")
    assert go.returncode == 0, go.stdout + go.stderr
    now = status(home)["router"]
    assert now["state"] == "ready" and now["policy"] == "random"
    assert now["pid"] != before["pid"] and now["run"] == before["run"] + 1
    assert all(w["in_router"] for w in now["workers"] if w["wanted"]), now["workers"]

    # a change of the members alone needs no consent: no restart
    only_a = tmp_path / "only-a.toml"
    text = changed.read_text()
    only_a.write_text(
        text.replace(f'[[instance]]\nname = "b"\ngpus = []\nport = {ports["b"]}\n', "")
    )
    assert 'name = "b"' not in only_a.read_text()
    dry = vsup(home, "up", str(only_a), "--detach", "--dry-run")
    assert "router: update" in dry.stdout and "router: restart" not in dry.stdout, dry.stdout


def test_a_router_whose_command_is_missing_says_so_everywhere(home, tmp_path):  # noqa: F811
    missing = "no-such-vllm-router"
    layout = routed(tmp_path / "missing.toml", new_ports(), "round_robin", command=missing)

    checked = vsup(home, "validate", str(layout))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    said = checked.stdout + checked.stderr
    assert "warning" in said and f"the router's command '{missing}' is not found" in said, said
    assert "pip install 'vsup[router]'" in said

    up = vsup(home, "up", str(layout), "--detach", "--wait", "--timeout", "60")
    assert up.returncode == 1, up.stdout + up.stderr
    told = up.stdout + up.stderr
    assert f"cannot run '{missing}' (No such file or directory)" in told, told
    assert "pip install 'vsup[router]'" in told and "recurs" not in told, told

    doc = status(home)
    router = doc["router"]
    assert router["state"] == "failed" and router["restarts"] == 0, router
    assert router["failed_why"].startswith(f"cannot run '{missing}'"), router
    advice = [a for a in doc["advice"] if a["kind"] == "router_failed"]
    assert len(advice) == 1 and advice[0]["severity"] == "critical", doc["advice"]
    assert f"cannot run '{missing}'" in advice[0]["message"]
    assert "vsup logs @router" in advice[0]["message"]
    # the instances behind it serve: only the router is the problem
    assert {i["state"] for i in doc["instances"]} == {"ready"}
