"""Stall detection: a server with work to do that makes no progress at all.

A vLLM server whose engine hangs (a GPU hang, a stuck collective, a frozen EngineCore) keeps
answering `/health` 200 and `/metrics` from its API process; only its figures stop moving, and
the engine's own gauges (`num_requests_running`/`waiting`, KV usage) freeze at the last stats it
sent. `StallWatch` is fed every good scrape and says how long the server has had work and no
progress.

Work (any one is enough), judged per engine (a data-parallel rank; `engine` label):
- the engine's gauges say requests run or wait there (evidence `engine`): a freeze under load;
- the API server holds requests that no engine's gauges show: `/load` (vLLM's
  `--enable-server-load-tracking`, the API process's own count of requests in flight) above
  the sum of every engine's running + waiting (evidence `server`). Requests that reach a
  frozen engine never show in its gauges, so this is how a freeze that began while the server
  was idle is seen, as soon as one request arrives and goes unanswered. With several engines
  the ones that made no progress since such requests began to wait hold them (vLLM's balancer
  sends new requests to the engine with the fewest in flight, so a working rank next to a
  frozen one takes the next ones and moves; seen at DP=2,
  tests/fixtures/vllm-0.32-cpu/dp2/README.md); when every engine moved since, the ones
  without progress for `stall_after_s`; none when an engine is stuck by its own gauges
  (requests that reached it after the last stats it sent are what no gauge shows);
- a canary request (a `max_tokens = 1` completion, control/monitor.py) got no answer within
  `stall_after_s` (evidence `canary`): the same freeze without load tracking.

Progress at an engine (vLLM 0.32, `vllm/v1/metrics/`), any one is enough:
- `vllm:generation_tokens_total` grew: a decode step produced tokens;
- `vllm:prompt_tokens_total` grew: a prefill finished (vLLM counts a request's prompt tokens
  once, in the step that gives its first token, not chunk by chunk);
- `vllm:request_success_total` grew: a request finished (an embedding or score request
  generates nothing);
- `vllm:kv_cache_usage_perc` rose: the scheduler allocated KV blocks for tokens it scheduled.
  This is the one figure that moves *during* a long chunked prefill: the scheduler sends its
  stats every step, even a step with no output, while the token counters and
  `vllm:iteration_tokens_total` (observed only for steps that give outputs) stay flat until
  the prefill ends. A fall of KV usage (requests finishing, aborted or preempted) is not
  progress by itself.
Request counts moving are not progress: requests keep arriving at a hung engine.

Never stalled while idle (no work as above), while an engine sleeps (sleep mode: requests wait
for its wake-up by design), nor without a fresh scrape (a server that does not answer is the
health check's business). One engine step that takes longer than `stall_after_s` without any of
the above (a very long prefill with chunked prefill off) looks like a stall: set
`stall_after_s` above the longest step, or 0 to turn detection off. With load tracking, a
request the API server holds longer than `stall_after_s` without its engine (a streamed answer a
client reads that slowly after the engine finished it, media fetched for longer than that before
the prompt reaches the engine: vLLM's fetch timeouts are 5-30 s) counts as work too.

Time comes from the caller (monotonic and wall seconds), so tests drive it without sleeping.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from vsup.telemetry.metrics import EngineFigures, VllmMetrics

DEFAULT_STALL_AFTER_S = 60.0


class Evidence(StrEnum):
    """What showed the work that made no progress (status `stall_evidence`)."""

    ENGINE = "engine"  # the engine's gauges: requests running or waiting there
    SERVER = "server"  # the API server's /load: requests no engine's gauges show
    CANARY = "canary"  # a max_tokens = 1 request got no answer within stall_after_s


@dataclass(frozen=True)
class Stamp:
    """A moment on both clocks: monotonic (for durations) and wall (for people)."""

    t: float
    wall: float


@dataclass(frozen=True)
class StallView:
    """What the watch says now. `stalled` is None when it cannot tell (no fresh figures)."""

    stalled: bool | None = None
    since_wall: float | None = None  # the last progress, or when the work began (epoch s)
    for_s: float | None = None  # how long it has lasted (work and no progress)
    evidence: Evidence | None = None
    # data parallel: the ranks (engine labels) with work and no progress; () with one engine
    ranks: tuple[int, ...] = ()
    unaccounted: int | None = None  # requests the API server holds beyond the engines' gauges


UNKNOWN = StallView()
# StallView(stalled=False, unaccounted=N) by N: views are immutable, so one serves every caller
_CALM: dict[int | None, StallView] = {}


@dataclass
class _Engine:
    """One engine's last figures, its last progress and how long it has been busy."""

    last: EngineFigures
    moved_at: Stamp | None = None  # its last progress seen (None: none this run)
    busy_from: Stamp | None = None  # since when its gauges say requests run or wait there


