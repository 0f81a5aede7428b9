"""A stalled instance as every client sees it: advice, Prometheus, `vsup status`, the
dashboard's row and detail pane, the journal events and the on_stall restart request."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from prometheus_client.parser import text_string_to_metric_families

from vsup.commands.status import render as render_status
from vsup.control.advice import AdviceInputs, compute_advice
from vsup.control.export import render as render_metrics
from vsup.control.stalls import StallActions
from vsup.engine.exitreason import classify
from vsup.layout.spec import InstanceSpec, RestartPolicy
from vsup.snapshot import (
    EXIT_REASONS,
    NodeInfo,
    RankStatus,
    StatusSnapshot,
    SupervisorInfo,
    empty_instance,
)
from vsup.tui import rows
from vsup.tui.widgets.detail import exit_text

from tests.factories import instance_spec

STALLED = empty_instance(
    "g0",
    state="ready",
    pid=10,
    port=8000,
    run=3,
    requests_running=3.0,
    requests_waiting=5.0,
    generation_tokens_per_s=0.0,
    stalled=True,
    stalled_since="2026-12-01T04:10:00Z",
    stalled_for_s=72.4,
)
BUSY = empty_instance("g1", state="ready", pid=11, port=8001, requests_running=2.0, stalled=False)


def snapshot(*instances) -> StatusSnapshot:
    return StatusSnapshot(
        supervisor=SupervisorInfo(pid=1, version="0.1.0", uptime_s=5.0, layout="l"),
        node=NodeInfo(hostname="node1", gpu_vendor="none", gpu_count=0),
        gpus=(),
        instances=instances,
        advice=compute_advice(instances, (), AdviceInputs(recent_failures={})),
    )


def test_advice_says_what_is_seen_and_what_to_do():
    (advice,) = compute_advice([STALLED, BUSY], [], AdviceInputs(recent_failures={}))
    assert (advice.kind, advice.severity, advice.instance) == ("stalled", "critical", "g0")
    for seen in ("3 running", "5 waiting", "0 tokens processed for 72 s", "/health answers 200"):
        assert seen in advice.message
    for todo in ("vsup logs g0", "vsup restart g0", "restart.on_stall = true"):
        assert todo in advice.message


def test_prometheus_has_a_stalled_gauge_and_its_duration():
    got = {}
    for fam in text_string_to_metric_families(render_metrics(snapshot(STALLED, BUSY)).decode()):
        for s in fam.samples:
            got[(s.name, s.labels.get("name"))] = s.value
    assert got[("vsup_instance_stalled", "g0")] == 1
    assert got[("vsup_instance_stalled", "g1")] == 0
    assert got[("vsup_instance_stalled_seconds", "g0")] == 72.4
    assert ("vsup_instance_stalled_seconds", "g1") not in got
    assert got[("vsup_instance_up", "g0")] == 1  # still serving /health
    assert got[("vsup_advice_active", "g0")] == 1


def test_status_table_marks_the_row_and_prints_the_advice():
    text = render_status(snapshot(STALLED, BUSY).to_json())
    row = next(line for line in text.splitlines() if line.startswith("g0 "))
    assert "ready STALLED 1m12s" in row
    g1 = next(line for line in text.splitlines() if line.startswith("g1 "))
    assert "STALLED" not in g1
    assert "critical: g0: stalled: 3 running, 5 waiting" in text


def test_status_json_keeps_state_ready_and_adds_the_flag():
    doc = snapshot(STALLED).to_json()
    (inst,) = doc["instances"]
    assert inst["state"] == "ready"
    assert (inst["stalled"], inst["stalled_since"], inst["stalled_for_s"]) == (
        True,
        "2026-12-01T04:10:00Z",
        72.4,
    )
    assert StatusSnapshot.from_json(doc).instances[0].active_stall is not None


def test_dashboard_row_and_detail_pane_show_the_stall():
    cols = rows.COLUMNS
    state = rows.row_cells(STALLED, cols)[[c.key for c in cols].index("state")]
    assert state == ("⏸ stall 1m12s", "bold red")
    assert len(state[0]) <= next(c.width for c in cols if c.key == "state")
    assert rows.row_cells(BUSY, cols)[[c.key for c in cols].index("state")][0] == "● ready"
    assert rows.sorted_names([BUSY, STALLED], "state") == ["g0", "g1"]  # problems first
    assert rows.matches(STALLED, "stalled") and not rows.matches(BUSY, "stalled")
    detail = exit_text(STALLED).plain
    assert detail.startswith("stalled 1m12s: 3 running, 5 waiting, no token since 04:10:00Z")


def test_stalled_is_an_exit_reason_vsup_gives_when_it_ends_the_run():
    assert "stalled" in EXIT_REASONS
    assert classify(None, 15, "", cause="stalled").reason == "stalled"
    assert classify(0, None, "INFO 12-01 04:00:00 fine\n", cause="stalled").reason == "stalled"


@dataclass
class _Inst:
    spec: InstanceSpec


@dataclass
class _Engine:
    """The two things StallActions uses of the engine (instances, restart_stalled)."""

    instances: dict
    restarted: list = field(default_factory=list)
    router: None = None

    def restart_stalled(self, name: str, why: str, rank: int | None = None) -> bool:
        self.restarted.append((name, why, rank))
        return True


def spec(name: str, on_stall: bool) -> InstanceSpec:
    return instance_spec(name, restart=RestartPolicy(on_stall=on_stall), stall_after_s=60.0)


def test_stall_start_and_end_are_journaled_once_and_on_stall_asks_for_a_restart():
    events: list = []
    engine = _Engine({"g0": _Inst(spec("g0", True)), "g1": _Inst(spec("g1", False))})
    actions = StallActions(lambda ev: events.append((ev.kind, ev.instance, ev.fields())), engine)
    stalled_g1 = empty_instance("g1", state="ready", run=1, requests_running=1.0, stalled=True)
    actions.observe([STALLED, stalled_g1])
    actions.observe([STALLED, stalled_g1])  # still stalled: nothing new
    assert [(k, n) for k, n, _ in events] == [("stalled", "g0"), ("stalled", "g1")]
    assert events[0][2]["on_stall"] is True and events[1][2]["on_stall"] is False
    assert events[0][2]["requests_waiting"] == 5.0 and events[0][2]["stall_after_s"] == 60.0
    assert engine.restarted == [
        ("g0", "3 running, 5 waiting and no token processed for 72 s (stall_after_s = 60)", None)
    ]
    events.clear()
    restarting = empty_instance("g0", state="backoff", run=3)
    moving = empty_instance("g1", state="ready", run=1, requests_running=1.0, stalled=False)
    actions.observe([restarting, moving])
    assert [(k, n, e["why"]) for k, n, e in events] == [
        ("stall_cleared", "g0", "not ready"),
        ("stall_cleared", "g1", "progress"),
    ]
    assert events[0][2]["lasted_s"] == 72.4


def test_a_reading_that_cannot_tell_does_not_end_a_stall():
    # figures stale for a poll (a slow scrape on a loaded node): `stalled` is null, the run and
    # its state unchanged; one freeze stays one `stalled` event, ended once when it clears
    events: list = []
    engine = _Engine({"g1": _Inst(spec("g1", False))})
    actions = StallActions(lambda ev: events.append((ev.kind, ev.instance, ev.fields())), engine)
    stalled = empty_instance("g1", state="ready", run=1, requests_running=1.0, stalled=True)
    unknown = empty_instance("g1", state="ready", run=1, stalled=None)
    moving = empty_instance("g1", state="ready", run=1, requests_running=1.0, stalled=False)
    for reading in (stalled, unknown, unknown, stalled, moving):
        actions.observe([reading])
    assert [(k, e.get("why")) for k, _n, e in events] == [
        ("stalled", None),
        ("stall_cleared", "progress"),
    ]
    # unknown because the run ended, or because detection was turned off: that ends it
    events.clear()
    actions.observe([stalled])
    actions.observe([empty_instance("g1", state="ready", run=2, stalled=None)])
    engine.instances["g1"] = _Inst(replace(spec("g1", False), stall_after_s=0.0))
    actions.observe([stalled])
    actions.observe([unknown])
    assert [(k, e.get("why")) for k, _n, e in events] == [
        ("stalled", None),
        ("stall_cleared", "not ready"),
        ("stalled", None),
        ("stall_cleared", "off"),
    ]


# A freeze that began while idle: requests only the API server's /load counts.
FROZEN_IDLE = empty_instance(
    "g2",
    state="ready",
    pid=12,
    port=8002,
    run=1,
    requests_running=0.0,
    requests_waiting=0.0,
    requests_in_flight=3,
    load_tracking=True,
    stalled=True,
    stalled_since="2026-12-01T04:10:00Z",
    stalled_for_s=61.0,
    stall_evidence="server",
)
# Data parallel: rank 1 of two frozen under load.
RANK1 = empty_instance(
    "dp",
    state="ready",
    pid=13,
    port=8003,
    run=2,
    requests_running=16.0,
    requests_waiting=0.0,
    requests_in_flight=16,
    stalled=True,
    stalled_since="2026-12-01T04:10:00Z",
    stalled_for_s=65.0,
    stall_evidence="engine",
    stalled_ranks=(1,),
    ranks=(
        RankStatus(rank=0, gpus=(), pid=20, alive=True, hbm_bytes=None),
        RankStatus(rank=1, gpus=(), pid=21, alive=True, hbm_bytes=None),
    ),
)


def test_a_freeze_while_idle_is_told_by_the_api_servers_requests():
    (advice,) = compute_advice([FROZEN_IDLE], [], AdviceInputs(recent_failures={}))
    assert "3 requests in flight at the API server and none at the engine" in advice.message
    detail = exit_text(FROZEN_IDLE).plain
    assert "stalled 1m01s: 3 in flight at the API server, none at the engine" in detail
    cols = rows.COLUMNS
    keys = [c.key for c in cols]
    assert rows.row_cells(FROZEN_IDLE, cols)[keys.index("in_flight")] == ("3", "yellow")
    assert rows.row_cells(BUSY, cols)[keys.index("in_flight")] == ("-", "dim")
    # the LOAD column shows only where some instance reports /load
    assert rows.has_load_figures([BUSY, FROZEN_IDLE]) and not rows.has_load_figures([BUSY])
    assert "in_flight" in [c.key for c in rows.columns_for(200, False, has_load=True)]
    assert "in_flight" not in [c.key for c in rows.columns_for(200, False)]
    doc = snapshot(FROZEN_IDLE).to_json()["instances"][0]
    assert (doc["requests_in_flight"], doc["load_tracking"], doc["stall_evidence"]) == (
        3,
        True,
        "server",
    )


def test_prometheus_has_the_requests_in_flight_and_each_ranks_stall():
    got = {}
    for fam in text_string_to_metric_families(
        render_metrics(snapshot(FROZEN_IDLE, RANK1, BUSY)).decode()
    ):
        for s in fam.samples:
            got[(s.name, s.labels.get("name"), s.labels.get("rank"))] = s.value
    assert got[("vsup_instance_requests_in_flight", "g2", None)] == 3
    assert ("vsup_instance_requests_in_flight", "g1", None) not in got  # no load tracking
    assert got[("vsup_instance_rank_stalled", "dp", "1")] == 1
    assert got[("vsup_instance_rank_stalled", "dp", "0")] == 0


def test_a_stalled_rank_is_named_in_the_events_the_advice_and_the_restart():
    events: list = []
    dp_spec = replace(spec("dp", True), args={"data-parallel-size": 2})
    engine = _Engine({"dp": _Inst(dp_spec), "g2": _Inst(spec("g2", True))})
    actions = StallActions(lambda ev: events.append((ev.kind, ev.instance, ev.fields())), engine)
    actions.observe([RANK1, FROZEN_IDLE])
    stalled = {n: keys for kind, n, keys in events if kind == "stalled"}
    assert stalled["dp"]["ranks"] == [1] and stalled["dp"]["evidence"] == "engine"
    assert stalled["g2"]["evidence"] == "server" and stalled["g2"]["requests_in_flight"] == 3
    assert engine.restarted == [
        (
            "dp",
            "data-parallel rank 1: 16 running, 0 waiting and no token processed for 65 s "
            "(stall_after_s = 60)",
            1,
        ),
        (
            "g2",
            "3 requests in flight at the API server and none at the engine and no token "
            "processed for 61 s (stall_after_s = 60)",
            None,
        ),
    ]
    (advice,) = compute_advice([RANK1], [], AdviceInputs(recent_failures={}))
    assert "dp: stalled: data-parallel rank 1: 16 running" in advice.message
    assert exit_text(RANK1).plain.startswith("stalled 1m05s: DP rank 1: 16 running, 0 waiting")
    assert StatusSnapshot.from_json(snapshot(RANK1).to_json()).instances[0].stall == RANK1.stall
