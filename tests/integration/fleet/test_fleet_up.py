"""`vsup fleet up` over real SSH, node by node, stopping at the first node that fails.

Three nodes (own sshd, own VSUP_HOME, vLLM emulators). n1 has no daemon yet: the rollout
starts one through the node's own `vsup daemon --detach`. n2 and n3 serve layouts of their
own. The new layout has one instance `x` on port P; the test nodes share 127.0.0.1, so once n1
serves x, P is taken on n2 as it would be by any other process there: n2's x fails
(`port_in_use`), the rollout stops, and n3 is not touched. Consent works as for `vsup up`:
without a terminal or --yes, exit 3 and nothing changes. Then the nodes' journals merged
(`vsup fleet events`) and the Prometheus targets of the nodes' exporters.
"""

from __future__ import annotations

import json
import re

import pytest

from tests.integration.fleet.conftest import node_layout
from tests.integration.fleet.sshnodes import SshFleet, free_port

pytestmark = pytest.mark.timeout(600)
# `vsup fleet events` in words: local time, node, whose, what
LOCAL_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d  n\d  \S+ +\S")


@pytest.fixture(scope="module")
def fleet():
    f = SshFleet(["n1", "n2", "n3"], fleet_name="roll").start()
    try:
        yield f
    finally:
        f.close()


def node_doc(fleet, name: str) -> dict:
    res = fleet.nodes[name].vsup("status", "--json", timeout=60)
    assert res.returncode in (0, 1), res.stderr
    return json.loads(res.stdout)


def test_a_fleet_rollout_stops_at_the_first_failing_node_and_leaves_the_rest(fleet):
    metrics_port = free_port()
    for name in ("n2", "n3"):
        extra = f'metrics_listen = "127.0.0.1:{metrics_port}"' if name == "n3" else ""
        path = fleet.root / f"{name}.toml"
        path.write_text(node_layout(f"base-{name}", {f"{name}a": free_port()}, extra))
        res = fleet.nodes[name].vsup("up", str(path), "--detach", "--wait", "--timeout", "90")
        assert res.returncode == 0, res.stderr
    before_n3 = node_doc(fleet, "n3")
    pid_n3 = before_n3["instances"][0]["pid"]
    assert not (fleet.nodes["n1"].home / "vsup.sock").exists()

    new = fleet.root / "new.toml"
    new.write_text(node_layout("new", {"x": free_port()}))

    # no terminal, no --yes: the plan would stop n2's and n3's serving instances -> exit 3
    refused = fleet.fleet("up", str(new), "--nodes", "n1,n2,n3")
    assert refused.returncode == 3, (refused.stdout, refused.stderr)
    assert "n2 (runs base-n2): start: x; stop: n2a (serving)" in refused.stdout, refused.stdout
    assert "no terminal" in refused.stderr and "nothing was changed" in refused.stderr
    assert node_doc(fleet, "n2")["supervisor"]["layout"] == "base-n2"
    # n1's daemon was started for its dry run (by its own vsup) and runs nothing
    assert node_doc(fleet, "n1")["instances"] == []

    # --timeout is each node's; two nodes are applied: the command's own limit is well past
    # both (an apply call may take 120 s more each), so a slow node shows as vsup's failure
    res = fleet.fleet(
        "up", str(new), "--nodes", "n1,n2,n3", "--yes", "--timeout", "60", timeout=420
    )
    out = res.stdout
    assert res.returncode == 1, (out, res.stderr)
    assert "rolling new over n1 -> n2 -> n3, one node at a time" in out
    assert "n1: serves new" in out
    assert "n2: FAILED: instance x failed" in out and "port" in out, out
    assert "n3: applying" not in out
    summary = out[out.index("which node runs which layout:") :]
    assert "n1: new - serves it" in summary
    assert "n2: new - FAILED" in summary
    assert "n3: base-n3 - not changed" in summary

    n1, n2, n3 = (node_doc(fleet, n) for n in ("n1", "n2", "n3"))
    assert n1["supervisor"]["layout"] == "new"
    assert [(i["name"], i["state"]) for i in n1["instances"]] == [("x", "ready")]
    assert n2["supervisor"]["layout"] == "new"
    x2 = next(i for i in n2["instances"] if i["name"] == "x")
    assert x2["state"] == "failed" and x2["last_exit"]["reason"] == "port_in_use", x2
    assert n3["supervisor"]["layout"] == "base-n3"
    assert [(i["name"], i["state"], i["pid"]) for i in n3["instances"]] == [
        ("n3a", "ready", pid_n3)
    ]

    # the nodes' journals, merged by time: both nodes' apply actions are there
    ev = fleet.fleet("events", "--nodes", "n1,n2", "-n", "200", "--json")
    assert ev.returncode == 0, ev.stderr
    events = [json.loads(line) for line in ev.stdout.splitlines()]
    applies = [(e["node"], e.get("layout")) for e in events if e.get("action") == "apply"]
    assert ("n1", "new") in applies and ("n2", "new") in applies, applies
    stamps = [e["t"] for e in events]
    assert stamps == sorted(stamps)
    # in words, as `vsup events` says them, in local time: the last 5 lines of n2, x's start
    # refused (no process, so no run: never "run None")
    text = fleet.fleet("events", "--nodes", "n2", "-n", "5")
    lines = text.stdout.splitlines()
    assert text.returncode == 0 and len(lines) == 5, text.stdout
    assert all(LOCAL_LINE.match(line) for line in lines), text.stdout
    assert "exited: port_in_use (no process was started)" in text.stdout, text.stdout
    assert "None" not in text.stdout and "kind=" not in text.stdout, text.stdout

    # -f follows: an event journalled on n1 after the command started comes through
    follow_events(fleet)

    # Prometheus service discovery: n3's exporter, with the node's labels
    t = fleet.fleet("prometheus-targets")
    assert t.returncode == 0, t.stderr
    groups = json.loads(t.stdout)
    assert groups == [
        {
            "targets": [f"127.0.0.1:{metrics_port}"],
            "labels": {
                "node": "n3",
                "layout": "base-n3",
                "gpu_model": "",
                "gpu_count": "0",
                "gpu_vendor": "none",
                "fleet": "roll",
            },
        }
    ]
    assert "n1: left out, its layout has no [layout] metrics_listen" in t.stderr
    assert "only reachable on the node" in t.stderr