# Readings of zero unaccounted requests in a row that end a spell of them: /load and /metrics
# are read one after the other, and a request that ends between the two reads is counted by
# the gauges but no longer by /load, for one reading.
_UNACCOUNTED_END = 2
# /load reads in a row that may fail (no answer in time) before what it counted last is
# forgotten: a miss on a loaded node keeps a spell going; a /load that stays away (its route
# gone) says nothing any more after these.
_LOAD_MISSES_KEPT = 3


class StallWatch:
    """Progress of one server run, from successive scrapes (and canary outcomes)."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        """Forget everything (a new run: its counters start again)."""
        self._engines: dict[str, _Engine] = {}
        self._seen_at: float | None = None
        self._unaccounted: int | None = None
        self._unaccounted_from: Stamp | None = None  # a spell of unaccounted requests began
        self._zero_reads = 0
        self._load_misses = 0  # /load reads in a row that gave no count
        self._canary: tuple[str | None, Stamp] | None = None  # (engine, sent) of a lost canary

    @property
    def idle(self) -> bool | None:
        """No work at all as of the last scrape (what a canary waits for); None: unknown."""
        if self._seen_at is None:
            return None
        return not self._unaccounted and all(not e.last.busy for e in self._engines.values())

    @property
    def engines(self) -> tuple[str, ...]:
        """The engine labels seen in the last scrape ("" when the payload has none)."""
        return tuple(self._engines)

    def observe(
        self,
        metrics: VllmMetrics,
        t: float,
        wall: float,
        server_load: int | None = None,
        load_failed: bool = False,
    ) -> None:
        """One good scrape read at monotonic `t` (wall-clock `wall`); `server_load` is
        `/load`'s count when the server tracks it (None otherwise). `load_failed`: /load was
        asked and gave no count this time (a timeout on a loaded node): the requests it counted
        before are still held as far as anyone knows, so a spell of them goes on (up to
        `_LOAD_MISSES_KEPT` misses in a row) rather than start again at the next good count,
        which would put the verdict off by a whole `stall_after_s` at each miss."""
        now = Stamp(t, wall)
        figures = dict(metrics.per_engine) or {"": _whole(metrics)}
        self._seen_at = t
        self._observe_engines(figures, now)
        self._observe_load(figures, now, server_load, load_failed)

    def _observe_engines(self, figures: dict[str, EngineFigures], now: Stamp) -> None:
        """Each engine's progress and busy spell; engines no longer reported are forgotten."""
        for gone in [e for e in self._engines if e not in figures]:
            del self._engines[gone]
        for label, fig in figures.items():
            known = self._engines.get(label)
            if known is None:
                busy = bool(fig.busy) and not fig.sleeping
                self._engines[label] = _Engine(fig, busy_from=now if busy else None)
                continue
            if _progressed(known.last, fig):
                known.moved_at = now
                if self._canary is not None and self._canary[0] in (None, label):
                    self._canary = None  # it moves again: a lost canary says nothing now
            known.last = _merge(known.last, fig)
            if not fig.busy or fig.sleeping:
                known.busy_from = None
            elif known.busy_from is None:
                known.busy_from = now

    def _observe_load(
        self,
        figures: dict[str, EngineFigures],
        now: Stamp,
        server_load: int | None,
        load_failed: bool,
    ) -> None:
        """Requests the API server holds that no engine's gauges show: they wait at a frozen
        engine (or, for a moment, in the API server's own hands)."""
        if server_load is None:
            self._load_misses = self._load_misses + 1 if load_failed else 0
            if not 0 < self._load_misses <= _LOAD_MISSES_KEPT:
                self._unaccounted, self._unaccounted_from, self._zero_reads = None, None, 0
            return
        self._load_misses = 0
        counted = sum(f.requests or 0 for f in figures.values())
        self._unaccounted = max(0, server_load - math.ceil(counted))
        if self._unaccounted > 0:
            self._zero_reads = 0
            if self._unaccounted_from is None:
                self._unaccounted_from = now
        else:
            self._zero_reads += 1
            if self._zero_reads >= _UNACCOUNTED_END:
                self._unaccounted_from = None

    def canary_lost(self, engine: str | None, sent_t: float, sent_wall: float) -> None:
        """A canary sent at `sent_t` to `engine` (None: whichever the server picked) got no
        answer within stall_after_s while the server answered /health: stalled from then,
        until that engine progresses or a later canary is answered."""
        self._canary = (engine, Stamp(sent_t, sent_wall))

    def canary_answered(self) -> None:
        """A canary came back: a lost one before it says nothing now."""
        self._canary = None

    def view(self, now: float, stall_after_s: float | None, fresh_s: float) -> StallView:
        """The verdict at monotonic `now` for `stall_after_s` (0 or None: detection off);
        figures older than `fresh_s` say nothing. The evidence, in order: an engine's own
        gauges, then requests the API server holds that no gauge shows, then a lost canary."""
        if not stall_after_s or stall_after_s <= 0:
            return UNKNOWN
        if self._seen_at is None or now - self._seen_at > fresh_s:
            return UNKNOWN
        if self._canary is None and self._calm(now, stall_after_s):
            # what nearly every view of a serving instance is, asked for each instance at
            # each poll: one shared answer per count of unaccounted requests
            calm = _CALM.get(self._unaccounted)
            if calm is None:
                if len(_CALM) >= 256:
                    _CALM.clear()
                calm = _CALM[self._unaccounted] = StallView(
                    stalled=False, unaccounted=self._unaccounted
                )
            return calm
        return self._stalled_or_calm(now, stall_after_s)

    def _stalled_or_calm(self, now: float, stall_after_s: float) -> StallView:
        """The full judgement of fresh figures (`view` without its shared calm answer)."""
        stuck = self._stuck_by_gauges(now, stall_after_s)
        # An engine stuck by its own gauges explains requests no gauge shows: those that
        # reached it after the last stats it sent. They name no other engine (a working rank
        # that finished its share and idles beside it is not stalled).
        if not stuck:
            for label, since in self._holders(now, stall_after_s).items():
                stuck[label] = (since, Evidence.SERVER)
        if self._canary is not None:
            lost_at, sent = self._canary
            for label in (lost_at,) if lost_at is not None else tuple(self._engines):
                stuck.setdefault(label, (sent, Evidence.CANARY))
        if not stuck:
            return StallView(stalled=False, unaccounted=self._unaccounted)
        return self._stalled(now, stuck)

    def _calm(self, now: float, stall_after_s: float) -> bool:
        """No engine busy without progress, and no spell of unaccounted requests, for
        stall_after_s: nothing `view` could call stalled but a lost canary (the same tests
        as `_stuck_by_gauges` and `_holders`, without building their answers)."""
        spell = self._unaccounted_from
        if spell is not None and now - spell.t >= stall_after_s:
            return False
        for track in self._engines.values():
            busy_from = track.busy_from
            if busy_from is not None and now - _later(busy_from, track.moved_at).t >= stall_after_s:
                return False
        return True

    def _stuck_by_gauges(
        self, now: float, stall_after_s: float
    ) -> dict[str, tuple[Stamp, Evidence]]:
        """The engines busy by their own gauges with no progress for stall_after_s."""
        stuck: dict[str, tuple[Stamp, Evidence]] = {}
        for label, track in self._engines.items():
            if track.busy_from is not None:
                since = _later(track.busy_from, track.moved_at)
                if now - since.t >= stall_after_s:
                    stuck[label] = (since, Evidence.ENGINE)
        return stuck

    def _holders(self, now: float, stall_after_s: float) -> dict[str, Stamp]:
        """The awake engines that hold requests only the API server counts, for
        stall_after_s or longer, and since when (none without such a spell)."""
        spell = self._unaccounted_from
        if spell is None or now - spell.t < stall_after_s:
            return {}
        awake = {label: track for label, track in self._engines.items() if not track.last.sleeping}
        # The engines that have not moved since these requests came hold them. When every
        # engine moved since (one of them froze later), those without progress for
        # stall_after_s.
        holders = {
            label: spell
            for label, track in awake.items()
            if track.moved_at is None or track.moved_at.t < spell.t
        }
        if not holders:
            holders = {
                label: _later(spell, track.moved_at)
                for label, track in awake.items()
                if now - _later(spell, track.moved_at).t >= stall_after_s
            }
        return holders

    def _stalled(self, now: float, stuck: dict[str, tuple[Stamp, Evidence]]) -> StallView:
        """The stalled verdict: since the earliest stuck engine, the strongest evidence, and
        the ranks when the server has several engines."""
        first = min((at for at, _why in stuck.values()), key=lambda s: s.t)
        kinds = {why for _at, why in stuck.values()}
        evidence = next(e for e in Evidence if e in kinds)  # engine, then server, then canary
        ranks: tuple[int, ...] = ()
        if len(self._engines) > 1:
            ranks = tuple(sorted(int(e) for e in stuck if e.isdigit()))
        return StallView(
            stalled=True,
            since_wall=first.wall,
            for_s=max(0.0, now - first.t),
            evidence=evidence,
            ranks=ranks,
            unaccounted=self._unaccounted,
        )


