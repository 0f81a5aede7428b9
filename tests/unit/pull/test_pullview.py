"""A pull as status JSON round-trips it and as people read it."""

from __future__ import annotations

import json

from vsup import pullview
from vsup.control.advice import pull_failed
from vsup.snapshot import PullStatus, StatusSnapshot, empty_instance

from tests.support import samples

GiB = 2**30
PULL = PullStatus(
    "org/model",
    "main",
    "pulling",
    instances=("a", "b"),
    bytes_done=3 * GiB,
    bytes_total=12 * GiB,
    rate_bps=100 * 2**20,
    eta_s=92.0,
    files_done=2,
    files_total=6,
    current=("model-00002-of-00004.safetensors",),
)


def test_a_pull_round_trips_through_status_json():
    snap = samples.gpu_node()
    insts = (*snap.instances[1:], empty_instance("new", pull=PULL))
    snapshot = StatusSnapshot(snap.supervisor, snap.node, snap.gpus, insts, pulls=(PULL,))
    doc = json.loads(json.dumps(snapshot.to_json()))  # what `vsup status --json` prints
    assert doc["pulls"][0]["instances"] == ["a", "b"]
    back = StatusSnapshot.from_json(doc)
    assert back.pulls == (PULL,)
    assert back.instance("new").pull == PULL
    assert all(i.pull is None for i in back.instances if i.name != "new")


def test_the_line_and_the_state_mark():
    assert pullview.pull_line(PULL) == (
        "PULL org/model for a, b: 3.0 GiB/12.0 GiB (25%), 100 MiB/s, ETA 1m32s, 2/6 files"
    )
    assert pullview.state_mark(PULL) == "pulling 25%"
    failed = PullStatus("org/model", "v2", "failed", ("a",), reason="forbidden", message="no")
    assert pullview.pull_line(failed) == "PULL FAILED org/model@v2 for a (forbidden): no"
    assert pullview.state_mark(failed) == "pull failed"
    assert pullview.state_mark(None) is None
    assert pullview.human_bytes(512) == "512 B" and pullview.human_bytes(1536) == "1.5 KiB"


def test_a_failed_pull_is_one_piece_of_advice_for_all_its_instances():
    failed = PullStatus("org/model", "main", "failed", ("a", "b"), reason="no_space", message="m")
    insts = [empty_instance("a", pull=failed), empty_instance("b", pull=failed)]
    (advice,) = pull_failed(insts)
    assert advice.kind == "pull_failed" and advice.severity == "critical"
    assert advice.message.startswith("a, b: not started: the pull of org/model failed (no_space)")
    assert pull_failed([empty_instance("a", pull=PULL)]) == []
