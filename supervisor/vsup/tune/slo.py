"""The latency SLO a tune ranks by: `ttft_p99<=2s,tpot_p99<=100ms`, and goodput against it.

Each term is METRIC_STAT OP VALUE UNIT:
- METRIC: ttft (time to the first token), tpot (time per output token after the first),
  itl (mean inter-token gap of a request: the same figure as tpot per request) or e2el (the
  whole request);
- STAT: p50 .. p99.9 or mean, over the candidate's requests (pooled across its clients);
- OP: `<=` or `<`; UNIT: ms or s (a bare number is refused: 2 could be seconds or ms).

A candidate *meets* the SLO when every term holds for its requests. Its *goodput* is the
requests per second that met every term's threshold one by one (vLLM's `--goodput` definition,
per request, whatever the STAT): a layout that is fast on average but slow for a few requests
loses those few, not its place.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from vsup.bench.results import percentile

METRICS = ("ttft", "tpot", "itl", "e2el")
_TERM = re.compile(
    r"^(?P<metric>[a-z0-9]+)_(?P<stat>p\d+(?:\.\d+)?|mean)\s*(?P<op><=|<)\s*"
    r"(?P<value>\d+(?:\.\d+)?)\s*(?P<unit>[a-z]*)$"
)
_UNITS = {"ms": 1.0, "s": 1000.0}


class SloError(ValueError):
    """An SLO that cannot be read; the message names the term and says what to write."""


@dataclass(frozen=True)
class SloTerm:
    metric: str  # one of METRICS
    stat: str  # "p99", "p50", "mean"
    op: str  # "<=" or "<"
    limit_ms: float

    @property
    def text(self) -> str:
        return f"{self.metric}_{self.stat}{self.op}{_fmt_ms(self.limit_ms)}"

    def holds(self, value_ms: float | None) -> bool:
        if value_ms is None:
            return False
        return value_ms <= self.limit_ms if self.op == "<=" else value_ms < self.limit_ms


@dataclass(frozen=True)
class Slo:
    terms: tuple[SloTerm, ...]

    @property
    def text(self) -> str:
        return ",".join(t.text for t in self.terms)

    def to_json(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "terms": [
                {"metric": t.metric, "stat": t.stat, "op": t.op, "limit_ms": t.limit_ms}
                for t in self.terms
            ],
        }


def parse_slo(text: str) -> Slo:
    """`ttft_p99<=2s,tpot_p99<=100ms` -> Slo; SloError saying which term is wrong and why."""
    terms: list[SloTerm] = []
    parts = [p.strip() for p in text.split(",")]
    if not text.strip() or not all(parts):
        raise SloError(
            f"--slo {text!r}: give terms separated by commas, e.g. ttft_p99<=2s,tpot_p99<=100ms"
        )
    for part in parts:
        m = _TERM.match(part.lower())
        if m is None:
            raise SloError(
                f"--slo term {part!r}: write METRIC_STAT<=VALUE UNIT, e.g. ttft_p99<=2s "
                f"(metrics: {', '.join(METRICS)}; stats: p50..p99.9 or mean; units: ms, s)"
            )
        metric, stat, unit = m["metric"], m["stat"], m["unit"]
        if metric not in METRICS:
            raise SloError(
                f"--slo term {part!r}: unknown metric {metric!r}; use one of {', '.join(METRICS)}"
            )
        if stat != "mean" and not 0 < float(stat[1:]) < 100:
            raise SloError(f"--slo term {part!r}: percentile {stat} must be between p0 and p100")
        if not unit:
            raise SloError(
                f"--slo term {part!r}: the value needs a unit: {m['value']}s or {m['value']}ms"
            )
        if unit not in _UNITS:
            raise SloError(f"--slo term {part!r}: unknown unit {unit!r}; use ms or s")
        limit = float(m["value"]) * _UNITS[unit]
        if limit <= 0:
            raise SloError(f"--slo term {part!r}: the limit must be above 0")
        if any(t.metric == metric and t.stat == stat for t in terms):
            raise SloError(f"--slo: {metric}_{stat} is given twice")
        terms.append(SloTerm(metric, stat, m["op"], limit))
    return Slo(tuple(terms))


@dataclass(frozen=True)
class RequestTimes:
    """One successful request's latencies, in ms (tpot None for a one-token output)."""

    ttft: float
    tpot: float | None
    e2el: float

    def value(self, metric: str) -> float | None:
        if metric in ("tpot", "itl"):
            return self.tpot
        return self.ttft if metric == "ttft" else self.e2el


def request_times(requests: Sequence[dict[str, float]]) -> list[RequestTimes]:
    """From the bench's per-request records (seconds: ttft, latency, output_len)."""
    out = []
    for q in requests:
        tpot = (
            (q["latency"] - q["ttft"]) / (q["output_len"] - 1) * 1000
            if q["output_len"] > 1
            else None
        )
        out.append(RequestTimes(q["ttft"] * 1000, tpot, q["latency"] * 1000))
    return out


def stat(times: Sequence[RequestTimes], metric: str, which: str) -> float | None:
    """A statistic (p50 .. p99.9, mean) of one metric over the requests; None for none."""
    values = [v for t in times if (v := t.value(metric)) is not None]
    if not values:
        return None
    if which == "mean":
        return sum(values) / len(values)
    return percentile(values, float(which[1:]))


@dataclass(frozen=True)
class SloVerdict:
    met: bool
    goodput: float | None  # requests/s that met every threshold
    good_requests: int
    attainment: float | None  # share of the successful requests that met every threshold
    terms: tuple[dict[str, Any], ...]  # per term: text, value_ms, holds

    def to_json(self) -> dict[str, Any]:
        return {
            "met": self.met,
            "goodput": self.goodput,
            "good_requests": self.good_requests,
            "attainment": self.attainment,
            "terms": list(self.terms),
        }


def judge(
    slo: Slo | None, times: Sequence[RequestTimes], failed: int, duration_s: float | None
) -> SloVerdict:
    """Whether the requests meet `slo`, and the goodput over the run's duration. A failed
    request is never good and breaks the SLO (a server that drops requests does not serve them
    in time). No SLO: every completed request is good, and `met` says none failed."""
    terms: list[dict[str, Any]] = []
    met = bool(times)
    for term in slo.terms if slo else ():
        value = stat(times, term.metric, term.stat)
        holds = term.holds(value)
        met = met and holds
        terms.append({"slo": term.text, "value_ms": value, "holds": holds})
    if slo is None:
        good = len(times)
    else:
        good = sum(1 for t in times if all(term.holds(t.value(term.metric)) for term in slo.terms))
    total = len(times) + failed
    return SloVerdict(
        met=met and failed == 0,
        goodput=good / duration_s if duration_s else None,
        good_requests=good,
        attainment=good / total if total else None,
        terms=tuple(terms),
    )


def _fmt_ms(ms: float) -> str:
    if ms >= 1000 and ms % 1000 == 0:
        return f"{ms / 1000:g}s"
    return f"{ms:g}ms"
