"""A node's summary from its status JSON: counts, the worst alert, tokens/s, the router."""

from __future__ import annotations

from vsup.fleet.view import summarize

from tests.support import samples


def test_a_node_summary_from_its_status_json():
    snap = samples.gpu_node()
    doc = snap.to_json()
    doc["advice"] = [
        {
            "kind": "foreign_process",
            "severity": "warning",
            "message": "pid 9",
            "instance": None,
            "gpu": 1,
        },
        {
            "kind": "crash_loop",
            "severity": "critical",
            "message": "a crashed",
            "instance": "a",
            "gpu": None,
        },
    ]
    doc["router"] = {"endpoint": "http://node:9000", "state": "ready"}
    doc["rollout"] = {"state": "running", "wave": 1, "waves": 3, "done": 1, "total": 3}
    view = summarize("gpu01", "gpu01", doc, {"vllm_version": "0.32.0"}, groups=("r",))
    assert view.reachable and view.daemon
    assert view.total == len(snap.instances) and view.ready == snap.ready_count
    assert view.gpus == snap.node.gpu_count
    assert view.alerts == 2 and view.worst.kind == "crash_loop" and view.worst.instance == "a"
    assert view.router == "http://node:9000" and view.router_state == "ready"
    assert view.rollout == "running 1/3" and view.vllm_version == "0.32.0"
    rates = [
        i.telemetry.generation_tokens_per_s
        for i in snap.instances
        if i.telemetry.generation_tokens_per_s
    ]
    assert view.tokens_per_s == round(sum(rates), 1)
    assert view.to_json()["worst"]["severity"] == "critical"
    assert view.to_json()["groups"] == ["r"]
