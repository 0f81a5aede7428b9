"""Faults of a server across nodes that the fleet sees (docs/fleet.md, "One server across
nodes"), over real OpenSSH servers on 127.0.0.1 (tests/integration/fleet/sshnodes.py) and the
vLLM emulator (no real vLLM: these are the fleet's and the daemons' decisions).

- Another vLLM on one node: `vsup fleet up` asks every member node which vLLM it runs and
  refuses before touching any (exit 2, naming the instance, the nodes and their versions). The
  other version is a `vllm` distribution's metadata on gpu02's Python path (a node where
  another vLLM is installed answers the same: `vsup paths --json` reads the installed
  distribution); gpu01 answers with this machine's own vLLM.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
from importlib import metadata

import pytest

from tests.conftest import until
from tests.integration.fleet.conftest import node_layout
from tests.integration.fleet.sshnodes import SshFleet, free_port

pytestmark = pytest.mark.timeout(600)
OTHER_VLLM = "0.0.1"


@pytest.fixture(scope="module")
def fleet():
    f = SshFleet(["gpu01", "gpu02"], fleet_name="spanfaults").start()
    try:
        yield f
    finally:
        f.close()


def span_layout(port: int, rpc_port: int) -> str:
    # a follower counts its silent head as gone after 3 s (unhealthy_grace_s; 30 by default)
    text = node_layout("unit", {"big": port}, args="unhealthy_grace_s = 3")
    return text + (
        f'span = {{ ranks = {{ gpu01 = 1, gpu02 = 1 }}, address = "127.0.0.1", '
        f"rpc_port = {rpc_port} }}\n"
    )


def other_vllm_on(f: SshFleet, node: str) -> None:
    """`node`'s vsup runs with another vLLM distribution installed first on its path."""
    site = f.root / f"{node}-site"
    dist = site / f"vllm-{OTHER_VLLM}.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {OTHER_VLLM}\n")
    text = f.fleet_file.read_text()
    plain = json.dumps([sys.executable, "-m", "vsup"])
    other = json.dumps(["env", f"PYTHONPATH={site}", sys.executable, "-m", "vsup"])
    head, sep, rest = text.partition(f'name = "{node}"')
    f.fleet_file.write_text(head + sep + rest.replace(f"vsup = {plain}", f"vsup = {other}", 1))


def test_a_node_with_another_vllm_keeps_the_unit_from_starting_and_nothing_is_touched(fleet):
    ours = metadata.version(metadata.packages_distributions()["vllm"][0])
    assert ours != OTHER_VLLM
    path = fleet.root / "unit.toml"
    path.write_text(span_layout(free_port(), free_port()))
    other_vllm_on(fleet, "gpu02")
    try:
        res = fleet.fleet("up", str(path), "--yes", "--timeout", "60", timeout=180)
    finally:
        fleet.write_client_files()  # every node as it was
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert (
        f"instance big: its nodes run different vLLM versions (gpu01 {ours}, gpu02 "
        f"{OTHER_VLLM})" in res.stderr
    ), res.stderr
    assert "nothing was changed" in res.stderr
    # refused before any node was asked for a plan: no daemon was started on either
    for node in fleet.nodes.values():
        assert not (node.home / "vsup.sock").exists(), node.name

    # the same vLLM on both: the check lets the unit through (a dry run: the plans)
    dry = fleet.fleet("up", str(path), "--dry-run", timeout=180)
    assert dry.returncode == 0, (dry.stdout, dry.stderr)
    assert "gpu01 (runs no layout): start: big" in dry.stdout, dry.stdout
    assert "gpu02 (runs no layout): start: big" in dry.stdout, dry.stdout


def test_fleet_validate_checks_the_vllm_of_every_span_node_when_asked_to(fleet):
    """`fleet validate LAYOUT` reads files only (no SSH: it says the versions were not
    checked); `--check-nodes` asks each node of the span as `fleet up` does."""
    ours = metadata.version(metadata.packages_distributions()["vllm"][0])
    path = fleet.root / "validate.toml"
    path.write_text(span_layout(free_port(), free_port()))
    files_only = fleet.fleet("validate", str(path))
    assert files_only.returncode == 0, (files_only.stdout, files_only.stderr)
    assert "vLLM versions not checked (validate reads files only)" in files_only.stdout
    same = fleet.fleet("validate", str(path), "--check-nodes")
    assert same.returncode == 0, (same.stdout, same.stderr)
    assert f"vLLM on the nodes of its servers across nodes: gpu01 {ours}, gpu02 {ours}" in (
        same.stdout
    ), same.stdout
    other_vllm_on(fleet, "gpu02")
    try:
        res = fleet.fleet("validate", str(path), "--check-nodes")
        doc = fleet.fleet("validate", str(path), "--check-nodes", "--json")
    finally:
        fleet.write_client_files()
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert (
        f"vsup fleet validate: instance big: its nodes run different vLLM versions (gpu01 "
        f"{ours}, gpu02 {OTHER_VLLM})" in res.stderr
    ), res.stderr
    assert doc.returncode == 2, (doc.stdout, doc.stderr)
    vllm = json.loads(doc.stdout)["layout"]["vllm"]
    assert vllm["versions"] == {"gpu01": ours, "gpu02": OTHER_VLLM}, vllm
    assert len(vllm["errors"]) == 1 and vllm["unreachable"] == [], vllm


