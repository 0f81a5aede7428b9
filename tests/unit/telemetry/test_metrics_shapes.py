"""The compiled reading of a known page shape (telemetry/metrics.py, `_Shape`, `_reader`): a
page whose heads (names and label sets) were seen before is read by sums over the positions of
its values, compiled once per shape. That reading must give exactly what the line-by-line
reading (`_parse_lines`) gives for the same page, whatever the values: random, 0 and -0.0,
huge, NaN and infinities (those go through `read_rows`), with several engines, legacy names
and every sleep state. Pages are compared by repr, which writes every field and tells NaN
and -0.0 apart (== would not)."""

from __future__ import annotations

import dataclasses
import math
import random
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vsup.telemetry import metrics as M
from vsup.telemetry import promtext
from vsup.telemetry.metrics import parse_metrics

from tests.unit.telemetry.test_metrics_shape import _VALUE, same, with_values

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
PAGES = sorted(p.relative_to(FIXTURES).as_posix() for p in FIXTURES.glob("**/metrics*.txt"))
EMULATOR = FIXTURES / "filtered" / "metrics_emulator.txt"


def random_values(rng: random.Random, n: int = 60, huge: bool = True) -> list[str]:
    """Finite values of every kind a counter or gauge may take, and some it should not
    (`huge`: near the largest float, whose sums may overflow)."""
    kinds = [
        lambda: f" {rng.randint(0, 10**6)}.0",
        lambda: f" {rng.random()!r}",
        lambda: f" {rng.uniform(-1e6, 1e6)!r}",
        lambda: f" {rng.choice([0, 1, 2])}",
        lambda: " -0.0",
        lambda: (
            f" {rng.choice(['1e308', '-1e308', '1.7976931348623157e308'] if huge else ['5e-324'])}"
        ),
        lambda: f" {rng.randint(0, 2**60)}",
    ]
    return [rng.choice(kinds)() for _ in range(n)]


def compiled(text: str) -> bool:
    """Whether a page of a known shape is read by the compiled reader: its values plain
    numbers whose sum is finite (a huge value's may overflow: `read_rows` then)."""
    values = M._plain_values(tuple(rest for _n, _h, rest in M._split_lines(text)))
    return values is not None and math.isfinite(sum(values))


def shape_of(text: str) -> M._Shape | None:
    names, heads, _rests = zip(*M._split_lines(text), strict=True)
    return M._SHAPES.get((names, heads))


class Counted:
    """A shape's compiled reader, counting its calls: proof that a page went through it."""

    def __init__(self, shape: M._Shape) -> None:
        self.inner = shape.finite
        self.calls = 0
        shape.finite = self

    def __call__(self, values: list[float], start: float | None) -> M.VllmMetrics:
        self.calls += 1
        return self.inner(values, start)


def learn(text: str) -> M._Shape:
    """Read `text` until its shape is known and its checks are done (`_CHECKS` pages read
    both ways): from then on its pages are read by the compiled reader alone."""
    for _ in range(M._CHECKS + 1):
        assert same(parse_metrics(text), M._parse_lines(text))
    shape = shape_of(text)
    assert shape is not None and shape.checks_left == 0
    return shape


@pytest.fixture(autouse=True)
def no_shapes_known():
    M._SHAPES.clear()
    yield
    M._SHAPES.clear()


@pytest.mark.parametrize("name", PAGES)
def test_every_captured_page_reads_the_same_compiled(name: str) -> None:
    text = (FIXTURES / name).read_text()
    shape = learn(text)
    reader = Counted(shape)
    rng = random.Random(name)
    pages = [with_values(text, random_values(rng, huge=k % 2 == 0)) for k in range(20)]
    for moved in pages:
        assert same(parse_metrics(moved), M._parse_lines(moved)), moved
    assert reader.calls == sum(map(compiled, pages)) >= 10
    assert shape.checks_left == 0  # the two readings never differed


@pytest.mark.parametrize("name", PAGES)
def test_the_checks_pass_on_moved_values_too(name: str) -> None:
    """The pages a shape is on trial with (`_checked`) have values the first did not."""
    text = (FIXTURES / name).read_text()
    parse_metrics(text)
    rng = random.Random(name + "checks")
    for _ in range(M._CHECKS + 2):
        moved = with_values(text, random_values(rng, huge=False))
        assert same(parse_metrics(moved), M._parse_lines(moved))
    shape = shape_of(text)
    assert shape is not None and shape.checks_left == 0


