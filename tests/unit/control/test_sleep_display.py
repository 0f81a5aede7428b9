"""Sleep mode as `vsup status` prints it and Prometheus scrapes it (issue 27), from status JSON:
a sleeper stays `ready` (alive, healthy) and reads as asleep beside it; its level, group,
durations, what it keeps and a failed wake are in its detail line and in `vsup_instance_sleep_*`.
"""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from vsup.commands.status import render as render_status
from vsup.control.export import render as render_metrics
from vsup.snapshot import NodeInfo, StatusSnapshot, SupervisorInfo, empty_instance

GiB = 1024**3
ERROR = "/wake_up answered 500: CUDA out of memory"


def doc() -> dict:
    """Status JSON of a swap group on GPU 0 (a awake, b asleep), c waking after a failed
    wake, d on its way to sleep, e without sleep mode."""
    snap = StatusSnapshot(
        supervisor=SupervisorInfo(pid=77, version="0.1.0", uptime_s=65, layout="swap"),
        node=NodeInfo("n", "nvidia", 1),
        gpus=(),
        instances=tuple(
            empty_instance(
                name,
                state="ready",
                pid=100 + n,
                port=8000 + n,
                gpus=(0,),
                restarts=0,
                uptime_s=600,
                hbm_bytes=hbm,
                hbm_source="process",
            )
            for n, (name, hbm) in enumerate(
                [("a", 120 * GiB), ("b", int(1.7 * GiB)), ("c", 30 * GiB), ("d", 120 * GiB)]
                + [("e", 10 * GiB)]
            )
        ),
    ).to_json()
    sleep = {
        "a": {
            "state": "awake",
            "level": 1,
            "group": "g0",
            "since_s": 95.0,
            "last_sleep_s": 1.24,
            "last_wake_s": 0.91,
            "idle_sleep_in_s": 205.0,
        },
        "b": {
            "state": "asleep",
            "level": 1,
            "group": "g0",
            "since_s": 95.0,
            "last_sleep_s": 1.31,
            "last_wake_s": 0.88,
            "held_bytes": int(1.7 * GiB),
        },
        "c": {"state": "waking", "level": 2, "group": "g1", "since_s": 2.0, "error": ERROR},
        "d": {"state": "falling_asleep", "level": 2, "since_s": 0.4},
    }
    for inst in snap["instances"]:
        inst["sleep"] = sleep.get(inst["name"])
    return snap


def _row(text: str, name: str) -> str:
    return next(line for line in text.splitlines() if line.split(" ", 1)[0] == name)


def test_status_table_reads_a_sleeper_as_such_beside_its_ready_state():
    text = render_status(doc())
    assert "5/5 ready" in text.splitlines()[0], "a sleeper is a live, healthy server"
    assert " ready (asleep L1) " in _row(text, "b")
    assert " ready (waking) " in _row(text, "c")
    assert " ready (falling asleep) " in _row(text, "d")
    assert "(" not in _row(text, "a").split("ready", 1)[1].split()[0], "awake: plain ready"
    assert "1.7G" in _row(text, "b").split()
    assert "sleep" not in " ".join(line for line in text.splitlines() if line.startswith("e"))


def test_status_prints_each_sleep_mode_instances_detail():
    lines = render_status(doc()).splitlines()
    assert (
        "b: sleep mode, asleep for 1m35s · level 1 (weights in host RAM) · swap group g0 · "
        "last sleep 1.3s, wake 0.9s · keeps 1.7 GiB of GPU memory"
    ) in lines
    assert (
        "a: sleep mode, awake for 1m35s · level 1 (weights in host RAM) · swap group g0 · "
        "last sleep 1.2s, wake 0.9s · idle sleep in 3m25s"
    ) in lines
    assert (
        "c: sleep mode, waking for 2.0s · level 2 (weights dropped) · swap group g1 · "
        f"last error: {ERROR}"
    ) in lines
    assert not any(line.startswith("e: sleep") for line in lines)


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        assert fam.name.startswith("vsup_") and fam.documentation
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_prometheus_exports_the_sleep_state_level_and_durations():
    got = _samples(render_metrics(StatusSnapshot.from_json(doc())).decode())

    def state(name: str) -> dict[str, float]:
        return {
            labels[1][1]: v
            for (metric, labels), v in got.items()
            if metric == "vsup_instance_sleep_state" and labels[0] == ("name", name)
        }

    assert state("b") == {"awake": 0, "falling_asleep": 0, "asleep": 1, "waking": 0, "unknown": 0}
    assert state("a") == {"awake": 1, "falling_asleep": 0, "asleep": 0, "waking": 0, "unknown": 0}
    assert state("d")["falling_asleep"] == 1 and state("c")["waking"] == 1
    assert state("e") == {}, "no sleep mode: no sleep series"
    assert got[("vsup_instance_state", (("name", "b"), ("state", "ready")))] == 1
    assert got[("vsup_instance_sleep_level", (("name", "b"),))] == 1
    assert got[("vsup_instance_sleep_level", (("name", "c"),))] == 2
    assert got[("vsup_instance_sleep_last_sleep_seconds", (("name", "b"),))] == 1.31
    assert got[("vsup_instance_sleep_last_wake_seconds", (("name", "b"),))] == 0.88
    assert got[("vsup_instance_sleep_held_bytes", (("name", "b"),))] == int(1.7 * GiB)
    assert got[("vsup_instance_sleep_state_seconds", (("name", "b"),))] == 95.0
    assert got[("vsup_instance_sleep_idle_seconds_remaining", (("name", "a"),))] == 205.0
    assert got[("vsup_instance_sleep_failed", (("name", "c"),))] == 1
    assert got[("vsup_instance_sleep_failed", (("name", "b"),))] == 0
    # unknown values are left out, never a made-up 0
    assert ("vsup_instance_sleep_last_wake_seconds", (("name", "c"),)) not in got
    assert ("vsup_instance_sleep_held_bytes", (("name", "a"),)) not in got
    assert ("vsup_instance_sleep_level", (("name", "e"),)) not in got