def _later(a: Stamp, b: Stamp | None) -> Stamp:
    return b if b is not None and b.t > a.t else a


def _whole(m: VllmMetrics) -> EngineFigures:
    """The server's summed figures as one engine (a payload without per-engine series)."""
    return EngineFigures(
        requests_running=m.requests_running,
        requests_waiting=m.requests_waiting,
        prompt_tokens_total=m.prompt_tokens_total,
        generation_tokens_total=m.generation_tokens_total,
        request_success_total=m.request_success_total,
        kv_cache_usage=m.kv_cache_usage,
    )


def _progressed(before: EngineFigures, now: EngineFigures) -> bool:
    return (
        _grew(before.generation_tokens_total, now.generation_tokens_total)
        or _grew(before.prompt_tokens_total, now.prompt_tokens_total)
        or _grew(before.request_success_total, now.request_success_total)
        or _grew(before.kv_cache_usage, now.kv_cache_usage)
    )


def _grew(before: float | None, now: float | None) -> bool:
    return before is not None and now is not None and now > before


def _merge(before: EngineFigures, now: EngineFigures) -> EngineFigures:
    """The new figures, the old ones where this payload lacks a family. A lower counter is a
    reset (a new process): it becomes the new base."""

    def keep(old: float | None, new: float | None) -> float | None:
        return new if new is not None else old

    return EngineFigures(
        requests_running=now.requests_running,
        requests_waiting=now.requests_waiting,
        prompt_tokens_total=keep(before.prompt_tokens_total, now.prompt_tokens_total),
        generation_tokens_total=keep(before.generation_tokens_total, now.generation_tokens_total),
        request_success_total=keep(before.request_success_total, now.request_success_total),
        kv_cache_usage=keep(before.kv_cache_usage, now.kv_cache_usage),
        sleeping=now.sleeping,
    )