ODD = [
    [" 0"],
    [" -0.0"],
    [" 1e308"],  # their sums overflow: not finite, read_rows
    [" NaN"],
    [" +Inf"],
    [" -Inf"],
    [" 3", " NaN", " 0"],
    [" 1", " +Inf", " 2", " -Inf"],
    [" nan", " inf", " -inf", " 0"],
]


@pytest.mark.parametrize(
    "name", ["filtered/metrics_emulator.txt", "vllm-0.32-cpu/dp2/metrics_dp1_frozen_load.txt"]
)
@pytest.mark.parametrize("values", ODD, ids=lambda v: "".join(v))
def test_zero_huge_and_non_finite_values_read_the_same(name: str, values: list[str]) -> None:
    text = (FIXTURES / name).read_text()
    learn(text)
    moved = with_values(text, values)
    assert same(parse_metrics(moved), M._parse_lines(moved))
    shape = shape_of(text)
    assert shape is not None and shape.checks_left == 0


@pytest.mark.parametrize("odd", [[" 1_000"], [" x"], [" 7 1700000000000"], [""], [" 0x10"]])
def test_a_known_shape_with_values_that_are_not_plain_numbers_reads_line_by_line(
    odd: list[str],
) -> None:
    text = EMULATOR.read_text()
    shape = learn(text)
    reader = Counted(shape)
    moved = with_values(text, odd)
    assert same(parse_metrics(moved), M._parse_lines(moved))
    assert reader.calls == 0
    # and the shape is still read compiled after it
    assert same(parse_metrics(text), M._parse_lines(text))
    assert reader.calls == 1


def test_a_first_page_with_non_finite_values_puts_the_compiled_reading_on_trial_later() -> None:
    """Such a page teaches the shape through `read_rows` (its figures skip what is not finite,
    so they equal the line-by-line ones); the compiled reader is first held to the general
    rules by the finite pages after it."""
    text = EMULATOR.read_text()
    for values in ([" NaN"], [" +Inf", " 1"]):
        M._SHAPES.clear()
        odd = with_values(text, values)
        assert same(parse_metrics(odd), M._parse_lines(odd))
        shape = shape_of(text)
        assert shape is not None and shape.checks_left == M._CHECKS
        assert same(parse_metrics(odd), M._parse_lines(odd))
        assert shape.checks_left == M._CHECKS
        for _ in range(M._CHECKS):
            assert same(parse_metrics(text), M._parse_lines(text))
        assert shape.checks_left == 0


def test_a_compiled_reading_that_differs_is_dropped_for_the_general_one(monkeypatch) -> None:
    """Never seen; if it were, the page on trial reads as the general rules say, and so does
    every later page of the shape."""
    text = EMULATOR.read_text()
    parse_metrics(text)
    shape = shape_of(text)
    assert shape is not None
    monkeypatch.setattr(shape, "finite", lambda _v, _s: M.EMPTY)
    moved = with_values(text, [" 3"])
    assert same(parse_metrics(moved), M._parse_lines(moved))
    assert shape.checks_left == -1
    assert same(parse_metrics(text), M._parse_lines(text))


def test_the_compiled_result_is_a_true_vllm_metrics() -> None:
    """`_made` builds VllmMetrics and EngineFigures without `__init__`: every field there, the
    same value as the constructor's, and still frozen."""
    text = EMULATOR.read_text()
    learn(text)
    m = parse_metrics(text)
    names = [f.name for f in dataclasses.fields(M.VllmMetrics)]
    assert list(vars(m)) == names
    assert m == M.VllmMetrics(**vars(m)) and repr(m) == repr(M.VllmMetrics(**vars(m)))
    fig = m.per_engine["0"]
    assert list(vars(fig)) == [f.name for f in dataclasses.fields(M.EngineFigures)]
    assert repr(fig) == repr(M.EngineFigures(**vars(fig)))
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.requests_running = 1.0  # type: ignore[misc]
    # each page its own object
    assert parse_metrics(text) is not m


