"""InstanceStatus is typed parts (lifecycle, telemetry, memory, stall, sleep, pull, ranks) while
the wire stays schema 1: one flat object per instance, its keys in the order they always had.

tests/fixtures/status/schema1-before-parts.json was written by the code before the parts (main at
6f07396): a real in-process daemon's `status` answer over two vLLM emulators, the dashboard's
sample nodes, and instances with every flag part set (stall, wait, sleep, ranks, last exit)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import typing
from pathlib import Path
from typing import Any

import pytest

from vsup import snapshot as snapshot_module
from vsup.control.export import INSTANCE_GAUGES, INSTANCE_PREEMPTIONS
from vsup.snapshot import (
    WIRE_KEYS,
    InstanceStatus,
    LifecycleStatus,
    MemoryStatus,
    StallStatus,
    StatusSnapshot,
    TelemetryStatus,
)
from vsup.states import State

from tests.unit.control.helpers import emulator_layout, free_port

pytestmark = pytest.mark.timeout(60)

RECORDED = Path(__file__).parents[2] / "fixtures" / "status" / "schema1-before-parts.json"

# An instance's keys as schema 1 has carried them (the flat dataclass's field order before
# the parts): the wire must keep every one, in this order.
SCHEMA1_INSTANCE_KEYS = (
    "name", "state", "pid", "port", "gpus", "model", "restarts", "uptime_s", "hbm_bytes",
    "hbm_source", "kv_cache_usage", "kv_capacity_tokens", "preemptions_total",
    "preemptions_per_min", "requests_running", "requests_waiting", "generation_tokens_per_s",
    "backend", "backend_source", "last_exit", "prompt_tokens_per_s", "prefix_cache_hit_rate",
    "planned_hbm_bytes", "gpu_memory_utilization", "state_since_s", "run", "host",
    "backoff_remaining_s", "backend_name", "waiting_for", "failed_why",
    "vllm_requested_hbm_bytes", "vllm_weights_bytes", "vllm_activation_bytes",
    "vllm_non_torch_bytes", "vllm_cudagraph_bytes", "vllm_kv_cache_bytes", "hbm_start_bytes",
    "parallel", "hbm_per_gpu", "ranks", "stalled", "stalled_since", "stalled_for_s",
    "stall_evidence", "stalled_ranks", "requests_in_flight", "load_tracking", "wait",
    "start_timeout_s", "outdated", "outdated_fields", "pull", "served_model_name", "sleep",
)  # fmt: skip
# Keys added since (schema 1 is additive), after those, in this order.
ADDED_INSTANCE_KEYS = ("span",)


def recorded() -> dict[str, Any]:
    docs: dict[str, Any] = json.loads(RECORDED.read_text())
    return docs


def test_the_wire_keeps_schema_1s_keys_in_their_order() -> None:
    assert WIRE_KEYS[: len(SCHEMA1_INSTANCE_KEYS)] == SCHEMA1_INSTANCE_KEYS
    assert WIRE_KEYS[len(SCHEMA1_INSTANCE_KEYS) :] == ADDED_INSTANCE_KEYS


def test_every_attribute_of_every_part_has_exactly_one_wire_key() -> None:
    """A field added to a part (or to the instance) without a wire key would never reach
    `status --json`; one with two keys would be written twice."""
    places = [(part, attr) for _key, part, attr in snapshot_module._WIRE]
    assert len(places) == len(set(places))
    parts: dict[str | None, type[Any]] = {
        None: InstanceStatus,
        "lifecycle": LifecycleStatus,
        "telemetry": TelemetryStatus,
        "memory": MemoryStatus,
        "stall": StallStatus,
    }
    own_parts = {"lifecycle", "telemetry", "memory", "stall"}
    expected = {
        (part, f)
        for part, cls in parts.items()
        for f in (field.name for field in dataclasses.fields(cls))
        if not (part is None and f in own_parts)
    }
    assert set(places) == expected


def kept(old: Any, new: Any, where: str = "") -> list[str]:
    """Where `new` loses or changes what `old` says: every key of a recorded object is written
    back with its value, in its order; keys added since the recording (schema 1 allows added
    keys) may sit anywhere."""
    if isinstance(old, dict) and isinstance(new, dict):
        problems = [f"{where}.{k}: lost" for k in old if k not in new]
        order = [k for k in new if k in old]
        if not problems and order != list(old):
            problems.append(f"{where}: keys reordered")
        for k in old:
            if k in new:
                problems += kept(old[k], new[k], f"{where}.{k}")
        return problems
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [
            p
            for n, (a, b) in enumerate(zip(old, new, strict=True))
            for p in kept(a, b, f"{where}[{n}]")
        ]
    return [] if old == new and type(old) is type(new) else [f"{where}: {old!r} -> {new!r}"]


def test_documents_written_before_the_parts_decode_and_write_back_every_key_and_value() -> None:
    for label, doc in recorded().items():
        snap = StatusSnapshot.from_json(doc)
        assert kept(doc, json.loads(json.dumps(snap.to_json()))) == [], label
        for inst, raw in zip(snap.instances, doc["instances"], strict=True):
            assert list(raw) == list(SCHEMA1_INSTANCE_KEYS)
            assert inst.lifecycle.state is State(raw["state"])
            assert inst.telemetry.kv_cache_usage == raw["kv_cache_usage"]
            assert inst.memory.hbm_bytes == raw["hbm_bytes"]
            assert (inst.stall is None) == (raw["stalled"] is None)


def test_the_recorded_flags_land_in_their_parts() -> None:
    flags = StatusSnapshot.from_json(recorded()["flags"])
    waiting, stuck = flags.instances
    assert waiting.lifecycle.state is State.STARTING
    assert waiting.lifecycle.wait is not None and waiting.lifecycle.wait.instances == ("a",)
    assert waiting.lifecycle.outdated_fields == ("args",)
    assert waiting.stall == StallStatus(stalled=False) and waiting.active_stall is None
    assert waiting.sleep is not None and waiting.sleep.group == "g"
    assert stuck.active_stall == StallStatus(
        stalled=True, since="2026-12-01T04:10:00Z", for_s=72.0, evidence="engine", ranks=(1,)
    )
    assert stuck.lifecycle.last_exit is not None and stuck.lifecycle.last_exit.rank == 1
    assert [r.alive for r in stuck.ranks] == [True, False]
    assert stuck.memory.hbm_per_gpu == {"0": 5, "1": None}


def test_keys_a_newer_daemon_adds_are_ignored() -> None:
    doc = json.loads(json.dumps(recorded()["daemon"]))
    plain = StatusSnapshot.from_json(doc)
    doc["from_a_newer_daemon"] = {"x": 1}
    for inst in doc["instances"]:
        inst["a_newer_key"] = [1, 2]
    assert StatusSnapshot.from_json(doc) == plain


def test_an_unknown_state_names_the_value() -> None:
    doc = json.loads(json.dumps(recorded()["daemon"]))
    doc["instances"][0]["state"] = "dancing"
    with pytest.raises(ValueError, match="dancing"):
        StatusSnapshot.from_json(doc)


def test_each_exported_instance_series_reads_an_attribute_of_a_part() -> None:
    """control/export.py reads its series by (dotted) attribute name: a name mypy cannot check."""
    for series in (*INSTANCE_GAUGES, INSTANCE_PREEMPTIONS):
        hint: Any = InstanceStatus
        for name in series.attr.split("."):
            hints = typing.get_type_hints(hint, vars(snapshot_module))
            assert name in hints, series
            args = [a for a in typing.get_args(hints[name]) if a is not type(None)]
            hint = args[0] if args else hints[name]


async def test_a_real_daemons_snapshot_round_trips_to_identical_json(daemons) -> None:
    daemon, wire = await daemons.start()
    text = emulator_layout({"a": free_port(), "b": free_port()})
    await wire.apply(text, "/tmp/fakes.toml")
    for name in ("a", "b"):
        assert await daemon.engine.wait(name, ("ready",), timeout=20) == "ready"

    def served() -> bool:
        doc = daemon.build_snapshot().to_json()
        return all(i["generation_tokens_per_s"] is not None for i in doc["instances"])

    for _ in range(200):
        if served():
            break
        await asyncio.sleep(0.1)
    snap = daemon.build_snapshot()
    sent = json.dumps(snap.to_json())
    back = StatusSnapshot.from_json(json.loads(sent))
    assert back == snap
    assert json.dumps(back.to_json()) == sent
    answered = await wire.status()
    keys = [*SCHEMA1_INSTANCE_KEYS, *ADDED_INSTANCE_KEYS]
    assert [list(i) for i in answered["instances"]] == [keys] * 2
    a = back.instance("a")
    assert a is not None and a.lifecycle.state is State.READY and a.is_ready
    assert a.lifecycle.pid is not None and a.lifecycle.run == 1
    assert a.telemetry.generation_tokens_per_s is not None and a.telemetry.backend is not None
    assert a.memory.hbm_source == "unavailable"  # CPU emulators: no GPU figure
    assert a.stall is not None and not a.stall.stalled  # judged ready: a verdict, not stalled
