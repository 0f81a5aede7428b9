"""The status document (schema 1): every part typed, read back equal through JSON, and every
key of schema 1 kept."""

from __future__ import annotations

import dataclasses
import enum
import json
import types
import typing

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vsup import snapshot as snapshot_module
from vsup.snapshot import (
    SCHEMA,
    BenchStatus,
    GpuProcess,
    GpuStatus,
    LastExit,
    NodeInfo,
    RolloutStatus,
    RouterStatus,
    RouterWorker,
    StatusSnapshot,
    SupervisorInfo,
    WaitReason,
    empty_instance,
)

from tests.support import samples


def test_status_json_round_trips_and_keeps_unknowns_null():
    snap = StatusSnapshot(
        supervisor=SupervisorInfo(pid=1, version="0.1.0", uptime_s=3.0),
        node=NodeInfo(hostname="n", gpu_vendor="none", gpu_count=0),
        gpus=(GpuStatus(0, "H200", 10, 5, None, None, None, (GpuProcess(7, 5, "a"),)),),
        instances=(
            empty_instance(
                "a",
                state="backoff",
                last_exit=LastExit(None, "SIGKILL", "killed", "2026-01-01T00:00:00.000Z", None),
            ),
        ),
    )
    doc = snap.to_json()
    assert list(doc)[0] == "schema" and doc["schema"] == 1
    assert doc["instances"][0]["kv_cache_usage"] is None
    assert doc["instances"][0]["last_exit"]["signal"] == "SIGKILL"
    assert StatusSnapshot.from_json(doc) == snap


# --------------------------------------------------------------------------------------------
# The whole document: every part typed, read back equal, schema 1 kept


def strategy(hint):
    """Values of the type `hint` (a field's annotation), every field filled: a field added to
    the snapshot is covered by the round trip without touching this test."""
    origin = typing.get_origin(hint)
    if origin is typing.Union or origin is types.UnionType:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return st.one_of(st.none(), *(strategy(a) for a in args))
    if origin is tuple:
        return st.lists(strategy(typing.get_args(hint)[0]), max_size=2).map(tuple)
    if origin is dict:
        _, value = typing.get_args(hint)
        return st.dictionaries(st.text(max_size=4), strategy(value), max_size=2)
    if dataclasses.is_dataclass(hint):
        hints = typing.get_type_hints(hint, vars(snapshot_module))
        kw = {f.name: strategy(hints[f.name]) for f in dataclasses.fields(hint)}
        if hint is StatusSnapshot:
            kw["schema"] = st.just(SCHEMA)
        return st.builds(hint, **kw)  # type: ignore[arg-type]  # a dataclass type here, not an instance
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return st.sampled_from(hint)
    if hint is bool:
        return st.booleans()
    if hint is int:
        return st.integers(-(2**53), 2**53)
    if hint is float:
        return st.floats(allow_nan=False, allow_infinity=False)
    if hint is str:
        return st.text(max_size=8)
    if hint is typing.Any:
        return st.one_of(st.none(), st.integers(), st.text(max_size=4))
    raise TypeError(f"no strategy for {hint!r}")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(strategy(StatusSnapshot))
def test_any_snapshot_survives_json_and_comes_back_equal(snap):
    doc = json.loads(json.dumps(snap.to_json()))
    assert StatusSnapshot.from_json(doc) == snap


def test_the_sample_nodes_round_trip():
    for snap in (samples.gpu_node(), samples.cpu_node(), samples.big_node(16)):
        assert StatusSnapshot.from_json(json.loads(json.dumps(snap.to_json()))) == snap


def full() -> StatusSnapshot:
    """A snapshot with every optional part present."""
    waiting = empty_instance(
        "b",
        state="starting",
        wait=WaitReason("co_tenant", "a starting", instances=("a",)),
        start_timeout_s=900.0,
        outdated=True,
        outdated_fields=("args",),
    )
    return StatusSnapshot(
        supervisor=SupervisorInfo(pid=1, version="0.1.0", uptime_s=3.0),
        node=NodeInfo(hostname="n", gpu_vendor="none", gpu_count=0),
        gpus=(),
        instances=(empty_instance("a", state="starting", pid=9, uptime_s=4.0), waiting),
        router=RouterStatus(state="ready", port=8080, workers=(RouterWorker("a", "http://x"),)),
        bench=BenchStatus(pid=7, phase="running"),
        rollout=RolloutStatus(
            state="running",
            wave=1,
            waves=2,
            done=0,
            total=2,
            current=("a",),
            pending=("b",),
            names=("a", "b"),
            old_config=("a", "b"),
        ),
    )


