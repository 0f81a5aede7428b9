"""The API server's start time read off a page (metrics._start_time, whose plain lines skip
the full sample parser) reads what the full parser reads, and nothing it refuses."""

from __future__ import annotations

import math

import pytest

from vsup.telemetry.metrics import _start_time
from vsup.telemetry.promtext import parse_sample


@pytest.mark.parametrize(
    "line",
    [
        "process_start_time_seconds 1.76412345678e+09",
        "process_start_time_seconds 1764123456.78",
        "process_start_time_seconds 1764123456",
        "process_start_time_seconds 1764123456.78 1764123457000",
        'process_start_time_seconds{pid="1"} 12.5',
        "process_start_time_seconds 1_000",
        "process_start_time_seconds 1.2.3",
        "process_start_time_seconds NaN",
        "process_start_time_seconds +Inf",
        "process_start_time_seconds  12",
        "process_start_time_seconds",
    ],
)
def test_the_start_time_is_what_the_full_parser_reads(line: str) -> None:
    try:
        sample = parse_sample(line)
        want = sample.value if math.isfinite(sample.value) else None
    except ValueError:
        want = None
    assert _start_time(f"# HELP x\n{line}\r\nvllm:a 1\n") == want
    assert _start_time(line) == want
