"""A canary's gate: is the instance on the new spec clearly worse than the ones on the old?

A rolling apply with `[layout] canary_s` (docs/canary.md) restarts its first wave (the canary)
on the new spec while the other instances of the rollout keep serving the old one behind the
same router, and watches both for `canary_s` seconds. This module is the pure part: what vsup
reads of each server at the window's two ends (`Reading.parse` of a `/metrics` payload), the
window's figures (`Window.between`: counter and histogram deltas, so both sides are measured
over the same seconds) and the decision (`decide`). The engine takes the readings and acts
(engine.py: `Engine._watch_canary`).

What is compared, all from vLLM's own metrics:
- failed requests: `vllm:request_success_total{finished_reason="error"}` and the API server's
  `http_requests_total{status="5xx"|"4xx"}` (the larger of the error reason and the 5xx, since
  one failed request may be counted by both; 4xx are requests the server refused); the share
  of failed requests, the canary's against the others' together;
- TTFT and inter-token latency p50 and p99 from `vllm:time_to_first_token_seconds` and
  `vllm:inter_token_latency_seconds` (histogram deltas over the window, quantiles the way
  Prometheus' `histogram_quantile` takes them: linear inside a bucket);
- preemptions per minute (`vllm:num_preemptions_total`), the canary's against the others' mean;
- restarts (`process_start_time_seconds` changed, or the engine saw the process end) and stalls.

Noise: a latency fails the canary only when it is more than the ratio times the others'
pooled figure, more than `min_delta_ms` above it, above every other instance's own figure
(outside their spread), and the requests behind it are evidence (`evidence`: at the bucket
bounds between the two quantiles, the canary's share of requests above the bound against the
others', Fisher's exact test, one-sided, sure to `CanarySettings.confidence`; a request is the
unit, an ITL histogram's tokens are not independent); a latency over the ratio without that
evidence is `insufficient`, not a failure (~20 requests a side on a busy host swing a p50 by
3x). The latencies of the canary's warm-up are not compared: the watch (canarywatch.py) reads
every server at its end and the histograms are measured from there (`Window.between`'s
`latency_from`). Failures only from `min_failed` failed requests up; a p99 only when each side
finished `P99_MIN_REQUESTS` (below that it is the slowest request or two).
Latencies are compared only when each side finished `min_requests` in the window; with fewer
the answer is `insufficient` (failures, restarts and stalls are judged whatever the count), and
the layout says what that means (`CanarySettings.insufficient`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from vsup.layout.spec import CanarySettings
from vsup.telemetry.promtext import parse_sample

__all__ = [
    "CANARY_NAMES",
    "Decision",
    "Evidence",
    "Histogram",
    "Reading",
    "Verdict",
    "Window",
    "decide",
    "evidence",
    "fisher_greater",
]

TTFT = "vllm:time_to_first_token_seconds"
ITL = "vllm:inter_token_latency_seconds"
REQUEST_SUCCESS = "vllm:request_success_total"
PREEMPTIONS = "vllm:num_preemptions_total"
HTTP_REQUESTS = "http_requests_total"
FINISHED_ERROR = "error"  # vllm:request_success_total{finished_reason} of a request that failed
START_TIME = "process_start_time_seconds"
# The sample names a canary's scrape asks for (`/metrics/?name[]=...`).
CANARY_NAMES = (
    f"{TTFT}_bucket",
    f"{ITL}_bucket",
    REQUEST_SUCCESS,
    PREEMPTIONS,
    HTTP_REQUESTS,
    START_TIME,
)
# Below this many requests a side's p99 is its slowest one or two (a fresh server's first
# request, say; an ITL p99 too: a request's tokens share its moments of contention): p99 is
# judged only from here up, p50 always. Seen on 2 shared cores: a neutral change's canary at
# "p99 ITL 2.4x the others (841 ms vs 354 ms over 12 s, 10 vs 13 requests)".
P99_MIN_REQUESTS = 100
_WANTED = (f"{TTFT}_bucket", f"{ITL}_bucket", REQUEST_SUCCESS, PREEMPTIONS, HTTP_REQUESTS)


class Decision(StrEnum):
    PASS = "pass"
    FAIL = "fail"
    INSUFFICIENT = "insufficient"


@dataclass(frozen=True)
class Histogram:
    """A Prometheus histogram: upper bounds (ascending, the last +Inf) and cumulative counts."""

    bounds: tuple[float, ...] = ()
    counts: tuple[float, ...] = ()

    @classmethod
    def of(cls, buckets: Mapping[float, float]) -> Histogram:
        bounds = tuple(sorted(buckets))
        return cls(bounds, tuple(buckets[b] for b in bounds))

    @property
    def count(self) -> float:
        return self.counts[-1] if self.counts else 0.0

    def minus(self, earlier: Histogram) -> Histogram:
        """The observations since `earlier` (the same server, same buckets); a bucket that
        `earlier` lacks counts from 0."""
        before = dict(zip(earlier.bounds, earlier.counts, strict=True))
        pairs = zip(self.bounds, self.counts, strict=True)
        return Histogram(self.bounds, tuple(max(0.0, c - before.get(b, 0.0)) for b, c in pairs))

    def plus(self, other: Histogram) -> Histogram:
        """Both together (several servers, or engines of one); bounds are the union."""
        mine = dict(zip(self.bounds, self.counts, strict=True))
        theirs = dict(zip(other.bounds, other.counts, strict=True))
        return Histogram.of(
            {
                b: _at(self.bounds, self.counts, mine, b)
                + _at(other.bounds, other.counts, theirs, b)
                for b in set(mine) | set(theirs)
            }
        )

    def quantile(self, q: float) -> float | None:
        """`histogram_quantile(q)` in seconds; None with no observation. In the +Inf bucket:
        the largest finite bound (Prometheus' answer)."""
        total = self.count
        if total <= 0:
            return None
        rank = q * total
        lower, below = 0.0, 0.0
        for bound, cum in zip(self.bounds, self.counts, strict=True):
            if cum >= rank and cum > below:
                if math.isinf(bound):
                    return lower
                return lower + (bound - lower) * (rank - below) / (cum - below)
            if not math.isinf(bound):
                lower = bound
            below = cum
        return lower


def _at(bounds: tuple[float, ...], counts: tuple[float, ...], by: dict, b: float) -> float:
    """A cumulative histogram's count at bound `b` (the nearest lower bucket's if absent)."""
    if b in by:
        return by[b]
    below = [c for x, c in zip(bounds, counts, strict=True) if x < b]
    return below[-1] if below else 0.0


@dataclass(frozen=True)
class Reading:
    """What the gate needs of one server at one moment (cumulative since its start)."""

    ttft: Histogram = field(default_factory=Histogram)
    itl: Histogram = field(default_factory=Histogram)
    finished: float = 0.0  # request_success_total, every finished_reason
    errored: float = 0.0  # finished_reason="error"
    http_4xx: float = 0.0
    http_5xx: float = 0.0
    preemptions: float = 0.0
    start_time: float | None = None  # process_start_time_seconds: a change is a restart

    @classmethod
    def parse(cls, text: str) -> Reading:
        """A `/metrics` payload's figures; lines that do not parse are skipped, families
        summed over engines and model names."""
        ttft: dict[float, float] = {}
        itl: dict[float, float] = {}
        sums = {"finished": 0.0, "errored": 0.0, "4xx": 0.0, "5xx": 0.0, "preempt": 0.0}
        start: float | None = None
        for line in text.splitlines():
            if not line.startswith(_WANTED) and not line.startswith(START_TIME):
                continue
            try:
                s = parse_sample(line)
            except ValueError:
                continue
            if not math.isfinite(s.value):
                continue
            if s.name in (f"{TTFT}_bucket", f"{ITL}_bucket"):
                try:
                    le = float(s.labels.get("le", ""))
                except ValueError:
                    continue
                into = ttft if s.name.startswith(TTFT) else itl
                into[le] = into.get(le, 0.0) + s.value
            elif s.name == REQUEST_SUCCESS:
                sums["finished"] += s.value
                if s.labels.get("finished_reason") == FINISHED_ERROR:
                    sums["errored"] += s.value
            elif s.name == HTTP_REQUESTS:
                status = s.labels.get("status", "")
                if status in ("4xx", "5xx"):
                    sums[status] += s.value
            elif s.name == PREEMPTIONS:
                sums["preempt"] += s.value
            elif s.name == START_TIME:
                start = s.value
        return cls(
            Histogram.of(ttft),
            Histogram.of(itl),
            sums["finished"],
            sums["errored"],
            sums["4xx"],
            sums["5xx"],
            sums["preempt"],
            start,
        )


def _restarted(before: Reading, after: Reading) -> bool:
    return (
        before.start_time is not None
        and after.start_time is not None
        and after.start_time != before.start_time
    ) or after.finished < before.finished


@dataclass(frozen=True)
class Window:
    """One server's figures over a window (`between` two readings)."""

    seconds: float
    requests: float = 0.0  # finished, plus failures vLLM's engine never saw
    failed: float = 0.0
    ttft: Histogram = field(default_factory=Histogram)
    itl: Histogram = field(default_factory=Histogram)
    preemptions: float = 0.0
    restarted: bool = False  # the server started again within the window

    @classmethod
    def between(
        cls,
        before: Reading,
        after: Reading,
        seconds: float,
        latency_from: Reading | None = None,
    ) -> Window:
        """The deltas from `before` to `after`; the latency histograms from `latency_from`
        (the end of the canary's warm-up, read on every server: the same seconds each side)
        when given. A server that restarted in between (a new start time, or a counter that
        went down) is measured from its new start."""
        restarted = _restarted(before, after)
        base = Reading() if restarted else before
        warm = base
        if latency_from is not None:
            warm = Reading() if _restarted(latency_from, after) else latency_from
        errored = after.errored - base.errored
        http_5xx = after.http_5xx - base.http_5xx
        http_4xx = after.http_4xx - base.http_4xx
        finished = after.finished - base.finished
        # a failed request may be counted by the engine (reason error) and the API server
        # (a 5xx) both; one refused before the engine saw it only by the API server
        unseen = max(0.0, http_5xx - errored) + http_4xx
        return cls(
            seconds=seconds,
            requests=max(0.0, finished + unseen),
            failed=max(0.0, max(errored, http_5xx) + http_4xx),
            ttft=after.ttft.minus(warm.ttft),
            itl=after.itl.minus(warm.itl),
            preemptions=max(0.0, after.preemptions - base.preemptions),
            restarted=restarted,
        )

    @property
    def preemptions_per_min(self) -> float:
        return self.preemptions * 60.0 / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class Verdict:
    """The gate's answer: the decision, its reason in words with the figures, and the
    figures as data (the journal's)."""

    decision: Decision
    reason: str
    figures: Mapping[str, Any] = field(default_factory=dict)


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.0f} ms"


