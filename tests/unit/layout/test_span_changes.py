"""A changed server across nodes in a plan's `changes` (layout/changes.py): its part (`span`,
a SpanRole) compared key by key, as plain JSON. Before, the daemon's dry run of such a change
failed with "Object of type SpanRole is not JSON serializable" and `vsup fleet up` of a
changed unit was refused on every node (seen in tests/integration/fleet/test_span_faults.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from vsup.layout.changes import spec_changes
from vsup.layout.compiled import compile_document
from vsup.layout.model import loads_layout
from vsup.layout.spec import InstanceSpec

LAYOUT = """[layout]
name = "unit"
node = "{node}"

[[instance]]
name = "big"
model = "acme/tiny-model"
command = ["python", "-m", "vllm.entrypoints.openai.api_server"]
gpus = []
port = {port}
span = {{ ranks = {{ gpu01 = 1, gpu02 = 1 }}, address = "10.0.0.1" }}
"""


def member(node: str, port: int) -> InstanceSpec:
    text = LAYOUT.format(node=node, port=port)
    compiled, diagnostics = compile_document(loads_layout(text, Path("/l")))
    assert compiled is not None, [d.format() for d in diagnostics]
    return compiled.specs[0]


def test_a_units_port_change_is_said_key_by_key_in_plain_json():
    changes = spec_changes(member("gpu02", 8000), member("gpu02", 9000))
    doc = json.loads(json.dumps([c.to_json() for c in changes]))
    assert {"key": "port", "old": 8000, "new": 9000} in doc
    assert {"key": "span.port", "old": 8000, "new": 9000} in doc, doc
    assert "span.port: 8000 -> 9000" in [c.format() for c in changes]


def test_a_span_added_or_removed_is_plain_json_too():
    plain = replace(member("gpu01", 8000), span=None)
    added = spec_changes(plain, member("gpu01", 8000))
    doc = json.loads(json.dumps([c.to_json() for c in added]))
    head = {c["key"]: c["new"] for c in doc}
    assert head["span.node"] == "gpu01" and head["span.head"] is True, doc
    assert head["span.members"] == [["gpu01", 1], ["gpu02", 1]], doc
    removed = spec_changes(member("gpu01", 8000), plain)
    json.dumps([c.to_json() for c in removed])