def page(lines: list[str]) -> str:
    return "# HELP x y\n" + "\n".join(lines) + "\n"


def engine_lines(e: str, *, config: bool = True, tokens: int = 100) -> list[str]:
    lines = [
        f'vllm:num_requests_running{{engine="{e}",model_name="m"}} 1',
        f'vllm:num_requests_waiting{{engine="{e}",model_name="m"}} 2',
        f'vllm:kv_cache_usage_perc{{engine="{e}",model_name="m"}} 0.5',
        f'vllm:prompt_tokens_total{{engine="{e}",model_name="m"}} 10',
        f'vllm:generation_tokens_total{{engine="{e}",model_name="m"}} 20',
        f'vllm:request_success_total{{engine="{e}",finished_reason="stop",model_name="m"}} 3',
        f'vllm:request_success_total{{engine="{e}",finished_reason="length",model_name="m"}} 4',
        f'vllm:num_preemptions_total{{engine="{e}",model_name="m"}} 0',
        f'vllm:prefix_cache_queries_total{{engine="{e}",model_name="m"}} 5',
        f'vllm:prefix_cache_hits_total{{engine="{e}",model_name="m"}} 1',
        f'vllm:engine_sleep_state{{engine="{e}",model_name="m",sleep_state="awake"}} 1',
        f'vllm:engine_sleep_state{{engine="{e}",model_name="m",sleep_state="weights_offloaded"}} 0',
        f'vllm:engine_sleep_state{{engine="{e}",model_name="m",sleep_state="discard_all"}} 0',
    ]
    if config:
        lines.append(
            f'vllm:cache_config_info{{block_size="16",engine="{e}",'
            f'kv_cache_size_tokens="{tokens}"}} 1.0'
        )
    return lines


SYNTHETIC = {
    # three engines, capacities unequal: the KV mean weighted
    "three engines": page(
        engine_lines("0", tokens=100)
        + engine_lines("1", tokens=300)
        + engine_lines("10", tokens=50)
        + ["process_start_time_seconds 1.7e9"]
    ),
    # one engine without a cache config: a plain mean, no total capacity
    "a capacity unknown": page(engine_lines("0") + engine_lines("1", config=False)),
    # no engine label at all (older servers), two model names
    "no engine label": page(
        [
            'vllm:num_requests_running{model_name="a"} 1',
            'vllm:num_requests_running{model_name="b"} 2',
            'vllm:gpu_cache_usage_perc{model_name="a"} 0.25',
            'vllm:gpu_cache_usage_perc{model_name="b"} 0.75',
            'vllm:gpu_prefix_cache_queries_total{model_name="a"} 8',
            'vllm:gpu_prefix_cache_hits_total{model_name="a"} 2',
        ]
    ),
    # the newer and the legacy names side by side: the newer wins
    "both names": page(
        engine_lines("0")
        + [
            'vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.9',
            'vllm:gpu_prefix_cache_queries_total{engine="0",model_name="m"} 99',
        ]
    ),
    # sleep mode: calls in flight, of every operation
    "sleep calls": page(
        engine_lines("0")
        + engine_lines("1")
        + [
            'vllm:sleep_mode_operations_in_flight{operation="sleep"} 1',
            'vllm:sleep_mode_operations_in_flight{operation="wake"} 0',
            'vllm:sleep_mode_operations_in_flight{operation="other"} 2',
            'vllm:sleep_mode_operations_in_flight{engine="1",operation="sleep"} 1',
        ]
    ),
    # labels without a value line for the per-engine families, only the sleep state
    "sleep state only": page(
        [
            'vllm:engine_sleep_state{engine="0",sleep_state="awake"} 0',
            'vllm:engine_sleep_state{engine="0",sleep_state="discard_all"} 1',
            'vllm:engine_sleep_state{engine="0",sleep_state="awake"} 1',
        ]
    ),
    "CRLF": EMULATOR.read_text().replace("\n", "\r\n"),
    "first line a sample": "vllm:num_requests_running 4\nvllm:num_requests_waiting 1\n",
}
# Values for the sleep state: 0 and 1 in every mix (asleep at each level, awake, both)
SLEEPY = [[" 0", " 1", " 0"], [" 0", " 0", " 1"], [" 1", " 1", " 1"], [" 0", " 1", " 1"], [" 1"]]


