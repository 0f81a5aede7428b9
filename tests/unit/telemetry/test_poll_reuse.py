"""What the daemon's poll no longer does again when nothing changed (docs/benchmarks.md,
2026-12-06, later still): a run log with nothing new is not opened, and a scraped cache config
is copied once per page shape, while what each reads stays the same."""

from __future__ import annotations

import builtins
from pathlib import Path

import pytest

from vsup.telemetry import logwatch
from vsup.telemetry.instance import InstanceTelemetry
from vsup.telemetry.logwatch import LogWatcher
from vsup.telemetry.metrics import parse_metrics
from vsup.telemetry.scrape import ScrapeResult

from tests.support.clock import FakeClock

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "vllm-0.32-cpu"


def test_a_log_with_nothing_new_is_not_opened(tmp_path: Path, monkeypatch) -> None:
    log = tmp_path / "run1.log"
    log.write_bytes(b"INFO one\nINFO two\n")
    watcher = LogWatcher(log)
    assert watcher.poll().new_lines == ("INFO one", "INFO two")
    opened: list[object] = []

    def spy(*args, **kwargs):
        opened.append(args[0])
        return builtins.open(*args, **kwargs)

    monkeypatch.setattr(logwatch, "open", spy, raising=False)
    for _ in range(3):
        update = watcher.poll()
        assert (update.new_lines, update.bytes_read, update.restarted) == ((), 0, False)
        assert update.offset == log.stat().st_size
    assert opened == [], "a log that did not grow was opened each poll"
    with log.open("ab") as f:
        f.write(b"INFO three\n")
    assert watcher.poll().new_lines == ("INFO three",)
    assert len(opened) == 1
    # shrunk (replaced): read again from its start, as before
    log.write_bytes(b"new\n")
    update = watcher.poll()
    assert (update.new_lines, update.restarted) == (("new",), True)
    log.unlink()
    assert watcher.poll().bytes_read == 0  # a missing file: nothing new


def ok(text: str) -> ScrapeResult:
    return ScrapeResult("http://x/metrics", True, parse_metrics(text), status=200)


def test_a_cache_config_is_copied_once_per_page_shape_and_follows_a_new_one() -> None:
    text = (FIX / "metrics_load.txt").read_text()
    # the same shape, other values: read by the page's shape (its cache config shared)
    later = (FIX / "metrics_load_next.txt").read_text()
    clock = FakeClock()
    tel = InstanceTelemetry(clock, platform="cpu")
    tel.start_run(1, None)
    tel.observe(ok(text))
    tel.observe(ok(text))  # the shape is learned from the first page: known from here on
    first = tel.cache_config
    assert first is not None and first["num_gpu_blocks"] == "6"
    clock.advance(1.0)
    tel.observe(ok(later))
    assert tel.cache_config is first, "the same shape's config was copied again"
    assert tel.cache_config == dict(parse_metrics(later).cache_config or {})
    # another cache config (vLLM restarted with more blocks): the new labels are shown
    other = text.replace('num_gpu_blocks="6"', 'num_gpu_blocks="9"')
    assert other != text
    clock.advance(1.0)
    tel.observe(ok(other))
    assert tel.cache_config is not None and tel.cache_config["num_gpu_blocks"] == "9"
    # a new run forgets it
    tel.start_run(2, None)
    assert tel.cache_config is None
    clock.advance(1.0)
    tel.observe(ok(text))
    assert tel.cache_config == first


@pytest.mark.parametrize("name", ["metrics_load.txt"])
def test_the_fixture_pages_share_a_shape(name: str) -> None:
    text = (FIX / name).read_text()
    parse_metrics(text)  # learns the shape
    a, b = parse_metrics(text), parse_metrics(text)
    assert a.cache_config is b.cache_config  # what the copy-once test relies on
