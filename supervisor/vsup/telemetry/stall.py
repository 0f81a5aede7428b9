"""Stall detection: a server with work to do that processes no token at all.

A vLLM server whose engine hangs (a GPU hang, a stuck collective, a frozen EngineCore) keeps
answering `/health` 200 and `/metrics` from its API process; only its figures stop moving.
`StallWatch` is fed every good scrape and says how long the server has had requests running or
waiting with no progress.

What counts as progress (vLLM 0.32, `vllm/v1/metrics/`), any one is enough:
- `vllm:generation_tokens_total` grew: a decode step produced tokens;
- `vllm:prompt_tokens_total` grew: a prefill finished (vLLM counts a request's prompt tokens
  once, in the step that gives its first token, not chunk by chunk);
- `vllm:kv_cache_usage_perc` rose: the scheduler allocated KV blocks for tokens it scheduled.
  This is the one figure that moves *during* a long chunked prefill: the scheduler sends its
  stats every step, even a step with no output, while the token counters and
  `vllm:iteration_tokens_total` (observed only for steps that give outputs) stay flat until
  the prefill ends. A fall of KV usage (requests finishing, aborted or preempted) is not
  progress by itself.
Request counts moving are not progress: requests keep arriving at a hung engine.

Never stalled while idle (no request running or waiting), nor without a fresh scrape (a server
that does not answer is the health check's business). One engine step that takes longer than
`stall_after_s` without any of the above (a very long prefill with chunked prefill off) looks
like a stall: set `stall_after_s` above the longest step, or 0 to turn detection off.

Time comes from the caller (monotonic and wall seconds), so tests drive it without sleeping.
"""

from __future__ import annotations

from dataclasses import dataclass

from vsup.telemetry.metrics import VllmMetrics

DEFAULT_STALL_AFTER_S = 60.0


@dataclass(frozen=True)
class StallView:
    """What the watch says now. `stalled` is None when it cannot tell (no fresh figures)."""

    stalled: bool | None = None
    since_wall: float | None = None  # when the work without progress began (epoch s)
    for_s: float | None = None  # how long it has lasted (busy and no progress)


UNKNOWN = StallView()


class StallWatch:
    """Progress of one server run, from successive scrapes."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        """Forget everything (a new run: its counters start again)."""
        self._gen: float | None = None
        self._prompt: float | None = None
        self._kv: float | None = None
        self._busy_since: tuple[float, float] | None = None  # (monotonic, wall)
        self._progress_at: tuple[float, float] | None = None
        self._seen_at: float | None = None

    def observe(self, metrics: VllmMetrics, t: float, wall: float) -> None:
        """One good scrape read at monotonic `t` (wall-clock `wall`)."""
        progress = (
            _grew(self._gen, metrics.generation_tokens_total)
            or _grew(self._prompt, metrics.prompt_tokens_total)
            or _grew(self._kv, metrics.kv_cache_usage)
        )
        self._gen = _keep(self._gen, metrics.generation_tokens_total)
        self._prompt = _keep(self._prompt, metrics.prompt_tokens_total)
        self._kv = metrics.kv_cache_usage if metrics.kv_cache_usage is not None else self._kv
        self._seen_at = t
        busy = _busy(metrics)
        if busy is None:
            return  # the payload has no request gauges: nothing to judge
        if not busy:
            self._busy_since = None
            self._progress_at = None
            return
        if self._busy_since is None:
            self._busy_since = (t, wall)
        if progress or self._progress_at is None:
            self._progress_at = (t, wall)

    def view(self, now: float, stall_after_s: float | None, fresh_s: float) -> StallView:
        """The verdict at monotonic `now` for `stall_after_s` (0 or None: detection off);
        figures older than `fresh_s` say nothing."""
        if not stall_after_s or stall_after_s <= 0:
            return UNKNOWN
        if self._seen_at is None or now - self._seen_at > fresh_s:
            return UNKNOWN
        if self._busy_since is None or self._progress_at is None:
            return StallView(stalled=False)
        t0, wall0 = self._progress_at
        for_s = max(0.0, now - t0)
        if for_s < stall_after_s:
            return StallView(stalled=False)
        return StallView(stalled=True, since_wall=wall0, for_s=for_s)


def _grew(before: float | None, now: float | None) -> bool:
    return before is not None and now is not None and now > before


def _keep(before: float | None, now: float | None) -> float | None:
    # A lower counter is a reset (a new process): take it as the new base.
    return now if now is not None else before


def _busy(m: VllmMetrics) -> bool | None:
    if m.requests_running is None and m.requests_waiting is None:
        return None
    return (m.requests_running or 0) > 0 or (m.requests_waiting or 0) > 0
