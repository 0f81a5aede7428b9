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
import sys
from importlib import metadata

import pytest

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
    text = node_layout("unit", {"big": port})
    return text + (
        f'span = {{ ranks = {{ gpu01 = 1, gpu02 = 1 }}, address = "127.0.0.1", '
        f"rpc_port = {rpc_port} }}\n"
    )


def other_vllm_on(f: SshFleet, node: str) -> None:
    """`node`'s vsup runs with another vLLM distribution installed first on its path."""
    site = f.root / f"{node}-site"
    dist = site / f"vllm-{OTHER_VLLM}.dist-info"
    dist.mkdir(parents=True)
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
