"""What vsup reads from a vLLM `/metrics` payload, across vLLM versions, without parsing all of it.

Only the families vsup shows are read. A compiled expression whose literal prefix is
`\\nvllm:` picks their sample lines out of the ~50 KB payload (the regex engine skips ahead on
the prefix, so most of the payload is never looked at), and `promtext.parse_sample` parses
those few lines. A server writes the same lines every scrape but for their values, so what
the label sets say is kept per page shape (`_SHAPES`), the page's reading compiled into sums
over known positions: a page of a known shape is read by `float()`s of its values and those
sums, to the same figures (tests/unit/telemetry/test_metrics_shape.py and
test_metrics_shapes.py). What it costs: docs/benchmarks.md (`benchmarks/metrics_parse.py`).
HELP/TYPE comments are never needed: each family is known by its sample name.

Names across versions (the newer one wins when a payload has both):
- KV-cache usage (0-1): `vllm:kv_cache_usage_perc`; before 0.12 `vllm:gpu_cache_usage_perc`.
- Prefix cache: `vllm:prefix_cache_queries_total` / `_hits_total`; before that
  `vllm:gpu_prefix_cache_queries_total` / `vllm:gpu_prefix_cache_hits_total`.
- `vllm:num_preemptions_total`, `vllm:num_requests_running`, `vllm:num_requests_waiting`,
  `vllm:prompt_tokens_total`, `vllm:generation_tokens_total`: unchanged.
- `vllm:cache_config_info{...} 1`: the cache config as label strings; the label set changes
  between versions, so it is read by key. KV capacity in tokens = `kv_cache_size_tokens`, else
  `num_gpu_blocks` x `block_size`.
- `process_start_time_seconds` (the API server's start): a change means a restarted server,
  which is how rates.py tells a counter reset from a counter that grew past its old value.
- `vllm:request_success_total{finished_reason=...}` (finished requests, summed over reasons)
  and `vllm:engine_sleep_state{sleep_state="awake"}` (0 while the engine sleeps: sleep mode):
  read for stall detection (stall.py), per engine. The sleep state's `weights_offloaded` and
  `discard_all` series (1 while asleep at level 1, 2) and `vllm:sleep_mode_operations_in_flight
  {operation="sleep"|"wake"|...}` (the API server's count of sleep-mode calls it is serving, in
  vLLM 0.32; answered while the engine is busy with one) tell the server's sleep state to a
  daemon that did not see it happen (engine/sleep.py reconciles with them). vLLM sets the
  sleep-state gauge once a sleep or a full wake is done, so it says nothing about one under way.

Several series of one family (data-parallel engines, label `engine`; or several `model_name`s)
are combined so the result describes the whole server: counters and request gauges are summed;
KV usage is the mean weighted by each engine's KV capacity (a plain mean when a capacity is
unknown), i.e. the fraction of all the server's KV blocks in use; KV capacity is the sum over
engines. Non-finite values (NaN, +Inf) are unknown, not numbers to add. `per_engine` keeps each
engine's own figures too (`EngineFigures`, keyed by the `engine` label, "" when a payload has
none): a hung data-parallel rank next to working ones shows only there.

Nothing here raises on bad input: a malformed line is skipped and counted in `bad_lines`, and a
payload without vLLM metrics gives every value `None` with `vllm_seen` False.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from types import MappingProxyType
from typing import TypeVar

from vsup.telemetry.promtext import parse_sample, parse_value

KV_USAGE = "vllm:kv_cache_usage_perc"
KV_USAGE_LEGACY = "vllm:gpu_cache_usage_perc"
PREEMPTIONS = "vllm:num_preemptions_total"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
PREFIX_QUERIES_LEGACY = "vllm:gpu_prefix_cache_queries_total"
PREFIX_HITS_LEGACY = "vllm:gpu_prefix_cache_hits_total"
CACHE_CONFIG = "vllm:cache_config_info"
REQUEST_SUCCESS = "vllm:request_success_total"
# vLLM's sleep_state label values (vLLM's words, not vsup states): the awake gauge, and the
# level-1 and level-2 ones
_AWAKE = "awake"
_SLEEP_LEVELS = {"weights_offloaded": 1, "discard_all": 2}
SLEEP_STATE = "vllm:engine_sleep_state"
SLEEP_OPS = "vllm:sleep_mode_operations_in_flight"
START_TIME = "process_start_time_seconds"

VLLM_FAMILIES = (
    KV_USAGE,
    KV_USAGE_LEGACY,
    PREEMPTIONS,
    RUNNING,
    WAITING,
    PROMPT_TOKENS,
    GENERATION_TOKENS,
    PREFIX_QUERIES,
    PREFIX_HITS,
    PREFIX_QUERIES_LEGACY,
    PREFIX_HITS_LEGACY,
    CACHE_CONFIG,
    REQUEST_SUCCESS,
    SLEEP_STATE,
    SLEEP_OPS,
)
# The samples a scrape asks vLLM for (telemetry/scrape.py): the families above and the start time.
SCRAPED_NAMES = (*VLLM_FAMILIES, START_TIME)
# The families summed per engine (EngineFigures) besides KV usage and the sleep state.
_PER_ENGINE = (RUNNING, WAITING, PROMPT_TOKENS, GENERATION_TOKENS, REQUEST_SUCCESS)

# The literal prefix `\nvllm:` lets the regex engine jump between candidate lines; the
# alternation then keeps only the wanted names, followed by `{` or a blank (so that
# `vllm:num_preemptions_total` never matches `vllm:num_preemptions_total_foo`).
_WANTED = re.compile(
    r"\n(vllm:(?:"
    + "|".join(re.escape(n[len("vllm:") :]) for n in VLLM_FAMILIES)
    + r"))([{ \t][^\n]*)"
)
_START = "\n" + START_TIME


@dataclass(frozen=True)
class EngineFigures:
    """One engine's (one data-parallel rank's) own figures; None = not in the payload."""

    requests_running: float | None = None
    requests_waiting: float | None = None
    prompt_tokens_total: float | None = None
    generation_tokens_total: float | None = None
    request_success_total: float | None = None  # finished requests, every finished_reason
    kv_cache_usage: float | None = None  # 0..1
    sleeping: bool | None = None  # sleep mode: the engine sleeps (requests wait by design)

    @property
    def busy(self) -> bool | None:
        """Requests running or waiting at this engine, as its last stats said; None: no
        request gauges in the payload."""
        if self.requests_running is None and self.requests_waiting is None:
            return None
        return (self.requests_running or 0) > 0 or (self.requests_waiting or 0) > 0

    @property
    def requests(self) -> float | None:
        """Running + waiting; None without request gauges."""
        if self.requests_running is None and self.requests_waiting is None:
            return None
        return (self.requests_running or 0) + (self.requests_waiting or 0)


_NO_ENGINES: Mapping[str, EngineFigures] = MappingProxyType({})


@dataclass(frozen=True)
class VllmMetrics:
    """One scrape of one vLLM server, reduced to what vsup shows. `None` = not in the payload."""

    kv_cache_usage: float | None = None  # 0..1
    preemptions_total: float | None = None
    requests_running: float | None = None
    requests_waiting: float | None = None
    prompt_tokens_total: float | None = None
    generation_tokens_total: float | None = None
    request_success_total: float | None = None
    prefix_cache_queries_total: float | None = None
    prefix_cache_hits_total: float | None = None
    cache_config: Mapping[str, str] | None = None  # labels of the first engine's series
    kv_capacity_tokens: int | None = None
    process_start_time_s: float | None = None
    engines: tuple[str, ...] = ()  # distinct `engine` label values
    model_names: tuple[str, ...] = ()
    legacy_names: tuple[str, ...] = ()  # pre-0.12 family names this payload was read through
    vllm_seen: bool = False  # any `vllm:` sample at all (False: not vLLM, or --disable-log-stats)
    bad_lines: int = 0  # wanted lines that did not parse
    # each engine's own figures, by `engine` label ("" without one), in engine order
    per_engine: Mapping[str, EngineFigures] = field(default_factory=lambda: _NO_ENGINES)
    # sleep mode, for the whole server: any engine asleep (the sleep-state gauge; None without
    # it), the level it sleeps at, and the sleep and wake calls the API server is serving now
    sleeping: bool | None = None
    sleep_level: int | None = None
    sleeps_in_flight: float | None = None
    wakes_in_flight: float | None = None

    @property
    def prefix_cache_hit_rate(self) -> float | None:
        """Hits / queries since the server started; None before the first query."""
        q, h = self.prefix_cache_queries_total, self.prefix_cache_hits_total
        if q is None or h is None or q <= 0:
            return None
        return h / q

    @property
    def found(self) -> bool:
        """True when at least one family vsup shows was in the payload."""
        return any(
            v is not None
            for v in (
                self.kv_cache_usage,
                self.preemptions_total,
                self.requests_running,
                self.requests_waiting,
                self.prompt_tokens_total,
                self.generation_tokens_total,
                self.cache_config,
            )
        )


EMPTY = VllmMetrics()


def kv_capacity_tokens(cache_config: Mapping[str, str]) -> int | None:
    """KV capacity in tokens from `vllm:cache_config_info` labels: `kv_cache_size_tokens`,
    else `num_gpu_blocks` x `block_size`; None when neither is a positive integer."""
    tokens = _positive_int(cache_config.get("kv_cache_size_tokens"))
    if tokens is not None:
        return tokens
    blocks = _positive_int(cache_config.get("num_gpu_blocks"))
    size = _positive_int(cache_config.get("block_size"))
    if blocks is not None and size is not None:
        return blocks * size
    return None


def _positive_int(raw: str | None) -> int | None:
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        return None
    if not math.isfinite(value) or value <= 0 or value != int(value):
        return None
    return int(value)


def wanted_lines(text: str) -> list[tuple[str, str]]:
    """(family name, rest of line) for every sample line of a family vsup reads."""
    found = _WANTED.findall(text)
    if text.startswith("vllm:"):
        first = _WANTED.match("\n" + text.split("\n", 1)[0])
        if first:
            found.insert(0, (first.group(1), first.group(2)))
    return found


# A sample line's head (name and label set) -> its labels, parsed once: a server repeats the
# same heads in every scrape and only the values move, and parsing a label set was most of a
# scrape's parse (benchmarks/overhead.py). The labels are shared: nothing may change them.
_HEADS: dict[str, dict[str, str]] = {}
_HEADS_MAX = 4096


def _sample(name: str, rest: str) -> tuple[dict[str, str], float]:
    """The labels and value of the sample line `name + rest` (promtext.parse_sample, with the
    label set's parse remembered by its text). Raises ValueError."""
    end = rest.rfind("}") + 1 if rest[:1] == "{" else 0
    if end:
        head = name + rest[:end]
        labels = _HEADS.get(head)
        if labels is not None:
            value = rest[end + 1 :]
            if (
                rest[end : end + 1] == " "
                and " " not in value
                and "\t" not in value
                and "_" not in value
            ):
                # what vLLM writes: one space and a plain number (parse_value's answer, for
                # a fifth of its cost; float() would take the underscores it refuses)
                return labels, float(value)
            return labels, parse_value(rest[end:])
    sample = parse_sample(name + rest)
    if end:
        if len(_HEADS) >= _HEADS_MAX:
            _HEADS.clear()
        _HEADS[head] = sample.labels
    return sample.labels, sample.value


# One family's samples: (labels, value) per line
Rows = list[tuple[dict[str, str], float]]


# A page's shape: the heads (family name, label set) of its wanted lines, in order. A server
# writes the same heads in every scrape and only the values move, so what depends on the
# labels alone (which line is which engine's, the cache config and capacities, the engines
# and model names) is worked out once per shape; a page of a known shape then costs its
# values' `float()`s and the sums (docs/benchmarks.md, 2026-12-06). The same selection as
# `_WANTED` (the lookahead), each line split into its head - the label set up to the line's
# last `}`, as `_sample` takes it - and the rest: the value (and a timestamp, or garbage).
_LINES = re.compile(
    r"\n(vllm:(?:"
    + "|".join(re.escape(n[len("vllm:") :]) for n in VLLM_FAMILIES)
    + r"))(?=[{ \t])((?:\{[^\n]*\})?)([^\n]*)"
)
# a shape's key: its lines' family names and label sets
_Key = tuple[tuple[str, ...], tuple[str, ...]]
_SHAPES: dict[_Key, _Shape] = {}
_SHAPES_MAX = 256


def _split_lines(text: str) -> list[tuple[str, str, str]]:
    """(family name, head, rest) of every wanted sample line (`wanted_lines`' selection)."""
    found = _LINES.findall(text)
    if text.startswith("vllm:"):
        first = _LINES.match("\n" + text.split("\n", 1)[0])
        if first:
            found.insert(0, (first.group(1), first.group(2), first.group(3)))
    return found


def _plain_values(rests: tuple[str, ...]) -> list[float] | None:
    """Each line's value when every rest is one number (what every client library writes),
    else None (the line-by-line reading says what the others are). `float()` takes what
    `promtext.parse_value` takes for a lone number, blanks around it included, except
    underscores, which it refuses."""
    if "_" in "".join(rests):
        return None
    try:
        return list(map(float, rests))
    except ValueError:
        return None


# How many pages of a shape, after the one it was learnt from, are also read by the general
# rules and compared (`_checked`) before the compiled reading is trusted alone: other values
# take other branches (a 0 where the first page had a 1 in the sleep state).
_CHECKS = 3


class _Shape:
    """What a page of one shape says apart from its values (see `_SHAPES`), and its reading
    compiled: where each figure's values are in the page, worked out once, so that a page of
    the shape whose values are all finite is read by the sums alone (`read`, `_reader`): no
    `series` dict, no label looked up, every branch that depends on the labels alone taken
    here. A page with a NaN or an infinity is read by `read_rows` (`_parse_lines` over its
    samples), whose rules for those stay in one place."""

    __slots__ = (
        "rows",
        "configs",
        "engines",
        "models",
        "engine_order",
        "model_order",
        "cache_config",
        "legacy",
        "finite",
        "checks_left",
    )

    def __init__(self, rows: list[tuple[str, dict[str, str]]]) -> None:
        self.rows = tuple(rows)
        series: dict[str, Rows] = {}
        for name, labels in rows:
            series.setdefault(name, []).append((labels, 0.0))
        self.configs = _cache_configs(series)
        self.engines, self.models = _labels_seen(series)
        self.engine_order = tuple(sorted(self.engines, key=_engine_order))
        self.model_order = tuple(sorted(self.models))
        first = self.configs[0]
        self.cache_config = MappingProxyType(dict(first)) if first is not None else None
        # pages of the shape still to read both ways (`_checked`); -1: the two readings
        # differed once, and the shape's pages are read by `read_rows` from then on
        self.checks_left = _CHECKS

        def at(family: str) -> tuple[int, ...]:
            return tuple(i for i, (name, _labels) in enumerate(rows) if name == family)

        def engine(i: int) -> str:
            return rows[i][1].get("engine", "")

        # `_parse_lines`' `pick`s, in its order: the KV rows, then the prefix cache's
        legacy: list[str] = []

        def pick(current: str, old: str) -> tuple[int, ...]:
            if current in series:
                return at(current)
            if old in series:
                legacy.append(old)
                return at(old)
            return ()

        kv = pick(KV_USAGE, KV_USAGE_LEGACY)
        queries = pick(PREFIX_QUERIES, PREFIX_QUERIES_LEGACY)
        hits = pick(PREFIX_HITS, PREFIX_HITS_LEGACY)
        self.legacy = tuple(legacy)
        # VllmMetrics' summed fields (`_sum`), in the order `_reader` unpacks them
        summed = (
            at(PREEMPTIONS),
            at(RUNNING),
            at(WAITING),
            at(PROMPT_TOKENS),
            at(GENERATION_TOKENS),
            at(REQUEST_SUCCESS),
            queries,
            hits,
        )
        # `_weighted_mean`: weighted by the capacities when every row's engine has one
        capacities = self.configs[1]
        weights = [capacities.get(engine(i)) for i in kv]
        # `_per_engine`: with every value finite, each row counts, so which engines there are
        # and which rows make each one's figures is the shape's
        sums: dict[tuple[str, str], list[int]] = {}
        for i, (name, labels) in enumerate(rows):
            if name in _PER_ENGINE:
                sums.setdefault((labels.get("engine", ""), name), []).append(i)
        kv_first: dict[str, int] = {}
        for i in kv:
            kv_first.setdefault(engine(i), i)
        awake_last: dict[str, int] = {}
        for i in at(SLEEP_STATE):
            if rows[i][1].get("sleep_state") == _AWAKE:
                awake_last[engine(i)] = i
        order = sorted({e for e, _f in sums} | set(kv_first) | set(awake_last), key=_engine_order)
        per_engine = [
            (
                [tuple(sums.get((e, family), ())) for family in _PER_ENGINE],
                kv_first.get(e),
                awake_last.get(e),
            )
            for e in order
        ]
        # `_sleep_state` and `_sleep_ops`
        awake = [i for i in at(SLEEP_STATE) if rows[i][1].get("sleep_state") == _AWAKE]
        levels = tuple(
            (i, _SLEEP_LEVELS[kind])
            for i in at(SLEEP_STATE)
            if (kind := rows[i][1].get("sleep_state", "")) in _SLEEP_LEVELS
        )
        ops = at(SLEEP_OPS)
        sleep_ops = [i for i in ops if rows[i][1].get("operation") == "sleep"]
        wake_ops = [i for i in ops if rows[i][1].get("operation") == "wake"]
        static: dict[str, object] = {
            "cache_config": self.cache_config,
            "kv_capacity_tokens": self.configs[2],
            "engines": self.engine_order,
            "model_names": self.model_order,
            "legacy_names": self.legacy,
            "vllm_seen": True,
            "bad_lines": 0,
        }
        self.finite = _reader(
            summed, kv, weights, order, per_engine, awake, levels, sleep_ops, wake_ops, static
        )

    def read(self, values: list[float], start: float | None) -> VllmMetrics | None:
        """The figures of a page of this shape whose values are all finite; None when one is
        not (a sum of floats is finite only when each of them is)."""
        if not math.isfinite(sum(values)):
            return None
        return self.finite(values, start)

    def read_rows(self, values: list[float], start: float | None) -> VllmMetrics:
        """The figures of any page of this shape, non-finite values included: its samples
        handed to `_parse_lines` as the line-by-line reading would have found them."""
        series: dict[str, Rows] = {}
        for (name, labels), value in zip(self.rows, values, strict=True):
            rows = series.get(name)
            if rows is None:
                series[name] = [(labels, value)]
            else:
                rows.append((labels, value))
        return _parse_lines("", self, series, start)


# EngineFigures' fields summed over an engine's rows (`_per_engine`), in `_PER_ENGINE`'s order
_ENGINE_SUMMED = (
    "requests_running",
    "requests_waiting",
    "prompt_tokens_total",
    "generation_tokens_total",
    "request_success_total",
)
_T = TypeVar("_T")


def _defaults(cls: type) -> dict[str, object]:
    """Each field's default, as `cls()` would set it (every field here has one)."""
    defaults: dict[str, object] = {}
    for f in fields(cls):
        if f.default is MISSING and f.default_factory is not MISSING:
            defaults[f.name] = f.default_factory()
        else:
            defaults[f.name] = f.default
    return defaults


def _made(cls: type[_T], attrs: dict[str, object]) -> _T:
    """An instance of one of the frozen dataclasses above whose fields are `attrs` (every one
    of them: `_defaults` first), made without its `__init__`: a frozen dataclass's sets each
    field through `object.__setattr__`, and VllmMetrics' 22 of them cost a fifth of a page
    read by its shape. The same object otherwise (its fields, ==, repr)."""
    made = object.__new__(cls)
    object.__setattr__(made, "__dict__", attrs)
    return made


def _reader(
    summed: tuple[tuple[int, ...], ...],
    kv: tuple[int, ...],
    weights: list[int | None],
    order: list[str],
    per_engine: list[tuple[list[tuple[int, ...]], int | None, int | None]],
    awake: list[int],
    levels: tuple[tuple[int, int], ...],
    sleep_ops: list[int],
    wake_ops: list[int],
    static: dict[str, object],
) -> Callable[[list[float], float | None], VllmMetrics]:
    """A shape's reading of a page whose values are all finite, compiled: one function whose
    only work is the page's sums, `v[i]` the value of the page's i-th wanted line. The
    expressions are `_parse_lines`' on such a page, term for term, so that they give the same
    floats: `_sum`'s `sum()` (of one value, `0 + v`: what `sum()` makes of it), `_per_engine`'s
    and `_sleep_ops`' running `+` from 0.0, `_weighted_mean`'s `sum()`s. The source holds
    nothing of the page but positions and capacities (ints); label values (engine names) come
    in through the namespace."""

    def values(at: tuple[int, ...] | list[int]) -> str:
        return ", ".join(f"v[{i}]" for i in at)

    def total(at: tuple[int, ...]) -> str:
        if not at:
            return "None"
        return f"0 + v[{at[0]}]" if len(at) == 1 else f"float(sum(({values(at)})))"

    def added(at: tuple[int, ...] | list[int]) -> str:
        return "".join(f" + v[{i}]" for i in at).join(("(0.0", ")")) if at else "None"

    if not kv:
        kv_usage = "None"
    elif len(kv) == 1:
        kv_usage = f"v[{kv[0]}]"
    elif all(w for w in weights):
        terms = ", ".join(f"v[{i}] * {w}" for i, w in zip(kv, weights, strict=True))
        kv_usage = f"sum(({terms})) / {sum(w for w in weights if w)}"
    else:
        kv_usage = f"sum(({values(kv)})) / {len(kv)}"
    engines = ", ".join(
        f"engine_{n}: made(EngineFigures, {{**engine_defaults"
        + "".join(f", {n!r}: {added(at)}" for n, at in zip(_ENGINE_SUMMED, sums, strict=True))
        + f", 'kv_cache_usage': {f'v[{kv_at}]' if kv_at is not None else None}"
        + f", 'sleeping': {f'v[{awake_at}] == 0' if awake_at is not None else None}}})"
        for n, (sums, kv_at, awake_at) in enumerate(per_engine)
    )
    preemptions, running, waiting, prompt, generation, success, queries, hits = map(total, summed)
    source = f"""
def read(v, start):
    sleeping = {" or ".join(f"v[{i}] == 0" for i in awake) if awake else None}
    return made(VllmMetrics, {{
        **fixed,
        "kv_cache_usage": {kv_usage},
        "preemptions_total": {preemptions},
        "requests_running": {running},
        "requests_waiting": {waiting},
        "prompt_tokens_total": {prompt},
        "generation_tokens_total": {generation},
        "request_success_total": {success},
        "prefix_cache_queries_total": {queries},
        "prefix_cache_hits_total": {hits},
        "process_start_time_s": start,
        "per_engine": {f"proxy({{{engines}}})" if order else "no_engines"},
        "sleeping": sleeping,
        "sleep_level": level(v, levels) if sleeping else None,
        "sleeps_in_flight": {added(sleep_ops)},
        "wakes_in_flight": {added(wake_ops)},
    }})
"""
    namespace: dict[str, object] = {
        "made": _made,
        "VllmMetrics": VllmMetrics,
        "EngineFigures": EngineFigures,
        "fixed": {**_defaults(VllmMetrics), **static},
        "engine_defaults": _defaults(EngineFigures),
        "proxy": MappingProxyType,
        "no_engines": _NO_ENGINES,
        "level": _level,
        "levels": levels,
        **{f"engine_{n}": e for n, e in enumerate(order)},
    }
    exec(compile(source, "<vsup.telemetry.metrics page shape>", "exec"), namespace)
    return namespace["read"]  # type: ignore[return-value]


def _level(values: list[float], levels: tuple[tuple[int, int], ...]) -> int | None:
    """`_sleep_state`'s level: the deepest one whose gauge is 1."""
    level: int | None = None
    for i, kind in levels:
        if values[i] == 1:
            level = max(level or 0, kind)
    return level


def _learn_shape(
    key: _Key,
    found: list[tuple[str, str, str]],
    rests: tuple[str, ...],
    text: str,
    metrics: VllmMetrics,
) -> None:
    """Remember the shape of a page read line by line with no bad line, when reading it by
    its shape gives the very same figures (a check that nothing tells the two readings apart,
    repeated on the next pages: `_Shape.checks_left`)."""
    values = _plain_values(rests)
    if values is None:
        return
    try:
        rows = [(name, parse_sample(name + head + " 0").labels) for name, head, _rest in found]
    except ValueError:
        return
    shape = _Shape(rows)
    start = _start_time(text)
    got = shape.read(values, start)
    if got is None:
        got = shape.read_rows(values, start)
    if got != metrics:
        return  # never seen; a NaN would do it (it equals nothing): line by line, then
    if len(_SHAPES) >= _SHAPES_MAX:
        _SHAPES.clear()
    _SHAPES[key] = shape


def parse_metrics(text: str) -> VllmMetrics:
    """Read the families vsup shows from a vLLM `/metrics` payload (see the module doc)."""
    if not isinstance(text, str) or not text:
        return EMPTY
    found = _split_lines(text)
    if not found:
        return _parse_lines(text)
    names, heads, rests = zip(*found, strict=True)
    key = (names, heads)
    shape = _SHAPES.get(key)
    if shape is not None:
        values = _plain_values(rests)
        if values is not None:
            start = _start_time(text)
            metrics = shape.read(values, start) if shape.checks_left >= 0 else None
            if metrics is None:
                return shape.read_rows(values, start)
            if shape.checks_left == 0:
                return metrics
            return _checked(shape, metrics, values, start)
    metrics = _parse_lines(text)
    if shape is None and metrics.bad_lines == 0:
        _learn_shape(key, found, rests, text, metrics)
    return metrics


def _checked(
    shape: _Shape, metrics: VllmMetrics, values: list[float], start: float | None
) -> VllmMetrics:
    """`metrics`, the compiled reading of a page of `shape` while the shape is on trial, held
    to the general rules (`read_rows`: `_parse_lines` over the page's samples, the reading
    the first page was held to against the line by line one, without a label set parsed
    again): equal, one check fewer to go; not (never seen), the shape is read by
    `read_rows` from then on, and so is this page."""
    want = shape.read_rows(values, start)
    shape.checks_left = shape.checks_left - 1 if want == metrics else -1
    return want


def _parse_lines(
    text: str,
    shape: _Shape | None = None,
    series: dict[str, Rows] | None = None,
    start: float | None = None,
) -> VllmMetrics:
    """The reading line by line; with `shape`, the figures of `series` (a page of that shape,
    its samples and start time, from `_Shape.read_rows`)."""
    if series is None:
        series, bad = _read_series(text)
        start = _start_time(text)
        vllm_seen = bool(series) or text.startswith("vllm:") or "\nvllm:" in text
    else:
        bad, vllm_seen = 0, True
    if not series:
        return VllmMetrics(process_start_time_s=start, vllm_seen=vllm_seen, bad_lines=bad)

    legacy: list[str] = []

    def pick(current: str, old: str) -> Rows | None:
        if current in series:
            return series[current]
        if old in series:
            legacy.append(old)
            return series[old]
        return None

    # Cache config and capacity per engine first: KV usage is weighted by them.
    if shape is not None:
        first_config, capacities, total_capacity = shape.configs
        engines, models = shape.engines, shape.models
    else:
        first_config, capacities, total_capacity = _cache_configs(series)
        engines, models = _labels_seen(series)
    kv_rows = pick(KV_USAGE, KV_USAGE_LEGACY)
    sleeping, level = _sleep_state(series.get(SLEEP_STATE))
    ops = _sleep_ops(series.get(SLEEP_OPS))
    return VllmMetrics(
        kv_cache_usage=_weighted_mean(kv_rows, capacities),
        preemptions_total=_sum(series.get(PREEMPTIONS)),
        requests_running=_sum(series.get(RUNNING)),
        requests_waiting=_sum(series.get(WAITING)),
        prompt_tokens_total=_sum(series.get(PROMPT_TOKENS)),
        generation_tokens_total=_sum(series.get(GENERATION_TOKENS)),
        request_success_total=_sum(series.get(REQUEST_SUCCESS)),
        prefix_cache_queries_total=_sum(pick(PREFIX_QUERIES, PREFIX_QUERIES_LEGACY)),
        prefix_cache_hits_total=_sum(pick(PREFIX_HITS, PREFIX_HITS_LEGACY)),
        cache_config=(
            shape.cache_config
            if shape is not None
            else MappingProxyType(dict(first_config))
            if first_config is not None
            else None
        ),
        kv_capacity_tokens=total_capacity,
        process_start_time_s=start,
        engines=tuple(sorted(engines, key=_engine_order)) if shape is None else shape.engine_order,
        model_names=tuple(sorted(models)) if shape is None else shape.model_order,
        legacy_names=tuple(legacy),
        vllm_seen=vllm_seen,
        bad_lines=bad,
        per_engine=_per_engine(series, kv_rows),
        sleeping=sleeping,
        sleep_level=level,
        sleeps_in_flight=ops.get("sleep"),
        wakes_in_flight=ops.get("wake"),
    )


def _read_series(text: str) -> tuple[dict[str, Rows], int]:
    """The wanted families' samples by name, and the count of lines that did not parse."""
    series: dict[str, Rows] = {}
    bad = 0
    for name, rest in wanted_lines(text):
        try:
            labels, value = _sample(name, rest.rstrip("\r"))
        except ValueError:
            bad += 1
            continue
        series.setdefault(name, []).append((labels, value))
    return series, bad


def _cache_configs(
    series: Mapping[str, Rows],
) -> tuple[dict[str, str] | None, dict[str, int | None], int | None]:
    """The first engine's cache config, each engine's KV capacity in tokens, and their sum
    (None unless every engine's is known)."""
    configs: dict[str, dict[str, str]] = {}
    for labels, _value in series.get(CACHE_CONFIG, ()):
        configs.setdefault(labels.get("engine", ""), labels)
    capacities = {eng: kv_capacity_tokens(cfg) for eng, cfg in configs.items()}
    first_config = configs[min(configs)] if configs else None
    total_capacity: int | None = None
    if capacities and all(c is not None for c in capacities.values()):
        total_capacity = sum(c for c in capacities.values() if c is not None)
    return first_config, capacities, total_capacity


def _labels_seen(series: Mapping[str, Rows]) -> tuple[set[str], set[str]]:
    """The `engine` and `model_name` label values of every sample."""
    engines: set[str] = set()
    models: set[str] = set()
    for rows in series.values():
        for labels, _value in rows:
            if "engine" in labels:
                engines.add(labels["engine"])
            if "model_name" in labels:
                models.add(labels["model_name"])
    return engines, models


def _sleep_ops(rows: Rows | None) -> dict[str, float]:
    """Sleep and wake operations in flight, summed over the engines, by operation."""
    ops: dict[str, float] = {}
    for labels, value in rows or ():
        if math.isfinite(value):
            op = labels.get("operation", "")
            ops[op] = ops.get(op, 0.0) + value
    return ops


def _sleep_state(rows: list[tuple[dict[str, str], float]] | None) -> tuple[bool | None, int | None]:
    """(any engine asleep, the deepest level an engine sleeps at) from the sleep-state gauge;
    (None, None) without it."""
    sleeping: bool | None = None
    level: int | None = None
    for labels, value in rows or ():
        if not math.isfinite(value):
            continue
        kind = labels.get("sleep_state")
        if kind == _AWAKE:
            sleeping = bool(sleeping) or value == 0
        elif kind in _SLEEP_LEVELS and value == 1:
            level = max(level or 0, _SLEEP_LEVELS[kind])
    return sleeping, level if sleeping else None


def _per_engine(
    series: Mapping[str, list[tuple[dict[str, str], float]]],
    kv_rows: list[tuple[dict[str, str], float]] | None,
) -> Mapping[str, EngineFigures]:
    """Each engine's own figures (summed over its other labels: model names, reasons)."""
    sums: dict[tuple[str, str], float] = {}
    engines: set[str] = set()
    for family in _PER_ENGINE:
        for labels, value in series.get(family, ()):
            if math.isfinite(value):
                key = (labels.get("engine", ""), family)
                sums[key] = sums.get(key, 0.0) + value
                engines.add(key[0])
    kv: dict[str, float] = {}
    for labels, value in kv_rows or ():
        if math.isfinite(value):
            kv.setdefault(labels.get("engine", ""), value)
    sleeping: dict[str, bool] = {}
    for labels, value in series.get(SLEEP_STATE, ()):
        if labels.get("sleep_state") == _AWAKE and math.isfinite(value):
            sleeping[labels.get("engine", "")] = value == 0
    engines |= set(kv) | set(sleeping)
    if not engines:
        return _NO_ENGINES
    return MappingProxyType(
        {
            e: EngineFigures(
                requests_running=sums.get((e, RUNNING)),
                requests_waiting=sums.get((e, WAITING)),
                prompt_tokens_total=sums.get((e, PROMPT_TOKENS)),
                generation_tokens_total=sums.get((e, GENERATION_TOKENS)),
                request_success_total=sums.get((e, REQUEST_SUCCESS)),
                kv_cache_usage=kv.get(e),
                sleeping=sleeping.get(e),
            )
            for e in sorted(engines, key=_engine_order)
        }
    )


def _engine_order(engine: str) -> tuple[int, str]:
    return (int(engine), "") if engine.isdigit() else (1 << 30, engine)


def _sum(rows: list[tuple[dict[str, str], float]] | None) -> float | None:
    if not rows:
        return None
    values = [v for _labels, v in rows if math.isfinite(v)]
    return float(sum(values)) if values else None


def _weighted_mean(
    rows: list[tuple[dict[str, str], float]] | None, capacities: Mapping[str, int | None]
) -> float | None:
    if not rows:
        return None
    finite = [(labels.get("engine", ""), v) for labels, v in rows if math.isfinite(v)]
    if not finite:
        return None
    if len(finite) == 1:
        return finite[0][1]
    weights = [capacities.get(eng) for eng, _v in finite]
    if all(w for w in weights):
        total = sum(w for w in weights if w)
        return sum(v * (w or 0) for (_e, v), w in zip(finite, weights, strict=False)) / total
    return sum(v for _e, v in finite) / len(finite)


# What prometheus_client writes for the start time, no labels: a plain number, in e-notation
# past 1e9 or so for some (vLLM 0.32's `1.79599159378e+09`, which went to `parse_sample`, ~3
# us of a filtered page); what `float()` and `parse_sample` read alike
_PLAIN_NUMBER = re.compile(r"(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def _start_time(text: str) -> float | None:
    if text.startswith(START_TIME):
        i = 0
    else:
        i = text.find(_START)
        if i < 0:
            return None
        i += 1
    end = text.find("\n", i)
    line = text[i : end if end >= 0 else len(text)].rstrip("\r")
    n = len(START_TIME)
    if line[n : n + 1] == " " and _PLAIN_NUMBER.fullmatch(line, n + 1):
        value = float(line[n + 1 :])
        return value if math.isfinite(value) else None
    try:
        sample = parse_sample(line)
    except ValueError:
        return None
    if sample.name != START_TIME or not math.isfinite(sample.value):
        return None
    return sample.value
