"""A span's follower has no server of its own (its base URL is its head's): its node's own
`vsup status` and Prometheus exporter show its part and point at the head, whose figures are
the whole unit's (docs/fleet.md, "Seen as one row"). The daemon leaves the follower's server
figures out (tests/integration/fleet/test_span_faults.py sees it over real daemons)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from vsup.commands.status import render as render_status
from vsup.control.export import render
from vsup.snapshot import (
    NodeInfo,
    SpanNodeStatus,
    SpanStatus,
    StatusSnapshot,
    SupervisorInfo,
    empty_instance,
)


def span(node: str) -> SpanStatus:
    return SpanStatus(
        node=node,
        head=node == "gpu01",
        start_rank=0 if node == "gpu01" else 1,
        ranks=1,
        size=2,
        nodes=(SpanNodeStatus("gpu01", 0, 1), SpanNodeStatus("gpu02", 1, 1)),
        address="10.0.0.1",
        port=8000,
    )


def node_snapshot(node: str, **figures: float) -> StatusSnapshot:
    return StatusSnapshot(
        supervisor=SupervisorInfo(pid=1, version="0", uptime_s=1.0),
        node=NodeInfo(node, "none", 0),
        gpus=(),
        instances=(
            empty_instance("big", state="ready", pid=10, port=8000, span=span(node), **figures),
        ),
    )


def samples(text: str) -> dict[tuple[str, tuple], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def test_each_member_exports_its_part_and_its_head():
    head = samples(render(node_snapshot("gpu01", generation_tokens_per_s=80.0)).decode())
    follower = samples(render(node_snapshot("gpu02")).decode())
    labels = {
        "name": "big",
        "start_rank": "1",
        "ranks": "1",
        "size": "2",
        "head_node": "gpu01",
        "head_url": "http://10.0.0.1:8000",
    }
    key = tuple(sorted({**labels, "node": "gpu02", "role": "follower"}.items()))
    assert follower[("vsup_instance_span_info", key)] == 1
    key = tuple(sorted({**labels, "node": "gpu01", "role": "head", "start_rank": "0"}.items()))
    assert head[("vsup_instance_span_info", key)] == 1
    # the unit's tokens once, at the head; the follower exports none of them
    gen = "vsup_instance_generation_tokens_per_second"
    assert head[(gen, (("name", "big"),))] == 80.0
    assert not any(name == gen for name, _ in follower)


def test_a_followers_status_points_at_its_head_for_the_units_figures():
    text = render_status(node_snapshot("gpu02"))
    assert (
        "big: one server across nodes: gpu02 runs rank 1 of 2, headless; head gpu01 at "
        "10.0.0.1:8000; ranks on gpu01 (0), gpu02 (1); the unit's figures (tokens/s, "
        "requests, KV cache) are its head's, on gpu01"
    ) in text
    head = render_status(node_snapshot("gpu01"))
    assert "the unit's figures" not in head
