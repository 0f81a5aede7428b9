"""`vsup fleet status` over real SSH: three nodes, each its own sshd on 127.0.0.1 with its own
host key and VSUP_HOME, and a real vsup daemon running vLLM emulators
(tests/programs/vllm_emulator.py). The operator side is a key, a known_hosts holding the
nodes' keys, an ssh_config of Host aliases and a fleet file - nothing else.

Covers: every node's status (text and JSON: reachable, ready/total, the worst alert, the
versions, warm after the first call); a node whose sshd stops mid-session (down with SSH's
reason, the others unaffected, back once it returns); a hanging node (reported when its
deadline passes, the others answer); a changed host key (refused in SSH's own words, the
known_hosts untouched); the fleet dashboard's drill-down into a node over the tunnel (it rides
out the node's sshd stopping and coming back) and back to the fleet.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat

import pytest

from tests.integration.fleet.conftest import node_layout
from tests.integration.fleet.sshnodes import SshFleet, free_port, keygen

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def fleet():
    f = SshFleet(["a", "b", "c"]).start()
    try:
        layouts = {
            "a": node_layout("alpha", {"a1": free_port()}),
            "b": node_layout("beta", {"b1": free_port(), "b2": free_port()}),
            "c": node_layout("gamma", {"c1": free_port()}),
        }
        for name, text in layouts.items():
            path = f.root / f"{name}.toml"
            path.write_text(text)
            res = f.nodes[name].vsup("up", str(path), "--detach", "--wait", "--timeout", "90")
            assert res.returncode == 0, res.stderr
        # b2 crashes at once, every time: its restart policy gives up, an alert on node b
        crashing = layouts["b"].replace(
            'name = "b2"', 'name = "b2"\nargs = { exit-after = 0.2, exit-code = 3 }'
        )
        (f.root / "b.toml").write_text(crashing)
        res = f.nodes["b"].vsup("up", str(f.root / "b.toml"), "--detach", "--yes")
        assert res.returncode == 0, res.stderr
        yield f
    finally:
        f.close()


def wait_for(fn, timeout: float = 60, interval: float = 0.5):
    import time

    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)


def test_status_of_every_node_over_ssh(fleet):
    def b_alerted():
        # b2's error, not any alert: the emulators' preemption counters rise, so b1's
        # kv_exhausted warning can come first; the error outranks it once it exists
        doc = fleet.status()
        worst = doc["b"]["worst"]
        failed = worst is not None and worst["severity"] in ("critical", "error")
        return doc if failed and doc["b"]["ready"] == 1 else None

    nodes = wait_for(b_alerted, timeout=120)
    assert nodes, "node b's crashing instance never became an alert"
    assert list(nodes) == ["a", "b", "c"]
    for name, layout, total in (("a", "alpha", 1), ("b", "beta", 2), ("c", "gamma", 1)):
        n = nodes[name]
        assert n["reachable"] and n["daemon"], n
        assert n["layout"] == layout and n["total"] == total
        assert n["gpus"] == 0 and n["vsup_version"] and n["vllm_version"]
        assert n["error"] is None and n["since"] and n["last_seen"]
    assert nodes["a"]["ready"] == 1 and nodes["c"]["ready"] == 1
    worst = nodes["b"]["worst"]
    assert worst["severity"] in ("critical", "error") and worst["instance"] == "b2", worst
    assert nodes["a"]["groups"] == ["rack1"] and nodes["c"]["groups"] == ["rack2"]
    # the second call finds the tunnels made by the first: no SSH handshake
    again = fleet.status()
    assert all(n["warm"] for n in again.values()), again

    text = fleet.fleet("status")
    assert text.returncode == 1  # b2 is not ready
    lines = text.stdout.splitlines()
    assert lines[0].startswith("fleet test: 3/3 nodes answer, 3/4 instances ready"), text.stdout
    row_b = next(ln for ln in lines if ln.startswith("b "))
    assert "DEGRADED" in row_b and "1/2" in row_b and "beta" in row_b

    # only the group's nodes; the private run directory holds the sockets
    assert list(fleet.status("--group", "rack2")) == ["c"]
    run = fleet.operator_home / "fleet"
    assert stat.S_IMODE(os.stat(run).st_mode) == 0o700
    socks = [p for p in run.iterdir() if stat.S_ISSOCK(os.lstat(p).st_mode)]
    assert len([p for p in socks if p.name.startswith("cm-")]) == 3 and len(socks) == 6


def test_a_node_whose_sshd_stops_is_down_and_the_others_answer_until_it_returns(fleet):
    assert all(n["reachable"] for n in fleet.status().values())
    b = fleet.nodes["b"]
    b.stop()
    nodes = fleet.status()
    assert not nodes["b"]["reachable"] and not nodes["b"]["daemon"]
    assert "Connection refused" in nodes["b"]["error"], nodes["b"]
    assert nodes["b"]["since"] and nodes["b"]["last_seen"]
    assert nodes["a"]["reachable"] and nodes["c"]["reachable"]
    text = fleet.fleet("status")
    assert text.returncode == 1
    assert "b: unreachable since" in text.stdout and "Connection refused" in text.stdout

    # a node that hangs instead (every sshd process stopped): its deadline passes, the rest
    # answer in the same call
    c = fleet.nodes["c"]
    c.pause()
    try:
        nodes = fleet.status()
        assert not nodes["c"]["reachable"] and "no answer within" in nodes["c"]["error"], nodes
        assert nodes["a"]["reachable"] and nodes["a"]["ready"] == 1
    finally:
        c.resume()

    b.start()

    def all_back():
        doc = fleet.status()
        return doc if all(n["reachable"] for n in doc.values()) else None

    back = wait_for(all_back)
    assert back, "the nodes did not come back"
    assert back["b"]["ready"] == 1 and back["c"]["ready"] == 1 and back["b"]["error"] is None


def test_a_changed_host_key_is_refused_with_sshs_own_message(fleet):
    a = fleet.nodes["a"]
    known = fleet.known_hosts.read_text()
    old_key = a.host_key.read_bytes()
    old_pub = a.host_pub
    a.stop()  # ends the master's connection too: the next one meets the new key
    a.host_pub = keygen(a.host_key)
    a.start()
    try:
        nodes = fleet.status()
        err = nodes["a"]["error"]
        assert not nodes["a"]["reachable"]
        assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in err, err
        assert "Host key verification failed" in err, err
        assert nodes["c"]["reachable"]
        assert fleet.known_hosts.read_text() == known  # nothing learnt, nothing accepted
    finally:
        a.stop()
        a.host_key.write_bytes(old_key)
        a.host_key.with_suffix(".pub").write_text(old_pub + "\n")
        a.host_pub = old_pub
        a.start()
    assert wait_for(lambda: fleet.status()["a"]["reachable"])


def test_the_dashboard_opens_a_nodes_own_dashboard_over_the_tunnel_and_comes_back(
    fleet, monkeypatch
):
    from vsup.fleet.model import load_fleet
    from vsup.tui.fleet_app import FleetApp
    from vsup.tui.screens.dashboard import Dashboard
    from vsup.tui.screens.fleet import FleetScreen

    monkeypatch.setenv("VSUP_HOME", str(fleet.operator_home))

    async def scenario() -> None:
        app = FleetApp(load_fleet(fleet.fleet_file), refresh_s=0.5, node_refresh_s=0.5)
        async with app.run_test(size=(160, 45)) as pilot:

            async def until(cond, what: str, timeout: float = 60) -> None:
                for _ in range(int(timeout / 0.1)):
                    if cond():
                        return
                    await pilot.pause(0.1)
                raise AssertionError(f"timed out waiting for {what}")

            await until(lambda: len(app.views) == 3, "the fleet's first poll")
            assert isinstance(app.screen, FleetScreen)
            assert [v.name for v in app.views] == ["a", "b", "c"]
            await pilot.press("down")  # the cursor on node b
            await pilot.press("enter")
            await until(lambda: app.open_node == "b", "node b to open")
            await until(lambda: app.snapshot is not None, "node b's own snapshot")
            assert isinstance(app.screen, Dashboard)
            assert {i.name for i in app.snapshot.instances} == {"b1", "b2"}
            assert app.snapshot.supervisor.layout == "beta"
            await until(lambda: app.renders >= 1, "node b's dashboard to render")
            # b's sshd stops while its dashboard is open: the banner says so; once sshd is
            # back the tunnel is made again (same local socket) and the dashboard carries on
            fleet.nodes["b"].stop()
            await until(lambda: app.daemon_error is not None, "the daemon banner")
            fleet.nodes["b"].start()
            await until(lambda: app.daemon_error is None, "node b to answer again", 90)
            assert app.open_node == "b" and isinstance(app.screen, Dashboard)
            polls = app.fleet_polls
            await pilot.press("q")  # back to the fleet, not out of the app
            await until(lambda: isinstance(app.screen, FleetScreen), "the fleet screen")
            assert app.open_node is None and app.is_running
            await until(lambda: app.fleet_polls > polls, "the fleet to poll again")
            # and another node opens the same way
            await pilot.press("up", "enter")
            await until(
                lambda: app.snapshot is not None and app.snapshot.supervisor.layout == "alpha",
                "node a's dashboard",
            )
            await pilot.press("q")
            await until(lambda: isinstance(app.screen, FleetScreen), "the fleet screen again")
            await pilot.press("q")

    asyncio.run(scenario())
    # the tunnel the dashboard used is the same one the CLI finds warm
    assert fleet.status()["b"]["warm"]
    assert json.loads(fleet.fleet("validate", "--json").stdout)["nodes"][1]["name"] == "b"
