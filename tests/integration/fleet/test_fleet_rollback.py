"""`vsup fleet rollback` over real SSH (docs/fleet.md): each node goes back to its own previous
layout (what `vsup rollback` there would apply), planned on every node first, consent as for
`vsup fleet up`, then node by node; each node's journal says it was a rollback.

Three nodes (own sshd, own VSUP_HOME, vLLM emulators): n1 and n2 each ran a layout of their own
("old-nX") and then another ("new-nX"); n3 ran one layout only, so it has nothing to go back to.
"""

from __future__ import annotations

import json

import psutil
import pytest

from tests.integration.fleet.conftest import node_layout
from tests.integration.fleet.sshnodes import SshFleet, free_port

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def fleet():
    f = SshFleet(["n1", "n2", "n3"], fleet_name="back").start()
    try:
        yield f
    finally:
        f.close()


def node_doc(fleet, name: str) -> dict:
    res = fleet.nodes[name].vsup("status", "--json", timeout=60)
    assert res.returncode in (0, 1), res.stderr
    return json.loads(res.stdout)


def says(fleet, name: str) -> dict[str, tuple[int, str]]:
    """Each instance's pid and what its process was started with (`--say X`)."""
    out = {}
    for i in node_doc(fleet, name)["instances"]:
        argv = psutil.Process(i["pid"]).cmdline()
        out[i["name"]] = (i["pid"], argv[argv.index("--say") + 1])
    return out


def up(fleet, name: str, layout: str, port: int) -> None:
    path = fleet.root / f"{layout}.toml"
    path.write_text(node_layout(layout, {f"{name}a": port}, args=f'args = {{ say = "{layout}" }}'))
    res = fleet.nodes[name].vsup(
        "up", str(path), "--detach", "--wait", "--yes", "--timeout", "90", timeout=150
    )
    assert res.returncode == 0, res.stdout + res.stderr


def test_each_node_goes_back_to_its_own_previous_layout_one_at_a_time(fleet):
    for name in ("n1", "n2", "n3"):
        port = free_port()
        up(fleet, name, f"old-{name}", port)
        if name != "n3":
            up(fleet, name, f"new-{name}", port)
    before = {n: says(fleet, n) for n in ("n1", "n2", "n3")}
    assert before["n1"]["n1a"][1] == "new-n1" and before["n2"]["n2a"][1] == "new-n2"

    # n3 has nothing to go back to: nothing changes anywhere
    res = fleet.fleet("rollback", "--nodes", "n1,n2,n3", "--yes")
    assert res.returncode == 1, (res.stdout, res.stderr)
    assert "n3: cannot go back: no previous layout: every kept layout is the running one" in (
        res.stderr
    )
    assert "vsup fleet rollback: not every node can go back; nothing was changed" in res.stderr
    assert {n: says(fleet, n) for n in ("n1", "n2", "n3")} == before

    # --dry-run: the plans, nothing changed
    dry = fleet.fleet("rollback", "--nodes", "n1,n2", "--dry-run")
    assert dry.returncode == 0, (dry.stdout, dry.stderr)
    assert "n1 (runs new-n1): back to layout old-n1 (seq " in dry.stdout, dry.stdout
    assert "rolling back" not in dry.stdout

    # no terminal, no --yes: each node's plan, then refused
    refused = fleet.fleet("rollback", "--nodes", "n1,n2")
    assert refused.returncode == 3, (refused.stdout, refused.stderr)
    for name in ("n1", "n2"):
        line = next(ln for ln in refused.stdout.splitlines() if ln.startswith(f"{name} "))
        assert line.startswith(f"{name} (runs new-{name}): back to layout old-{name} (seq "), line
        assert f"from {fleet.root / f'old-{name}.toml'})" in line, line
        assert f"restart (rolling): {name}a (serving)" in line, line
    assert "vsup fleet rollback: this stops or restarts serving instances" in refused.stderr
    assert {n: says(fleet, n) for n in ("n1", "n2")} == {n: before[n] for n in ("n1", "n2")}

    res = fleet.fleet("rollback", "--nodes", "n1,n2", "--yes", "--timeout", "60", timeout=420)
    out = res.stdout
    assert res.returncode == 0, (out, res.stderr)
    assert "rolling back n1 -> n2, one node at a time" in out
    assert out.index("n1: serves old-n1") < out.index("n2: applying"), out
    summary = out[out.index("which node runs which layout:") :]
    assert "n1: old-n1 - serves it" in summary and "n2: old-n2 - serves it" in summary
    for name in ("n1", "n2"):
        now = says(fleet, name)[f"{name}a"]
        assert now[1] == f"old-{name}" and now[0] != before[name][f"{name}a"][0]
        assert node_doc(fleet, name)["supervisor"]["layout"] == f"old-{name}"
    assert says(fleet, "n3") == before["n3"]

    # each node's journal says it was a rollback, and to which of its kept layouts
    ev = fleet.fleet("events", "--nodes", "n1,n2", "-n", "200", "--json")
    assert ev.returncode == 0, ev.stderr
    applies = [
        e
        for e in map(json.loads, ev.stdout.splitlines())
        if e.get("kind") == "action" and e.get("action") == "apply" and "instance" not in e
    ]
    for name in ("n1", "n2"):
        mine = [e for e in applies if e["node"] == name]
        assert [e["layout"] for e in mine] == [f"old-{name}", f"new-{name}", f"old-{name}"]
        assert mine[-1]["rollback_of"] == mine[0]["seq"], mine
    words = fleet.fleet("events", "--nodes", "n2", "-n", "200")
    assert f"operator: rollback to layout #{mine[0]['seq']} (applied " in words.stdout
