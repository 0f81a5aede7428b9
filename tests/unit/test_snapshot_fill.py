"""`InstanceStatus.from_wire` builds an instance's frozen parts without their generated
`__init__` (snapshot._filled: the daemon builds every instance's row each poll). What it builds
must be what the dataclasses' own constructors build: equal, hashable alike, frozen, copyable
with `dataclasses.replace`, and refusing what `__init__` refuses."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vsup import snapshot as snapshot_module
from vsup.snapshot import (
    WIRE_KEYS,
    InstanceStatus,
    LastExit,
    LifecycleStatus,
    MemoryStatus,
    Parallel,
    StallStatus,
    StatusSnapshot,
    TelemetryStatus,
)
from vsup.states import ExitReason, State

from tests.unit.control.test_status_parts import recorded

numbers = st.none() | st.floats(allow_nan=False, width=32) | st.integers(-(2**40), 2**40)
texts = st.none() | st.text(max_size=8)


def _by_init(name: str, values: dict[str, object]) -> InstanceStatus:
    """The same instance through every dataclass's own `__init__` (the code before)."""
    parts: dict[str | None, dict[str, object]] = {}
    for key, value in values.items():
        part, attr = snapshot_module._WIRE_PLACE[key]
        parts.setdefault(part, {})[attr] = value
    own = parts.get(None, {})
    life = parts.get("lifecycle", {})
    life["state"] = State(life.get("state", State.STOPPED))  # type: ignore[arg-type]
    stall = parts.get("stall")
    return InstanceStatus(
        name=own.pop("name", name),  # type: ignore[arg-type]
        lifecycle=LifecycleStatus(**life),  # type: ignore[arg-type]
        telemetry=TelemetryStatus(**parts.get("telemetry", {})),  # type: ignore[arg-type]
        memory=MemoryStatus(**parts.get("memory", {})),  # type: ignore[arg-type]
        stall=None if not stall or stall.get("stalled") is None else StallStatus(**stall),  # type: ignore[arg-type]
        **own,  # type: ignore[arg-type]
    )


def _same(a: InstanceStatus, b: InstanceStatus) -> None:
    assert a == b
    try:
        hashed = hash(b)
    except TypeError:  # a part holding a dict (hbm_per_gpu): unhashable either way
        with pytest.raises(TypeError):
            hash(a)
    else:
        assert hash(a) == hashed
    assert a.to_json() == b.to_json()
    for part in ("lifecycle", "telemetry", "memory", "stall"):
        pa, pb = getattr(a, part), getattr(b, part)
        assert type(pa) is type(pb)
        if pa is not None:
            assert vars(pa) == vars(pb)  # every field set, in the same order
    assert list(vars(a)) == list(vars(b))


def test_every_recorded_instance_is_built_equal_to_its_dataclass_init():
    docs = recorded()
    seen = 0
    for doc in docs.values():
        for inst in StatusSnapshot.from_json(doc).instances:
            wire = snapshot_module._wire_values(inst)
            _same(InstanceStatus.from_wire(inst.name, **wire), _by_init(inst.name, wire))
            seen += 1
    assert seen >= 4


@settings(max_examples=100, deadline=None)
@given(
    state=st.sampled_from(list(State)),
    pid=st.none() | st.integers(1, 2**22),
    restarts=st.integers(0, 50),
    kv=numbers,
    running=numbers,
    backend=texts,
    hbm=st.none() | st.integers(0, 2**40),
    stalled=st.none() | st.booleans(),
    since=texts,
    port=st.none() | st.integers(1, 65535),
    gpus=st.lists(st.integers(0, 7), max_size=4).map(tuple),
    exit_code=st.none() | st.integers(-9, 255),
    leave_out=st.sets(st.sampled_from(WIRE_KEYS[1:]), max_size=20),
)
def test_random_rows_are_built_equal_to_their_dataclass_init(
    state, pid, restarts, kv, running, backend, hbm, stalled, since, port, gpus, exit_code,
    leave_out,
):  # fmt: skip
    values: dict[str, object] = {
        "state": state,
        "pid": pid,
        "restarts": restarts,
        "kv_cache_usage": kv,
        "requests_running": running,
        "backend": backend,
        "hbm_bytes": hbm,
        "stalled": stalled,
        "stalled_since": since,
        "port": port,
        "gpus": gpus,
        "parallel": Parallel(tp=1, pp=1, dp=1),
        "last_exit": None
        if exit_code is None
        else LastExit(
            code=exit_code, signal=None, reason=list(ExitReason)[0].value, at="x", log_excerpt=None
        ),
    }
    values = {k: v for k, v in values.items() if k not in leave_out}
    _same(InstanceStatus.from_wire("i", **values), _by_init("i", values))


def test_built_parts_stay_frozen_and_copy_like_dataclasses():
    inst = InstanceStatus.from_wire("a", state=State.READY, kv_cache_usage=0.5, stalled=False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        inst.lifecycle.pid = 3  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        inst.name = "b"  # type: ignore[misc]
    moved = dataclasses.replace(inst.telemetry, kv_cache_usage=0.7)
    assert moved == TelemetryStatus(kv_cache_usage=0.7)
    assert inst.with_wire(kv_cache_usage=0.7).telemetry == moved
    assert json.loads(json.dumps(inst.to_json()))["kv_cache_usage"] == 0.5
    assert inst.stall == StallStatus(stalled=False)


def test_what_init_refuses_is_refused():
    with pytest.raises(TypeError, match="no key 'nope'"):
        InstanceStatus.from_wire("a", nope=1)
    with pytest.raises(TypeError, match="missing required"):
        snapshot_module._filled(LifecycleStatus, {"pid": 3})


def test_no_filled_part_has_what_only_init_would_run():
    # `_filled` copies defaults and never calls `__init__`: a `__post_init__` or a
    # `default_factory` on one of these parts would be skipped (give it one: this fails)
    for cls in snapshot_module._FILL:
        assert not hasattr(cls, "__post_init__"), cls
        for f in dataclasses.fields(cls):
            assert f.default_factory is dataclasses.MISSING, (cls, f.name)
