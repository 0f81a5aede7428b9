"""Issue 20 on the dashboard: a healthy H200 instance above its share by vLLM's own overhead
raises no alarm, and vLLM's start-up progress bars show once each, at their last state."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from vsup.control.advice import AdviceInputs, compute_advice
from vsup.logtext import bar_state
from vsup.snapshot import GpuProcess, GpuStatus, StatusSnapshot
from vsup.telemetry.logwatch import scan_log
from vsup.tui.screens.logs import LogScreen
from vsup.tui.widgets.gpus import GpuPanel
from vsup.tui.widgets.header import NodeHeader
from vsup.tui.widgets.instances import InstanceTable
from vsup.tui.widgets.livelog import LiveLog

from tests.support import samples
from tests.tui.conftest import make_app, make_client, settle

FIXTURE = Path(__file__).parents[1] / "fixtures" / "vllm-0.26-cuda" / "startup.log"
MiB = 1024**2
H200 = 143771 * MiB  # what NVML reported on an H200


def h200_pair(held_b: int = 66142 * MiB) -> StatusSnapshot:
    """Two instances at 0.45 of one H200 (the issue's setup) with the real run's figures: held
    66142 MiB, the memory parts its log gave; advice computed by the daemon's rules."""
    memory = scan_log(FIXTURE).memory.profile()
    assert memory is not None
    parts: dict[str, Any] = memory.fields()  # replace() checks each key against its field
    base = samples.gpu_node()
    template = base.instances[0]
    instances = []
    for name, port, pid, held in (("a", 8011, 746, 66142 * MiB), ("b", 8012, 901, held_b)):
        instances.append(
            template.with_wire(
                name=name,
                port=port,
                pid=pid,
                gpus=(0,),
                hbm_bytes=held,
                hbm_source="process",
                planned_hbm_bytes=int(0.45 * H200),
                gpu_memory_utilization=0.45,
                hbm_start_bytes=66142 * MiB,
                **parts,
            )
        )
    gpu = GpuStatus(
        0,
        "NVIDIA H200",
        H200,
        sum(i.memory.hbm_bytes or 0 for i in instances) + 600 * MiB,
        91.0,
        60.0,
        510.0,
        processes=tuple(
            GpuProcess(i.lifecycle.pid or 0, i.memory.hbm_bytes or 0, i.name) for i in instances
        ),
    )
    advice = compute_advice(instances, [gpu], AdviceInputs(recent_failures={}))
    node = dataclasses.replace(base.node, gpu_count=1)
    return StatusSnapshot(base.supervisor, node, (gpu,), tuple(instances), advice)


def _plain(widget) -> str:
    content = widget.content
    return getattr(content, "plain", str(content))


async def test_healthy_h200_instances_raise_no_over_plan_alarm():
    snap = h200_pair()
    assert snap.advice == ()
    app = make_app(make_client(snap))
    async with app.run_test(size=(160, 45)) as pilot:
        await settle(pilot, lambda: app.renders == 1)
        cells = app.screen.query_one(InstanceTable)._rows
        assert all(not row[6][0].startswith("▲") for row in cells.values())
        assert "64.6/63.2G" in cells["a"][6][0]
        assert "over plan" not in _plain(app.screen.query_one(GpuPanel))
        assert "no alerts" in _plain(app.screen.query_one(NodeHeader))


async def test_real_drift_is_flagged_with_the_advice():
    snap = h200_pair(held_b=70 * 1024 * MiB)
    assert [a.instance for a in snap.advice] == ["b"]
    app = make_app(make_client(snap))
    async with app.run_test(size=(160, 45)) as pilot:
        await settle(pilot, lambda: app.renders == 1)
        cells = app.screen.query_one(InstanceTable)._rows
        assert cells["b"][6][0].startswith("▲") and not cells["a"][6][0].startswith("▲")
        assert "b 70.0/63.2 ▲over plan" in _plain(app.screen.query_one(GpuPanel))
        assert "1 alert" in _plain(app.screen.query_one(NodeHeader))
        await pilot.press("down")
        await settle(pilot, lambda: app.selected == "b")
        side = app.screen.query_one("#advice")
        assert "b: holds 70.0 GiB HBM" in _plain(side) and "grew by" in _plain(side)
        memory = _plain(app.screen.query_one("#memory"))
        assert "vLLM memory target 62.91" in memory and "non-torch 0.22" in memory


def _bars(lines, desc):
    return [line for line in lines if (s := bar_state(line)) is not None and s.desc == desc]


def startup_part() -> str:
    """The fixture up to readiness (a capture may go on with load and shutdown, past the
    dashboard's 16 KiB tail)."""
    text = FIXTURE.read_bytes().decode()
    end = text.index("\n", text.index("Application startup complete.")) + 1
    return text[:end]


async def test_log_pane_and_full_log_show_each_startup_bar_once():
    log_text = startup_part()
    snap = h200_pair()
    client = make_client(snap, logs_current={"a": log_text, "b": log_text})
    app = make_app(client)
    async with app.run_test(size=(160, 45)) as pilot:
        await settle(pilot, lambda: app.renders == 1)
        tail = app.screen.query_one("#log-tail", LiveLog)
        await settle(pilot, lambda: any("Application startup complete" in x for x in tail.lines))
        for desc in ("Capturing CUDA graphs (PIECEWISE)", "Capturing CUDA graphs (FULL)"):
            assert len(_bars(tail.lines, desc)) == 1
            assert "51/51" in _bars(tail.lines, desc)[0]
        await pilot.press("l")
        await settle(pilot, lambda: isinstance(app.screen, LogScreen))
        full = app.screen.query_one("#log-full", LiveLog)
        await settle(pilot, lambda: any("Application startup complete" in x for x in full.lines))
        assert len(_bars(full.lines, "Loading safetensors checkpoint shards")) == 1
        assert len(full.lines) < log_text.count("\n") + log_text.count("\r")


async def test_a_bar_growing_between_polls_is_redrawn_in_place():
    snap = h200_pair()
    start = "(EngineCore pid=746) INFO 12-01 00:54:34 [cutedsl_warmup.py:101] Skipping\n"
    client = make_client(snap, logs_current={"a": start, "b": start})
    app = make_app(client)
    async with app.run_test(size=(160, 45)) as pilot:
        await settle(pilot, lambda: app.renders == 1)
        tail = app.screen.query_one("#log-tail", LiveLog)
        await settle(pilot, lambda: tail.line_count == 1)
        for n in (0, 17, 34, 51):
            client.logs_current["a"] += (
                "(EngineCore pid=746) " if n == 0 else ""
            ) + f"\rCapturing CUDA graphs (FULL): {n * 100 // 51:3d}%|  | {n}/51 [00:01<00:01]"
            app.tick()
            await settle(pilot, lambda n=n: any(f" {n}/51" in x for x in tail.lines))
            assert tail.line_count == 2
        client.logs_current["a"] += "\n(EngineCore pid=746) INFO Graph capturing finished\n"
        app.tick()
        await settle(pilot, lambda: tail.line_count == 3)
        assert "51/51" in tail.lines[1] and "Graph capturing" in tail.lines[2]