def node_status(f: SshFleet, node: str) -> dict:
    res = f.nodes[node].vsup("status", "--json", timeout=60)
    assert res.returncode in (0, 1), res.stderr
    return json.loads(res.stdout)


def big_on(f: SshFleet, node: str) -> dict:
    return next(i for i in node_status(f, node)["instances"] if i["name"] == "big")


def unit_row(f: SshFleet) -> tuple[int, dict]:
    res = f.fleet("status", "--json")
    assert res.returncode in (0, 1), (res.stdout, res.stderr)
    (unit,) = json.loads(res.stdout)["units"]
    return res.returncode, unit


def test_the_unit_is_one_row_a_follower_waits_for_its_head_and_a_lost_node_is_down(fleet):
    """Emulators as the unit's members (the emulator's span mode: the head serves once its
    follower joined it on the DP RPC port, the follower serves nothing)."""
    port = free_port()
    path = fleet.root / "unit.toml"
    path.write_text(span_layout(port, free_port()))
    up = fleet.fleet("up", str(path), "--yes", "--timeout", "120", timeout=400)
    assert up.returncode == 0, (up.stdout, up.stderr)

    # one row for the unit, its members under it
    text = fleet.fleet("status")
    assert text.returncode == 0, (text.stdout, text.stderr)
    assert "servers across nodes:" in text.stdout, text.stdout
    assert re.search(
        r"^big +ready +gpu01 \(head, rank 0\) ready; gpu02 \(rank 1\) ready$",
        text.stdout,
        re.MULTILINE,
    ), text.stdout
    code, unit = unit_row(fleet)
    assert code == 0 and unit["state"] == "ready" and unit["detail"] is None, unit
    assert [(m["node"], m["head"], m["start_rank"], m["state"]) for m in unit["members"]] == [
        ("gpu01", True, 0, "ready"),
        ("gpu02", False, 1, "ready"),
    ]

    # the unit's figures at its head only: the follower's node shows its part and points there
    figures = ("kv_cache_usage", "requests_running", "requests_waiting")
    until(lambda: all(big_on(fleet, "gpu01")[k] is not None for k in figures), 60, "head's figures")
    follower = big_on(fleet, "gpu02")
    assert follower["state"] == "ready", follower
    assert all(follower[k] is None for k in figures), follower
    shown = fleet.nodes["gpu02"].vsup("status").stdout
    assert "the unit's figures (tokens/s, requests, KV cache) are its head's, on gpu01" in shown

    # the head stopped: the follower restarts and waits for it, saying so
    assert fleet.nodes["gpu01"].vsup("stop", "big").returncode == 0
    head = f"its head gpu01 at 127.0.0.1:{port}"

    def waiting() -> dict | None:
        inst = big_on(fleet, "gpu02")
        wait = inst.get("wait") or {}
        return inst if inst["state"] == "starting" and wait.get("kind") == "span_head" else None

    follower = until(waiting, 120, "the follower waiting for its head")
    assert follower["wait"]["message"].startswith(f"{head}: no answer on /health yet")
    advice = [a for a in node_status(fleet, "gpu02")["advice"] if a["kind"] == "span_head"]
    assert advice and f"waiting for {head}" in advice[0]["message"], advice
    shown = fleet.nodes["gpu02"].vsup("status").stdout
    assert f"big: waits for {head}" in shown, shown
    code, unit = unit_row(fleet)
    assert code == 1 and unit["state"] == "stopped", unit
    assert unit["detail"] == "gpu01 rank 0 stopped", unit
    assert unit["members"][1]["why"].startswith(f"waiting for {head}"), unit

    # the head back: the unit serves again, whole
    assert fleet.nodes["gpu01"].vsup("start", "big").returncode == 0
    until(lambda: unit_row(fleet)[1]["state"] == "ready", 120, "the unit ready again")
    assert big_on(fleet, "gpu02").get("wait") is None

    # the follower's node lost: the unit is down, naming it, with advice
    fleet.nodes["gpu02"].stop()
    res = fleet.fleet("status")
    assert res.returncode == 1, (res.stdout, res.stderr)
    assert re.search(
        r"^big +down: gpu02 unreachable +gpu01 \(head, rank 0\) ready; "
        r"gpu02 \(rank 1\) unreachable$",
        res.stdout,
        re.MULTILINE,
    ), res.stdout
    assert "big: gpu02 (a follower, rank 1) cannot be reached over SSH" in res.stdout
    code, unit = unit_row(fleet)
    assert code == 1 and (unit["state"], unit["detail"]) == ("down", "gpu02 unreachable")
    assert unit["members"][1]["state"] == "unreachable" and unit["members"][1]["why"]
    fleet.nodes["gpu02"].start()