def follow_events(fleet) -> None:
    import os
    import subprocess
    import sys
    import threading

    from tests.conftest import outside_cwd

    argv = [sys.executable, "-m", "vsup", "fleet", "events", "--fleet", str(fleet.fleet_file)]
    proc = subprocess.Popen(
        [*argv, "-f", "-n", "0", "--nodes", "n1,n3"],
        env=dict(os.environ, VSUP_HOME=str(fleet.operator_home)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=outside_cwd(),
    )
    lines: list[str] = []
    seen = threading.Event()

    def read() -> None:
        for line in proc.stdout:
            lines.append(line)
            if " n1 " in line and "operator: restart x" in line:
                seen.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        # the restart is asked for until the follower has caught it (it may still be connecting)
        for _ in range(30):
            res = fleet.nodes["n1"].vsup("restart", "x", timeout=60)
            assert res.returncode == 0, res.stderr
            if seen.wait(4):
                break
        assert seen.is_set(), lines
    finally:
        proc.terminate()
        proc.wait(20)


def test_unknown_nodes_and_groups_are_refused_naming_the_fleet_file(fleet):
    res = fleet.fleet("status", "--nodes", "n1,n9")
    assert res.returncode == 2
    assert "no node n9 in" in res.stderr and str(fleet.fleet_file) in res.stderr
    assert "nodes: n1, n2, n3" in res.stderr
    res = fleet.fleet("up", str(fleet.root / "missing.toml"), "--group", "rack9")
    assert res.returncode == 2 and "no group 'rack9'" in res.stderr