def _n(count: float) -> str:
    return f"{count:,.0f}"


def _pooled(windows: Iterable[Window]) -> Window:
    out: Window | None = None
    for w in windows:
        if out is None:
            out = w
            continue
        out = Window(
            seconds=out.seconds,
            requests=out.requests + w.requests,
            failed=out.failed + w.failed,
            ttft=out.ttft.plus(w.ttft),
            itl=out.itl.plus(w.itl),
            preemptions=out.preemptions + w.preemptions,
        )
    return out if out is not None else Window(seconds=0.0)


_LATENCIES = (("TTFT", "ttft"), ("ITL", "itl"))


def decide(
    name: str,
    canary: Window,
    others: Mapping[str, Window],
    settings: CanarySettings,
    *,
    restarts: int = 0,
    stalls: int = 0,
) -> Verdict:
    """Compare the canary `name`'s window with the old instances' (`others`, the same
    seconds). `restarts`, `stalls`: what the engine saw of the canary in the window besides
    its figures (a restart the figures show counts too)."""
    secs = f"{canary.seconds:,.0f} s"
    who = f"canary {name}"
    pool = _pooled(others.values())
    figures: dict[str, Any] = {
        "seconds": round(canary.seconds, 3),
        "requests": [canary.requests, pool.requests],
        "failed": [canary.failed, pool.failed],
        "preemptions_per_min": [
            round(canary.preemptions_per_min, 3),
            round(pool.preemptions_per_min / max(1, len(others)), 3),
        ],
    }
    restarted = restarts + (1 if canary.restarted and not restarts else 0)
    if restarted:
        often = "once" if restarted == 1 else f"{restarted} times"
        return Verdict(
            Decision.FAIL, f"{who}: its server restarted {often} in {secs} of watch", figures
        )
    if stalls:
        return Verdict(
            Decision.FAIL,
            f"{who}: stalled (requests but no token) in {secs} of watch",
            figures,
        )
    failed_share = canary.failed / canary.requests if canary.requests else 0.0
    other_share = pool.failed / pool.requests if pool.requests else 0.0
    figures["failed_pct"] = [round(failed_share * 100, 2), round(other_share * 100, 2)]
    if (
        canary.failed >= settings.min_failed
        and (failed_share - other_share) * 100 > settings.failed_pct
    ):
        return Verdict(
            Decision.FAIL,
            f"{who}: {_n(canary.failed)} of {_n(canary.requests)} requests failed "
            f"({failed_share * 100:.1f}%) vs {_n(pool.failed)} of {_n(pool.requests)} "
            f"({other_share * 100:.1f}%) at the others over {secs}",
            figures,
        )
    counts = f"{_n(canary.requests)} vs {_n(pool.requests)} requests"
    if (
        not others
        or canary.requests < settings.min_requests
        or pool.requests < (settings.min_requests)
    ):
        if not others:
            why = "no instance on the old spec to compare with"
        else:
            why = f"{counts} over {secs}, {settings.min_requests} each needed"
        return Verdict(Decision.INSUFFICIENT, f"{who}: not enough evidence ({why})", figures)
    worse: list[tuple[float, str]] = []
    doubtful: list[str] = []
    seen: list[str] = []
    for label, attr in _LATENCIES:
        for q, ratio in ((0.99, settings.p99_ratio), (0.5, settings.p50_ratio)):
            mine = getattr(canary, attr).quantile(q)
            theirs = getattr(pool, attr).quantile(q)
            key = f"p{round(q * 100)}_{attr}_ms"
            figures[key] = [
                None if mine is None else round(mine * 1000, 3),
                None if theirs is None else round(theirs * 1000, 3),
            ]
            if mine is None or theirs is None:
                continue
            if q > 0.5 and min(canary.requests, pool.requests) < P99_MIN_REQUESTS:
                continue
            spread = [
                v
                for w in others.values()
                if w.requests >= settings.min_requests
                for v in [getattr(w, attr).quantile(q)]
                if v is not None
            ]
            times = mine / theirs if theirs > 0 else math.inf
            words = f"p{round(q * 100)} {label} {_x(times)} the others"
            seen.append(f"{words} ({_ms(mine)} vs {_ms(theirs)})")
            if (
                times > ratio
                and (mine - theirs) * 1000 > settings.min_delta_for(attr)
                and all(mine > v for v in spread)
            ):
                said = f"{words} ({_ms(mine)} vs {_ms(theirs)} over {secs}, {counts})"
                proof = evidence(canary, pool, attr, mine, theirs)
                sure = proof.sure if proof is not None else 0.0
                figures.setdefault("sure", {})[key] = round(sure, 6)
                if sure >= settings.confidence:
                    worse.append((times / ratio, said))
                else:
                    doubtful.append(f"{said}, but {_doubt(proof, settings.confidence)}")
    mine_pm = canary.preemptions_per_min
    theirs_pm = pool.preemptions_per_min / len(others)
    if mine_pm >= settings.min_preemptions_per_min and mine_pm > (
        settings.preemption_ratio * theirs_pm
    ):
        times = mine_pm / theirs_pm if theirs_pm > 0 else math.inf
        worse.append(
            (
                times / settings.preemption_ratio,
                f"{mine_pm:,.1f} preemptions/min vs {theirs_pm:,.1f} at the others over {secs}",
            )
        )
    if worse:
        worse.sort(key=lambda w: -w[0])
        return Verdict(Decision.FAIL, f"{who}: " + "; ".join(w for _, w in worse), figures)
    if doubtful:
        return Verdict(
            Decision.INSUFFICIENT, f"{who}: not enough evidence ({'; '.join(doubtful)})", figures
        )
    summary = ", ".join(seen[:2]) if seen else "no latency observed"
    return Verdict(
        Decision.PASS,
        f"{who}: {summary}; {_n(canary.failed)} failed; over {secs}, {counts}",
        figures,
    )


