"""A node's own part of one server across nodes (docs/fleet.md, "One server across nodes"):
the layout applied on a node that knows its name (`[layout] node`, which `vsup fleet up` sets)
runs that node's member; how each member is watched (the head probes every rank and restarts
on a stall, a follower follows its head); the member's status; the stall's words."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

from vsup import snapshot
from vsup.commands.fleet import with_node
from vsup.control.stalls import span_stall_why
from vsup.control.state import spec_from_dict, spec_to_dict
from vsup.engine.instance import span_status
from vsup.engine.spawn import _port_busy
from vsup.layout.compiled import compile_document, span_units
from vsup.layout.model import load_layout, loads_layout
from vsup.layout.span import SPAN_CANARY_INTERVAL_S
from vsup.snapshot import InstanceStatus, StallStatus
from vsup.states import ExitReason

CPU = [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
SPAN = '{ ranks = { n1 = 1, n2 = 2 }, address = "10.0.0.1", rpc_port = 13345 }'


def layout_text(node: str | None, span: str = SPAN, extra: str = "") -> str:
    header = f'[layout]\nname = "spanned"\n{f"node = {node!r}" if node else ""}\n\n'
    return (
        f'{header}[[instance]]\nname = "big"\nmodel = "acme/tiny-model"\n'
        f"command = {CPU!r}\ngpus = []\nport = 8000\n{extra}span = {span}\n"
    ).replace("'", '"')


def compiled_on(tmp_path: Path, node: str | None, **kw: str):
    path = tmp_path / "spanned.toml"
    path.write_text(layout_text(node, **kw))
    return compile_document(load_layout(path))


def test_the_head_runs_its_member_and_probes_every_rank(tmp_path: Path):
    compiled, diagnostics = compiled_on(tmp_path, "n1")
    assert compiled is not None, [d.format() for d in diagnostics]
    (spec,) = compiled.specs
    (unit,) = span_units(load_layout(tmp_path / "spanned.toml"))[0]
    # what `vsup fleet validate LAYOUT` prints for n1 is what n1's daemon runs
    assert spec.argv() == unit.member("n1").argv()
    assert spec.argv()[:5] == [sys.executable, "-m", "vsup.vllmserve", "serve", "acme/tiny-model"]
    assert "--headless" not in spec.argv()
    assert spec.argv()[spec.argv().index("--data-parallel-size") + 1] == "3"
    role = spec.span
    assert role is not None and role.head and role.node == "n1"
    assert (role.start_rank, role.ranks, role.size) == (0, 1, 3)
    assert [role.node_of(r) for r in range(4)] == ["n1", "n2", "n2", None]
    # the head's daemon probes each rank through vLLM, and a stall restarts the unit's head
    assert spec.canary_interval_s == SPAN_CANARY_INTERVAL_S
    assert spec.restart.on_stall and spec.stall_after_s > 0
    assert spec.health_url == "http://127.0.0.1:8000/health"
    assert not spec.follower


def test_a_follower_runs_headless_and_follows_its_head(tmp_path: Path):
    compiled, _ = compiled_on(tmp_path, "n2", extra="stall_after_s = 15\n")
    assert compiled is not None
    (spec,) = compiled.specs
    argv = spec.argv()
    assert argv[-3:] == ["--headless", "--data-parallel-start-rank", "1"]
    assert argv[argv.index("--data-parallel-size-local") + 1] == "2"
    assert (
        spec.follower
        and spec.span is not None
        and spec.span.describe() == ("ranks 1-2 of 3, head n1 at 10.0.0.1:8000")
    )
    # no API server of its own: its health is its head's; the head's daemon judges the ranks
    assert spec.health_url == "http://10.0.0.1:8000/health"
    assert spec.base_url == "http://10.0.0.1:8000"
    assert (spec.canary_interval_s, spec.stall_after_s) == (0.0, 0.0)


def test_a_span_head_keeps_a_shorter_probe_and_its_own_deadline(tmp_path: Path):
    compiled, _ = compiled_on(tmp_path, "n1", extra="canary_interval_s = 4\nstall_after_s = 15\n")
    assert compiled is not None
    (spec,) = compiled.specs
    assert (spec.canary_interval_s, spec.stall_after_s) == (4.0, 15.0)


def test_a_node_outside_the_span_runs_nothing_of_it(tmp_path: Path):
    compiled, _ = compiled_on(tmp_path, "n3")
    assert compiled is not None and compiled.specs == ()


def test_a_node_name_that_is_no_name_is_refused(tmp_path: Path):
    compiled, diagnostics = compiled_on(tmp_path, "n 1")
    assert compiled is None
    (d,) = [d for d in diagnostics if d.is_error]
    assert (d.table, d.key) == ("[layout]", "node") or d.key == "node"
    assert "not a node name" in d.message


def test_fleet_up_tells_each_node_its_name():
    text = layout_text(None)
    for node in ("n1", "n2"):
        mine = with_node(text, node)
        assert loads_layout(mine, None).header["node"] == node
        assert mine.startswith('[layout]\nname = "spanned"\n')  # the rest kept as written
    bare = text.replace('[layout]\nname = "spanned"\n', "")
    assert loads_layout(with_node(bare, "n2"), None).header["node"] == "n2"


def test_the_member_survives_the_state_file(tmp_path: Path):
    compiled, _ = compiled_on(tmp_path, "n2")
    assert compiled is not None
    (spec,) = compiled.specs
    assert spec_from_dict(spec_to_dict(spec)) == spec


def test_the_members_status_says_its_part_and_where_the_rest_lives(tmp_path: Path):
    compiled, _ = compiled_on(tmp_path, "n2")
    assert compiled is not None
    (spec,) = compiled.specs
    assert spec.span is not None
    inst = InstanceStatus.from_wire("big", span=span_status(spec.span))
    back = snapshot._decoder(InstanceStatus)(json.loads(json.dumps(inst.to_json())))
    span = back.span
    assert span is not None and not span.head and span.node == "n2"
    assert (span.start_rank, span.ranks, span.size) == (1, 2, 3)
    assert [(n.node, n.start_rank, n.ranks) for n in span.nodes] == [("n1", 0, 1), ("n2", 1, 2)]
    assert (span.address, span.port) == ("10.0.0.1", 8000)


def test_a_rank_that_does_not_answer_is_named_with_its_node(tmp_path: Path):
    compiled, _ = compiled_on(tmp_path, "n1")
    assert compiled is not None
    role = compiled.specs[0].span
    assert role is not None
    probe = StallStatus(stalled=True, for_s=15.2, evidence="canary", ranks=(2,))
    assert span_stall_why(role, probe, 15.0) == (
        "rank 2 on n2 did not answer in 15 s (the unit restarts as one)"
    )
    work = StallStatus(stalled=True, for_s=61, evidence="engine", ranks=(0, 1))
    why = span_stall_why(role, work, 60.0)
    assert why is not None and why.startswith("rank 0 on n1, rank 1 on n2: work and no token")
    assert span_stall_why(role, StallStatus(stalled=True, evidence="server"), 60.0) is None


def test_a_follower_binds_no_port_of_its_own(tmp_path: Path):
    """Its `port` is the head's: on a node that also runs the head (two "nodes" on one
    machine) the port is taken, and the follower starts all the same."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        compiled, _ = compiled_on(tmp_path, "n2")
        head, _ = compiled_on(tmp_path, "n1")
        assert compiled is not None and head is not None
        from dataclasses import replace

        follower = replace(compiled.specs[0], host="127.0.0.1", port=port)
        assert _port_busy(follower) is None
        refused = _port_busy(replace(head.specs[0], host="127.0.0.1", port=port))
        assert refused is not None and refused.reason == ExitReason.PORT_IN_USE


def test_vsup_status_says_the_members_part(tmp_path: Path):
    from vsup.commands.status import render
    from vsup.snapshot import NodeInfo, StatusSnapshot, SupervisorInfo

    compiled, _ = compiled_on(tmp_path, "n2")
    assert compiled is not None and compiled.specs[0].span is not None
    inst = InstanceStatus.from_wire("big", state="ready", span=span_status(compiled.specs[0].span))
    snap = StatusSnapshot(
        supervisor=SupervisorInfo(pid=1, version="0", uptime_s=1.0),
        node=NodeInfo("n2", "none", 0),
        gpus=(),
        instances=(inst,),
    )
    assert (
        "big: one server across nodes: n2 runs ranks 1-2 of 3, headless; head n1 at "
        "10.0.0.1:8000; ranks on n1 (0), n2 (1-2)"
    ) in render(snap)