# The keys of schema 1 as they were before the typed parts (additive only: every one stays,
# with its meaning), and the ones added since.
SCHEMA_1 = {
    "": {"schema", "supervisor", "node", "gpus", "instances", "advice", "router", "bench",
         "rollout"},
    "rollout": {"state", "wave", "waves", "done", "total", "current", "pending",
                "max_unavailable", "failure", "started_at", "ended_at"},
    "router": {"state", "pid", "host", "port", "metrics_port", "policy", "model", "url",
               "endpoint", "run", "restarts", "uptime_s", "log", "last_exit", "failed_why",
               "requests_per_s", "errors_per_s", "requests_total", "errors_total",
               "retries_total", "error", "workers"},
    "worker": {"name", "url", "state", "in_router", "wanted", "share", "requests_total",
               "healthy"},
    "bench": {"pid", "phase", "layout", "index", "count", "requests_done", "requests_total",
              "elapsed_s", "started_at", "age_s"},
    "instance": {"name", "state", "pid", "port", "gpus", "model", "restarts", "uptime_s",
                 "hbm_bytes", "hbm_source", "kv_cache_usage", "kv_capacity_tokens",
                 "preemptions_total", "preemptions_per_min", "requests_running",
                 "requests_waiting", "generation_tokens_per_s", "backend", "backend_source",
                 "last_exit", "waiting_for", "backoff_remaining_s", "state_since_s", "run",
                 "failed_why", "stalled", "stalled_since", "stalled_for_s", "parallel", "ranks",
                 "hbm_per_gpu"},
}  # fmt: skip
ADDED = {
    "rollout": {"names", "restarted", "old_config", "drain_timeout_s", "interrupted_at"},
    "instance": {"wait", "start_timeout_s", "outdated", "outdated_fields"},
    "wait": {"kind", "message", "instances", "pids", "held_bytes", "gpus", "remaining_s"},
}


def test_schema_1_keeps_every_key_and_adds_the_typed_parts():
    doc = json.loads(json.dumps(full().to_json()))
    parts = {
        "": doc,
        "rollout": doc["rollout"],
        "router": doc["router"],
        "worker": doc["router"]["workers"][0],
        "bench": doc["bench"],
        "instance": doc["instances"][1],
        "wait": doc["instances"][1]["wait"],
    }
    for part, keys in SCHEMA_1.items():
        assert keys <= set(parts[part]), (part, keys - set(parts[part]))
    for part, keys in ADDED.items():
        assert keys <= set(parts[part]), (part, keys - set(parts[part]))
    assert doc["instances"][1]["wait"] == {
        "kind": "co_tenant",
        "message": "a starting",
        "instances": ["a"],
        "pids": [],
        "held_bytes": None,
        "gpus": [],
        "remaining_s": None,
    }
    assert list(doc)[0] == "schema" and doc["rollout"]["done"] == 0  # a count, as it was
    back = StatusSnapshot.from_json(doc)
    assert back == full() and isinstance(back.rollout, RolloutStatus)
    assert isinstance(back.router, RouterStatus) and back.router.workers[0].name == "a"
    assert back.instances[1].lifecycle.wait == WaitReason(
        "co_tenant", "a starting", instances=("a",)
    )


def test_an_older_daemons_document_reads_with_defaults_and_a_newer_ones_extra_keys_are_ignored():
    doc = json.loads(json.dumps(full().to_json()))
    for key in ("rollout", "bench", "router"):
        del doc[key]
    for inst in doc["instances"]:
        for key in ("wait", "start_timeout_s", "outdated", "outdated_fields"):
            del inst[key]
    doc["instances"][0]["from_the_future"] = {"x": 1}
    doc["something_new"] = [1, 2]
    snap = StatusSnapshot.from_json(doc)
    assert snap.rollout is None and snap.router is None and snap.bench is None
    assert snap.instances[1].lifecycle.wait is None and snap.instances[1].lifecycle.outdated is None


def test_a_document_of_another_schema_or_shape_is_refused_clearly():
    with pytest.raises(ValueError, match="unsupported status schema 2"):
        StatusSnapshot.from_json({"schema": 2})
    with pytest.raises(ValueError, match="not a status document"):
        StatusSnapshot.from_json({"schema": 1, "supervisor": "x", "node": {}})


def test_to_json_is_built_once_per_snapshot():
    snap = full()
    assert snap.to_json() is snap.to_json()
    assert dataclasses.replace(snap, advice=()).to_json() is not snap.to_json()


def test_the_start_progress_is_the_time_since_the_spawn_of_a_starting_instance():
    assert (
        empty_instance("a", state="starting", pid=9, uptime_s=4.0).lifecycle.start_elapsed_s == 4.0
    )
    assert empty_instance("a", state="starting", uptime_s=4.0).lifecycle.start_elapsed_s is None
    assert empty_instance("a", state="ready", pid=9, uptime_s=4.0).lifecycle.start_elapsed_s is None
