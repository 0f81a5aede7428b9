"""The data-parallel keys of the status document: round trip, and the `vsup status` table."""

from __future__ import annotations

import json

from vsup.commands.status import render
from vsup.snapshot import (
    LastExit,
    NodeInfo,
    Parallel,
    RankStatus,
    StatusSnapshot,
    SupervisorInfo,
    empty_instance,
)

GiB = 2**30


def snapshot() -> StatusSnapshot:
    dp = empty_instance(
        "dp2",
        state="backoff",
        gpus=(0, 1, 2, 3),
        pid=500,
        parallel=Parallel(2, 1, 2),
        hbm_per_gpu={"0": 61 * GiB, "1": 60 * GiB, "2": None, "3": None},
        ranks=(
            RankStatus(0, (0, 1), 501, True, 121 * GiB),
            RankStatus(1, (2, 3), 502, False, None),
        ),
        last_exit=LastExit(0, None, "engine_dead", "2026-12-01T04:12:53.999Z", None, rank=1),
    )
    tp1 = empty_instance("gpu4", state="ready", gpus=(4,), parallel=Parallel(1, 1, 1))
    return StatusSnapshot(
        supervisor=SupervisorInfo(pid=1, version="0", uptime_s=1.0),
        node=NodeInfo("n", "nvidia", 8),
        gpus=(),
        instances=(dp, tp1),
    )


def test_the_dp_keys_survive_json_and_come_back_equal() -> None:
    snap = snapshot()
    doc = json.loads(json.dumps(snap.to_json()))
    inst = doc["instances"][0]
    assert inst["parallel"] == {"tp": 2, "pp": 1, "dp": 2}
    assert inst["hbm_per_gpu"] == {"0": 61 * GiB, "1": 60 * GiB, "2": None, "3": None}
    assert inst["ranks"][1] == {
        "rank": 1,
        "gpus": [2, 3],
        "pid": 502,
        "alive": False,
        "hbm_bytes": None,
    }
    assert inst["last_exit"]["rank"] == 1
    assert doc["instances"][1]["ranks"] == []
    assert StatusSnapshot.from_json(doc) == snap


def test_an_older_daemon_without_the_keys_still_reads() -> None:
    doc = json.loads(json.dumps(snapshot().to_json()))
    for inst in doc["instances"]:
        for key in ("parallel", "hbm_per_gpu", "ranks"):
            del inst[key]
        if inst["last_exit"]:
            del inst["last_exit"]["rank"]
    back = StatusSnapshot.from_json(doc)
    assert back.instances[0].parallel is None and back.instances[0].ranks == ()
    assert "-" in render(doc).splitlines()[2].split()  # the SHAPE cell


def test_the_status_table_shows_the_shape_and_the_ranks() -> None:
    text = render(json.loads(json.dumps(snapshot().to_json())))
    header, dp, tp1 = text.splitlines()[1:4]
    assert "SHAPE" in header.split()
    assert "TP2 x DP2" in dp and " TP1 " in tp1
    assert "dp2 ranks: DP0 gpu 0,1 pid 501 alive 121.0G; DP1 gpu 2,3 pid 502 dead" in text
    assert "data-parallel rank 1 died first" in text