@dataclass(frozen=True)
class Evidence:
    """How sure the gate is that the canary's requests are slower than the others' at one
    bucket bound: `mine` of `n_mine` requests above `bound` against `theirs` of `n_theirs`;
    `sure` is 1 - the one-sided p-value (Fisher's exact test; Bonferroni over the bounds
    tried)."""

    bound: float
    mine: int
    n_mine: int
    theirs: int
    n_theirs: int
    sure: float


def _units(w: Window) -> int:
    """The independent units of a window's latencies: its requests (each first token is
    one; an ITL histogram's tokens are not independent - a request's tokens share its
    moments of contention - so its shares count as requests too)."""
    return round(w.ttft.count if w.ttft.count > 0 else w.requests)


def evidence(
    canary: Window, others: Window, attr: str, mine: float, theirs: float
) -> Evidence | None:
    """Whether the canary's latency `attr` (ttft | itl) quantile `mine` being above the
    others' `theirs` is more than noise: at each bucket bound from the others' quantile's
    bucket up to below the canary's, the share of the canary's requests above it against the
    others' share, the strongest of them (its p-value times the bounds tried). None when no
    bound lies between them (both in one bucket: the difference is the interpolation's)."""
    h_mine, h_theirs = getattr(canary, attr), getattr(others, attr)
    n_mine, n_theirs = _units(canary), _units(others)
    if h_mine.count <= 0 or h_theirs.count <= 0 or n_mine <= 0 or n_theirs <= 0:
        return None
    finite = sorted({b for b in (*h_mine.bounds, *h_theirs.bounds) if not math.isinf(b)})
    floor = max((b for b in finite if b <= theirs), default=0.0)
    bounds = [b for b in finite if floor <= b < mine]
    if not bounds:
        return None
    best: Evidence | None = None
    for b in bounds:
        k_mine = round(n_mine * _share_above(h_mine, b))
        k_theirs = round(n_theirs * _share_above(h_theirs, b))
        p = min(1.0, fisher_greater(k_mine, n_mine, k_theirs, n_theirs) * len(bounds))
        if best is None or 1.0 - p > best.sure:
            best = Evidence(b, k_mine, n_mine, k_theirs, n_theirs, 1.0 - p)
    return best


