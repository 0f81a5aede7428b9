"""Watching a rollout's canary wave (docs/canary.md): the engine's side of the gate.

Once the canary wave is ready and routed to, `watch` reads every instance of the rollout
(the canaries on the new spec, the others still on the old one) at the window's start and
again at the end of the warm-up (`canary_warmup_s`: the latencies of a fresh server's first
requests are not compared; every server's are measured from that same moment), waits out
`canary_s` (ending at once when a canary leaves `ready` or its run changes: a crash, a stall
restart, a person's stop), reads them again and lets the gate (canary.py) decide. Too few
requests with `canary_insufficient = "extend"` keeps the window open, re-deciding every
`canary_s`, until `canary_max_s`; after that, or with `pass`, the rollout goes on; with `fail`
it is rolled back. An operator can end the watch early (`Engine.end_canary_watch`).

Each server is read at `/metrics/?name[]=...` (only the canary's families, a few KB) with the
engine's keep-alive client; a server that does not answer is left out of the comparison (a
canary that does not answer at the end is judged on its state).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Protocol
from urllib.parse import urlencode

from vsup.engine.canary import CANARY_NAMES, Decision, Reading, Verdict, Window, decide
from vsup.engine.instance import Instance
from vsup.engine.states import State
from vsup.layout.spec import CanarySettings

if TYPE_CHECKING:
    from vsup.clock import Clock
    from vsup.engine.health import HttpGetter
    from vsup.engine.rollout import Rollout


class Engine(Protocol):
    """What the watch uses of the engine (engine.py; no import of it: no cycle)."""

    clock: Clock

    @property
    def instances(self) -> Mapping[str, Instance]: ...

    def http_client(self) -> HttpGetter: ...

    async def until(self, predicate: Callable[[], bool]) -> None: ...


_PATH = "/metrics/?" + urlencode([("name[]", n) for n in CANARY_NAMES])
READ_TIMEOUT_S = 5.0


async def read(engine: Engine, inst: Instance) -> Reading | None:
    """The gate's figures of `inst` now; None when it does not answer them."""
    try:
        answer = await engine.http_client().get(inst.spec.base_url + _PATH, READ_TIMEOUT_S)
    except (OSError, TimeoutError, ValueError):
        return None
    if answer.status != 200:
        return None
    return Reading.parse(answer.body.decode("utf-8", "replace"))


async def read_all(engine: Engine, names: tuple[str, ...]) -> dict[str, Reading]:
    insts = [engine.instances[n] for n in names if n in engine.instances]
    got = await asyncio.gather(*(read(engine, i) for i in insts))
    return {i.name: r for i, r in zip(insts, got, strict=True) if r is not None}


def _verdict(
    canaries: tuple[str, ...],
    before: Mapping[str, Reading],
    after: Mapping[str, Reading],
    seconds: float,
    settings: CanarySettings,
    warm: Mapping[str, Reading] | None = None,
    warmup_s: float = 0.0,
) -> Verdict:
    """Every canary against the old instances read at both ends (their latencies from
    `warm`, the readings at the end of the warm-up, `warmup_s` in, where a server has one);
    the worst answer wins (fail, then insufficient); their reasons joined."""
    warm = warm or {}

    def window(n: str) -> Window:
        return Window.between(before[n], after[n], seconds, warm.get(n))

    others = {n: window(n) for n in after if n in before and n not in canaries}
    verdicts = []
    for name in canaries:
        if name not in before or name not in after:
            verdicts.append(
                Verdict(
                    Decision.INSUFFICIENT,
                    f"canary {name}: not enough evidence (its figures could not be read)",
                )
            )
            continue
        verdicts.append(decide(name, window(name), others, settings))
    for decision in (Decision.FAIL, Decision.INSUFFICIENT, Decision.PASS):
        chosen = [v for v in verdicts if v.decision == decision]
        if chosen:
            figures = dict(chosen[0].figures)
            if warm:
                figures["warmup_s"] = round(warmup_s, 3)
            return Verdict(decision, "; ".join(v.reason for v in chosen), figures)
    return Verdict(Decision.INSUFFICIENT, "no canary left to watch")


async def watch(engine: Engine, rollout: Rollout, settings: CanarySettings) -> Verdict:
    """Watch `rollout`'s canary wave (ready) and return the gate's verdict, with the decision
    `insufficient` already turned into pass or fail as the layout says."""
    canaries = tuple(n for n in rollout.canaries if n in engine.instances)
    insts = [engine.instances[n] for n in canaries]
    runs = {i.name: i.run for i in insts}
    clock = engine.clock
    before = await read_all(engine, rollout.names)
    start = clock.monotonic()
    limit = settings.limit_s

    def changed() -> bool:
        return rollout.watch_decided is not None or any(
            i.state != State.READY or i.run != runs[i.name] for i in insts
        )

    deadline = settings.watch_s
    # the latencies are compared from the end of the warm-up (a fresh server's first requests
    # are slow), on every server alike; failures, restarts and stalls from the start
    warmup = min(settings.warmup, settings.watch_s)
    warming = warmup > 0
    warm: dict[str, Reading] | None = None
    warmup_s = 0.0
    while True:
        remaining = (warmup if warming else deadline) - (clock.monotonic() - start)
        if remaining > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(engine.until(changed), remaining)
        seconds = clock.monotonic() - start
        gone = [i for i in insts if i.state != State.READY or i.run != runs[i.name]]
        if gone:
            figures = {"seconds": round(seconds, 3)}
            parts = [
                f"canary {i.name}: {i.state} after {seconds:,.0f} s of watch (not ready on the "
                "new spec)"
                for i in gone
            ]
            return Verdict(Decision.FAIL, "; ".join(parts), figures)
        if rollout.watch_decided is not None:
            by_hand = Decision(rollout.watch_decided)
            word = "promoted" if by_hand == Decision.PASS else "aborted"
            return Verdict(by_hand, f"canary {', '.join(canaries)}: {word} by hand after "
                           f"{seconds:,.0f} s of watch")  # fmt: skip
        if warming:
            warm = await read_all(engine, rollout.names)
            warmup_s, warming = clock.monotonic() - start, False
            continue
        after = await read_all(engine, rollout.names)
        verdict = _verdict(canaries, before, after, seconds, settings, warm, warmup_s)
        if verdict.decision != Decision.INSUFFICIENT:
            return verdict
        if settings.insufficient == "extend" and seconds < limit - 0.05:
            deadline = min(limit, seconds + settings.watch_s)
            continue
        if settings.insufficient == "fail":
            return Verdict(Decision.FAIL, verdict.reason, verdict.figures)
        return verdict  # pass, or extend that ran out: nothing against it was seen
