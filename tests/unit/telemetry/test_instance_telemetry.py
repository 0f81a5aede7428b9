"""InstanceTelemetry: the per-instance state the daemon holds, driven by a fake clock."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from vsup.snapshot import empty_instance
from vsup.telemetry.hbm import HbmFigure
from vsup.telemetry.instance import InstanceTelemetry
from vsup.telemetry.metrics import EMPTY, parse_metrics
from vsup.telemetry.scrape import ScrapeResult

from tests.support.clock import FakeClock

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "vllm-0.32-cpu"
LOAD = parse_metrics((FIX / "metrics_load.txt").read_text())
NEXT_TEXT = (FIX / "metrics_load_next.txt").read_text()
NEXT = parse_metrics(NEXT_TEXT)
DT = float(NEXT_TEXT.splitlines()[0].split()[-1])


def ok(metrics) -> ScrapeResult:
    return ScrapeResult("http://x/metrics", True, metrics, status=200)


FAILED = ScrapeResult("http://x/metrics", False, EMPTY, error="http://x/metrics: refused")


def test_fields_fill_the_snapshot_from_scrapes_log_and_hbm(tmp_path: Path) -> None:
    log = tmp_path / "run1.log"
    log.write_bytes((FIX / "load.log").read_bytes())
    clock = FakeClock()
    tel = InstanceTelemetry(clock, platform="cpu")
    tel.start_run(1, log)
    tel.poll_log()
    tel.observe(ok(LOAD))
    clock.advance(DT)
    tel.observe(ok(NEXT))
    status = empty_instance("a", state="ready").with_wire(
        **tel.fields(HbmFigure(None, "unavailable"))
    )
    assert status.telemetry.kv_cache_usage == NEXT.kv_cache_usage
    assert status.telemetry.preemptions_total == 6.0 and status.telemetry.kv_capacity_tokens == 768
    assert status.telemetry.preemptions_per_min == pytest.approx(4 / DT * 60)
    assert NEXT.generation_tokens_total is not None
    assert LOAD.generation_tokens_total is not None
    assert status.telemetry.generation_tokens_per_s == pytest.approx(
        (NEXT.generation_tokens_total - LOAD.generation_tokens_total) / DT
    )
    assert (status.telemetry.backend, status.telemetry.backend_source) == ("CPU_ATTN", "default")
    assert tel.cache_config is not None
    assert tel.cache_config["num_gpu_blocks"] == "6"
    assert "Application startup complete." in tel.log_tail


def test_a_failed_scrape_keeps_the_last_figures_only_briefly() -> None:
    clock = FakeClock()
    tel = InstanceTelemetry(clock, stale_after_s=5)
    tel.start_run(1, None)
    tel.observe(ok(LOAD))
    clock.advance(1)
    tel.observe(FAILED)
    assert tel.fields()["kv_cache_usage"] == LOAD.kv_cache_usage
    assert tel.last_error == "http://x/metrics: refused"
    clock.advance(5)
    tel.observe(FAILED)
    fields = tel.fields()
    assert fields["kv_cache_usage"] is None and fields["preemptions_total"] is None
    assert fields["generation_tokens_per_s"] is None


def test_history_has_a_point_per_scrape_with_gaps_for_failures() -> None:
    clock = FakeClock()
    tel = InstanceTelemetry(clock, stale_after_s=0.5)
    tel.start_run(1, None)
    tel.observe(ok(LOAD))
    clock.advance(1)
    tel.observe(FAILED)
    clock.advance(1)
    tel.observe(ok(NEXT))
    doc = tel.history_json()
    assert doc["kv_cache_usage"] == [LOAD.kv_cache_usage, None, NEXT.kv_cache_usage]
    assert doc["t"] == [clock.wall() - 2, clock.wall() - 1, clock.wall()]


def test_a_new_run_resets_the_counters_through_the_run_number() -> None:
    clock = FakeClock()
    tel = InstanceTelemetry(clock)
    tel.start_run(1, None)
    tel.observe(ok(NEXT))  # 6 preemptions
    clock.advance(1)
    tel.start_run(2, None)
    restarted = replace(LOAD, process_start_time_s=None)  # 2 preemptions in the new run
    tel.observe(ok(restarted))
    # the new run's 2 count as new increase; never a negative rate
    assert tel.fields()["preemptions_per_min"] == pytest.approx(120.0)


def test_stopped_instances_show_nothing_current_but_keep_history() -> None:
    clock = FakeClock()
    tel = InstanceTelemetry(clock, attention_backend="TRITON_ATTN")
    tel.start_run(1, None)
    tel.observe(ok(LOAD))
    tel.stopped()
    fields = tel.fields()
    assert fields["kv_cache_usage"] is None and fields["preemptions_per_min"] is None
    assert (fields["backend"], fields["backend_source"]) == ("Triton unified", "flag")
    assert len(tel.history_json()["t"]) == 1


def test_an_idle_server_rests_until_its_health_says_otherwise_or_it_stops() -> None:
    idle = parse_metrics((FIX / "metrics_idle.txt").read_text())
    clock = FakeClock()
    tel = InstanceTelemetry(clock, platform="cpu")
    tel.start_run(1, None)
    for _ in range(4):
        clock.advance(1.0)
        tel.observe(replace(ok(idle), server_load=0, health_status=200))
    assert tel.rest.at_rest
    # the same frozen figures with a 503 from /health (the engine died): not at rest
    tel.observe(replace(ok(idle), server_load=0, health_status=503))
    assert not tel.rest.at_rest
    for _ in range(4):
        tel.observe(replace(ok(idle), server_load=0, health_status=200))
    assert tel.rest.at_rest
    tel.stopped()
    assert not tel.rest.at_rest
    tel.start_run(2, None)
    assert not tel.rest.at_rest