def test_the_heads_port_taken_on_its_node_fails_the_unit_naming_the_node(fleet):
    """A process of the head's node holds the unit's port (the nodes share 127.0.0.1: any
    process here holds it on gpu01): the head's start fails fast (port_in_use), its
    follower waits for it, and both the unit's row and the head's advice say which node."""
    import socket

    port = free_port()
    path = fleet.root / "taken.toml"
    path.write_text(span_layout(port, free_port()))
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        res = fleet.fleet("up", str(path), "--yes", "--timeout", "20", timeout=300)
        assert res.returncode == 1, (res.stdout, res.stderr)
        # the unit of the test before runs: its change rolls (the dry run of a changed
        # span's spec is plain JSON: tests/unit/layout/test_span_changes.py)
        assert "a server across nodes starts on gpu01, gpu02 at once" in res.stdout
        assert re.search(r"^gpu01: FAILED: .*port_in_use", res.stdout, re.MULTILINE), res.stdout
        # its follower, not ready at the deadline, says what it waits for
        assert (
            f"gpu02: FAILED: not ready within 20 s: big starting (waits for its head gpu01 "
            f"at 127.0.0.1:{port}: no answer on /health yet" in res.stdout
        ), res.stdout
        code, unit = unit_row(fleet)
        assert code == 1 and (unit["state"], unit["detail"]) == ("failed", "gpu01 rank 0 failed")
        assert "its head on gpu01 failed" in unit["advice"], unit
        head = big_on(fleet, "gpu01")
        assert head["last_exit"]["reason"] == "port_in_use", head
        advice = [a["message"] for a in node_status(fleet, "gpu01")["advice"]]
        assert any(
            f"port {port} on gpu01 is taken by another process (gpu01 runs the head of a "
            "server across nodes; its followers on gpu02 wait for it)" in m
            for m in advice
        ), advice


def test_a_follower_whose_head_was_replaced_during_its_start_restarts_at_once(fleet):
    """vLLM's follower says HELLO to its head once; a head that dies before the follower's
    READY leaves it bound to nothing (its socket reconnects to the next head, which never got
    its HELLO): vLLM's follower would wait 5 minutes, and a READY it sends after its load kills
    the new head. The follower's daemon sees its connection to the head's RPC port made again
    and restarts it at once, saying which head (engine/spanwatch.py). The emulator does the
    handshake as vLLM does; its 5 minutes are left as they are, so only the fix serves here."""
    port, rpc_port = free_port(), free_port()
    load = fleet.root / "load_s"
    load.write_text("30")  # both members' start: long enough to replace the head meanwhile
    path = fleet.root / "replaced.toml"
    path.write_text(span_layout(port, rpc_port) + f'args = {{ startup-s-file = "{load}" }}\n')
    up = fleet.fleet("up", str(path), "--yes", "--timeout", "2", timeout=300)
    assert up.returncode in (0, 1), (up.stdout, up.stderr)  # not ready within 2 s: it starts

    def hello_said() -> bool:
        logs = fleet.nodes["gpu02"].vsup("logs", "big", timeout=60).stdout
        return "emulator: headless ranks 1..1 got INIT from" in logs

    until(hello_said, 120, "the follower's HELLO answered by its head")
    follower = big_on(fleet, "gpu02")
    assert follower["state"] == "starting", follower
    head = big_on(fleet, "gpu01")
    load.write_text("1")  # the starts from here on are quick
    os.kill(head["pid"], signal.SIGKILL)  # the head dies while the follower loads

    # the head's daemon starts a new head; the follower's sees it replaced and restarts
    until(lambda: unit_row(fleet)[1]["state"] == "ready", 120, "the unit ready again")
    now = big_on(fleet, "gpu02")
    assert now["run"] > follower["run"], (follower, now)
    where = f"its head gpu01 at 127.0.0.1:{port} was replaced during this follower's start"
    last = now["last_exit"]
    assert last["reason"] == "engine_dead" and last["log_excerpt"].startswith(where), last
    events = fleet.nodes["gpu02"].vsup("events", "--instance", "big", timeout=60).stdout
    assert "exited: engine_dead" in events and where in events, events