@pytest.mark.parametrize("name", list(SYNTHETIC))
def test_synthetic_shapes_read_the_same_compiled(name: str) -> None:
    text = SYNTHETIC[name]
    shape = learn(text)
    reader = Counted(shape)
    rng = random.Random(name)
    pages = [with_values(text, v) for v in SLEEPY]
    pages += [with_values(text, random_values(rng)) for _ in range(10)]
    pages += [with_values(text, v) for v in ODD]
    for moved in pages:
        assert same(parse_metrics(moved), M._parse_lines(moved)), moved
    assert reader.calls == sum(map(compiled, pages)) >= len(SLEEPY)
    assert shape.checks_left == 0


def test_the_sleep_state_and_calls_in_flight_come_through_compiled() -> None:
    """What sleep.py reconciles with, by the compiled reader: one engine of two asleep at
    level 2, a sleep call in flight."""
    text = SYNTHETIC["sleep calls"]
    shape = learn(text)
    reader = Counted(shape)
    asleep = re.sub(r'(engine="1",model_name="m",sleep_state="awake"\}) 1', r"\1 0", text)
    asleep = re.sub(r'(engine="1",model_name="m",sleep_state="discard_all"\}) 0', r"\1 1", asleep)
    m = parse_metrics(asleep)
    assert reader.calls == 1
    assert same(m, M._parse_lines(asleep))
    assert (m.sleeping, m.sleep_level, m.sleeps_in_flight, m.wakes_in_flight) == (True, 2, 2.0, 0.0)
    assert m.per_engine["0"].sleeping is False and m.per_engine["1"].sleeping is True


def test_legacy_names_come_through_compiled() -> None:
    text = (FIXTURES / "vllm-0.32-cpu" / "metrics_load_legacy_names.txt").read_text()
    shape = learn(text)
    reader = Counted(shape)
    m = parse_metrics(text)
    assert reader.calls == 1
    assert m.legacy_names == (
        "vllm:gpu_cache_usage_perc",
        "vllm:gpu_prefix_cache_queries_total",
        "vllm:gpu_prefix_cache_hits_total",
    )
    assert same(m, M._parse_lines(text))


LINES = [ln for text in SYNTHETIC.values() for ln in text.splitlines() if _VALUE.match(ln)]
VALUES = st.sampled_from(
    [" 0", " 1", " -0.0", " 2.5", " 1e3", " 1e308", "\t4", " NaN", " +Inf", " -Inf", " 0.1"]
)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.sampled_from(LINES), min_size=1, max_size=30),
    st.lists(st.lists(VALUES, min_size=1, max_size=8), min_size=1, max_size=4),
)
def test_any_shape_past_its_checks_reads_as_line_by_line(
    lines: list[str], moves: list[list[str]]
) -> None:
    """Past its checks a shape is read by the compiled reader alone: the same figures as the
    line-by-line reading on any mix of lines (engines, names, sleep states) and values."""
    M._SHAPES.clear()
    text = page(lines)
    for _ in range(M._CHECKS + 1):
        assert same(parse_metrics(text), M._parse_lines(text))
    for values in moves:
        moved = with_values(text, values)
        assert same(parse_metrics(moved), M._parse_lines(moved))


@pytest.mark.parametrize(
    "value",
    [
        "1.79599159378e+09",
        "1796592776.93",
        "1700000000",
        "1.7E9",
        ".5e1",
        "5.",
        "1e999",
        "9" * 400,
        "1_700",
        "1e",
        "+1e9",
        "NaN",
        "+Inf",
        "1.7e9 1700000000000",
        "",
    ],
)
def test_the_start_time_reads_as_parse_sample_reads_it(value: str) -> None:
    """`_start_time`'s shortcut for a plain number (e-notation included: vLLM writes the start
    time so) gives what the full parse of the line gives."""
    line = f"process_start_time_seconds {value}"
    try:
        sample = promtext.parse_sample(line)
        want = sample.value if math.isfinite(sample.value) else None
    except ValueError:
        want = None
    for text in (line, f"# HELP x\n{line}\n", f"vllm:num_requests_running 1\n{line}\r\n"):
        assert M._start_time(text) == want, text
