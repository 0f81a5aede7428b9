"""parse_metrics by a page's shape: a server writes the same sample heads (names and label
sets) every scrape and only the values move, so what depends on the labels alone is worked
out once per shape (telemetry/metrics.py, `_SHAPES`). A page of a known shape must read the
same as the line-by-line reading (`_parse_lines`, which test_metrics.py holds to
prometheus_client) whatever its values: NaN, infinities, timestamps, underscores, garbage."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vsup.telemetry import metrics as M
from vsup.telemetry import promtext
from vsup.telemetry.metrics import parse_metrics

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "vllm-0.32-cpu"
PAGES = [
    "metrics_idle.txt",
    "metrics_load.txt",
    "metrics_load_next.txt",
    "metrics_load_legacy_names.txt",
    "metrics_sleep_in_flight.txt",
    "dp2/metrics_dp_idle.txt",
    "dp2/metrics_dp1_frozen_idle.txt",
    "dp2/metrics_dp1_frozen_load.txt",
]
# a wanted sample line's value (and timestamp): what follows its head
_VALUE = re.compile(r"^(vllm:[a-z_:]+(?:\{.*\})?)([ \t].*)$", re.M)


def same(a: M.VllmMetrics, b: M.VllmMetrics) -> bool:
    """Equal, NaN included (repr writes every field, nan as nan)."""
    return repr(a) == repr(b)


def with_values(text: str, values: list[str]) -> str:
    """`text` with its wanted lines' values replaced, in turn, by `values` (cycled)."""
    it = iter(values * 1000)
    return _VALUE.sub(lambda m: m.group(1) + next(it), text)


@pytest.fixture(autouse=True)
def no_shapes_known():
    M._SHAPES.clear()
    yield
    M._SHAPES.clear()


@pytest.mark.parametrize("name", PAGES)
def test_a_page_of_a_known_shape_reads_as_line_by_line(name: str) -> None:
    text = (FIX / name).read_text()
    first = parse_metrics(text)
    assert same(first, M._parse_lines(text))
    assert M._SHAPES, "a clean page's shape is remembered"
    moved = with_values(text, [" 7", " 0.25", " 3e2", "\t12", " 1.5 1700000000000"])
    assert same(parse_metrics(moved), M._parse_lines(moved))


def test_a_known_shape_reads_the_values_without_parsing_a_label_set_again(monkeypatch) -> None:
    """What the shape saves: the second page of a server is read with `float()` alone."""
    text = (FIX / "metrics_load.txt").read_text()
    parse_metrics(text)
    moved = with_values(text, [" 5", " 0.5"])
    want = M._parse_lines(moved)

    def refused(*_a: object, **_k: object) -> object:
        raise AssertionError("a label set was parsed again")

    monkeypatch.setattr(M, "_sample", refused)
    monkeypatch.setattr(promtext, "parse_labels", refused)
    assert same(parse_metrics(moved), want)
    assert parse_metrics(moved).generation_tokens_total == want.generation_tokens_total


def test_values_the_shape_cannot_read_go_line_by_line() -> None:
    text = (FIX / "metrics_load.txt").read_text()
    parse_metrics(text)
    for odd in ([" 1_000"], [" x"], [" 1 2 3"], [""], [" NaN", " +Inf", " -Inf"]):
        moved = with_values(text, odd)
        got = parse_metrics(moved)
        assert same(got, M._parse_lines(moved)), odd
    assert parse_metrics(with_values(text, [" 1_000"])).bad_lines > 0


def test_a_page_with_bad_lines_or_odd_values_teaches_no_shape() -> None:
    text = (FIX / "metrics_load.txt").read_text()
    parse_metrics(with_values(text, [" 1_0"]))  # underscores: bad lines
    parse_metrics(with_values(text, [" 1 2 3"]))
    assert not M._SHAPES


REAL = (FIX / "metrics_load.txt").read_text().splitlines()
DP = (FIX / "dp2" / "metrics_dp1_frozen_load.txt").read_text().splitlines()
WANTED = [ln for ln in REAL + DP if _VALUE.match(ln)]
TRICKY = [
    'vllm:kv_cache_usage_perc{engine="7",model_name="a \\"q\\", b}"} 0.5',
    'vllm:num_requests_running{engine="7",model_name="x\\ny"} 1e0',
    'vllm:num_requests_waiting{ engine = "7" , model_name="m", } 2',
    'vllm:cache_config_info{block_size="16",engine="7",num_gpu_blocks="10"} 1.0',
    'vllm:engine_sleep_state{engine="7",sleep_state="awake"} 0',
    'vllm:engine_sleep_state{engine="7",sleep_state="discard_all"} 1',
    'vllm:sleep_mode_operations_in_flight{operation="wake"} 1',
    "vllm:num_requests_running 3",
    'vllm:num_requests_running{engine="7"}4',
    'vllm:num_requests_running{engine="7" 4',
    "process_start_time_seconds 1.7e9",
]
VALUES = st.sampled_from(
    [" 0", " 1", " 2.5", " 1e3", "\t4", " 7 1700000000", " NaN", " +Inf", " -Inf", " 1_0", " x"]
)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from(WANTED + TRICKY), min_size=1, max_size=40),
    st.lists(VALUES, min_size=1, max_size=12),
)
def test_any_page_read_twice_reads_as_line_by_line(lines: list[str], values: list[str]) -> None:
    """The first reading may teach the shape; the second page (the same heads, other values)
    is then read by it, or line by line where it cannot be: the same figures either way."""
    M._SHAPES.clear()
    text = "\n".join(lines) + "\n"
    assert same(parse_metrics(text), M._parse_lines(text))
    moved = with_values(text, values)
    assert same(parse_metrics(moved), M._parse_lines(moved))
