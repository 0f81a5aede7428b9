"""The state file: atomic writes, a backup of the last good one, corrupt files survived."""

from __future__ import annotations

import json
import os

from vsup.control.state import (
    DaemonState,
    InstanceRecord,
    StateFile,
    spec_from_dict,
    spec_to_dict,
)
from vsup.layout.spec import InstanceSpec, RestartPolicy


def make_spec(name: str = "a", port: int = 8000) -> InstanceSpec:
    return InstanceSpec(
        name=name,
        model="/models/tiny",
        command=("python", "-m", "vllm.entrypoints.openai.api_server"),
        host="127.0.0.1",
        port=port,
        gpus=(0, 1),
        gpu_memory_utilization=0.45,
        args={"max-model-len": 512, "enforce-eager": True, "compilation-config": {"mode": 3}},
        env={"VLLM_CPU_KVCACHE_SPACE": "1"},
        restart=RestartPolicy(policy="always", backoff_s=2.0),
        profiles=("cpu",),
    )


def make_state(pid: int = 4242) -> DaemonState:
    spec = make_spec()
    return DaemonState(
        layout_path="/srv/layout.toml",
        layout_toml='[layout]\nname = "x"\n',
        layout_name="x",
        instances={
            "a": InstanceRecord(
                name="a",
                spec=spec_to_dict(spec),
                state="ready",
                pid=pid,
                create_time=1.5e9,
                pgid=pid,
                port=8000,
                run=3,
                restarts=2,
                last_exit={
                    "code": 1,
                    "signal": None,
                    "reason": "oom",
                    "at": "t",
                    "log_excerpt": "x",
                },
            ),
            "b": InstanceRecord(
                name="b",
                spec=spec_to_dict(spec),
                state="failed",
                run=1,
                failed_why="processes of b outlived SIGKILL: 9 VLLM::Worker (D: ...)",
            ),
        },
    )


def test_spec_survives_the_round_trip_through_json():
    spec = make_spec()
    doc = json.loads(json.dumps(spec_to_dict(spec)))
    assert spec_from_dict(doc) == spec


def test_save_then_load_gives_back_the_same_state(tmp_path):
    sf = StateFile(tmp_path / "state.json")
    state = make_state()
    sf.save(state)
    loaded = sf.load()
    assert loaded.source == "state" and loaded.problem is None
    assert loaded.state.instances == state.instances
    assert loaded.state.layout_toml == state.layout_toml
    # No temp file is left behind.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


def test_second_save_keeps_the_previous_file_as_backup(tmp_path):
    sf = StateFile(tmp_path / "state.json")
    sf.save(make_state(pid=1))
    sf.save(make_state(pid=2))
    assert json.loads(sf.backup.read_text())["instances"]["a"]["pid"] == 1
    assert sf.load().state.instances["a"].pid == 2


def test_truncated_state_file_is_moved_aside_and_the_backup_used(tmp_path):
    sf = StateFile(tmp_path / "state.json")
    sf.save(make_state(pid=1))
    sf.save(make_state(pid=2))
    data = sf.path.read_bytes()
    sf.path.write_bytes(data[: len(data) // 2])  # a torn write
    result = sf.load()
    assert result.source == "backup"
    assert result.state.instances["a"].pid == 1
    assert result.problem is not None
    assert "unreadable" in result.problem and "using the backup" in result.problem
    assert result.moved_to is not None and result.moved_to.read_bytes() == data[: len(data) // 2]
    assert not sf.path.exists()


def test_garbage_with_no_backup_is_reported_not_raised(tmp_path):
    sf = StateFile(tmp_path / "state.json")
    sf.path.write_bytes(b"\x00\xffnot json")
    result = sf.load()
    assert result.state is None and result.source == "none"
    assert result.problem is not None
    assert "not JSON" in result.problem


def test_valid_json_of_the_wrong_shape_is_corrupt(tmp_path):
    sf = StateFile(tmp_path / "state.json")
    sf.path.write_text(json.dumps({"version": 1, "instances": {"a": {"pid": "12", "spec": {}}}}))
    result = sf.load()
    assert result.state is None
    assert result.problem is not None
    assert "instances.a" in result.problem or "'a'" in result.problem


def test_missing_state_with_backup_uses_backup(tmp_path):
    sf = StateFile(tmp_path / "state.json")
    sf.save(make_state(pid=1))
    sf.save(make_state(pid=2))
    os.unlink(sf.path)
    result = sf.load()
    assert result.source == "backup" and result.state.instances["a"].pid == 1


def test_nothing_on_disk_is_a_clean_start(tmp_path):
    result = StateFile(tmp_path / "state.json").load()
    assert result.state is None and result.problem is None and result.source == "none"