def _share_above(h: Histogram, bound: float) -> float:
    by = dict(zip(h.bounds, h.counts, strict=True))
    return max(0.0, h.count - _at(h.bounds, h.counts, by, bound)) / h.count


def _lcomb(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def fisher_greater(k1: int, n1: int, k2: int, n2: int) -> float:
    """The one-sided p-value of Fisher's exact test that the first group's share (`k1` of
    `n1`) is greater than the second's (`k2` of `n2`): P(X >= k1), X hypergeometric. 1 when
    it is not greater."""
    above, total = k1 + k2, n1 + n2
    if above == 0 or k1 * n2 <= k2 * n1:
        return 1.0
    norm = _lcomb(total, above)
    p = 0.0
    for k in range(k1, min(above, n1) + 1):
        term = math.exp(_lcomb(n1, k) + _lcomb(n2, above - k) - norm)
        p += term
        if term < p * 1e-12:
            break  # past the mode the terms only shrink
    return min(1.0, p)


def _doubt(proof: Evidence | None, confidence: float) -> str:
    """Why a latency over the ratio is not enough evidence, in words."""
    if proof is None:
        return "both in one histogram bucket"
    share_mine = 100.0 * proof.mine / proof.n_mine
    share_theirs = 100.0 * proof.theirs / proof.n_theirs
    return (
        f"{share_mine:.0f}% of its requests over {_ms(proof.bound)} vs {share_theirs:.0f}% at "
        f"the others is {_pct(proof.sure)} sure, {_pct(confidence)} needed"
    )


def _pct(p: float) -> str:
    text = f"{p * 100:.1f}"
    return (text[:-2] if text.endswith(".0") else text) + "%"


def _x(times: float) -> str:
    return "inf x" if math.isinf(times) else f"{times:.1f}x"
