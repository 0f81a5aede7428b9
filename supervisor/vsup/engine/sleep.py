"""vLLM's sleep mode: putting instances to sleep, waking them, swapping the members of a swap
group, and the start order that keeps a group within its GPU memory (docs/sleep.md).

A sleeping vLLM server is a live, healthy process (`ready`) that has given back its GPU memory
(level 1: weights copied to host RAM, KV cache dropped; level 2: both dropped) and must get no
request: vLLM holds a request sent to a sleeping server until the client gives up. So the sleep
state is kept beside the lifecycle state, never in it, and:
- before a sleep the instance leaves the router, its running requests end (bounded by its
  `drain_timeout_s`; still busy then: nothing sleeps, it rejoins and the sleep is refused with
  the count), then `POST /sleep?level=N`, `GET /is_sleeping`, and - where the GPU telemetry sees
  its processes - its memory must be seen released (`RELEASED_FRACTION` of what it held,
  within `RELEASE_TIMEOUT_S`; a server that answers the sleep and keeps the memory, as some
  ROCm builds do, is `asleep` with an error, and a swap does not wake the other member on it).
  Each step ends on its event, not on a timer: no settle wait after the router's removal, the
  requests in flight read at once and every DRAIN_POLL_S only while some run, the GPU read
  directly (`gpu_held_now`) every RELEASE_POLL_S while the release is awaited; each sleep,
  wake and swap says its steps' seconds (`phases`);
- a wake sends `POST /wake_up` (level 2: weights, `reload_weights`, then the KV cache), waits
  for `is_sleeping` false and one answered `max_tokens = 1` completion, then it rejoins the
  router;
- a swap group (`swap_group`) has at most one member awake: waking a member first puts the
  awake one to sleep, and a member's *start* waits (`wait` kind `swap_group`) while another
  member has a process that is not asleep, since vLLM profiles the GPU's free memory at start.
  Members meant to sleep start first and are put to sleep while they still hold their device's
  start turn; the member meant to be awake starts last. A member that dies while another is
  awake is started again when it is woken (its start waits at the gate meanwhile).
- Eviction by memory (`pool`): sleep-mode instances on a GPU without a swap group are awake
  together while they fit; waking one first puts the least recently used awake ones to sleep
  (each drained first; a busy one is passed over) until its measured awake memory fits.
- Idle sleep (`sleep.after_idle_s`): the daemon reports activity each poll (`observe`) and
  asks for the instances idle that long (`idle_due`).
- What sleep leaves behind: each sleep's kept memory is recorded per process (`kept`); with
  `sleep.recycle_growth_gib` a sleeper whose kept memory grew that much is restarted while it
  sleeps (`recycle_due`, `recycle`).
- Reconciliation: vsup's own view can be wrong when its operation was not seen to the end (a
  daemon killed during a sleep: the server finishes it alone) or when someone else used the
  dev-mode endpoints. An adopted instance starts `unknown` (out of the router; `vsup wake`
  works on it) until its server says (`reconcile`): `GET /is_sleeping`, and the API server's
  `/metrics` (answered while the engine is busy) - a sleep or wake call in flight there
  (`vllm:sleep_mode_operations_in_flight`) is `falling_asleep` or `waking`, the sleep-state
  gauge (`vllm:engine_sleep_state`) says asleep and at which level. It is asked again every
  `RECONCILE_POLL_S` until the answer is final (awake or asleep, nothing in flight). Each
  daemon poll also hands the latest scrape to `observe_server`: a gauge or a call in flight
  that disagrees with vsup's view (with no operation of vsup's under way) starts the same
  reconciliation.

Operations on one instance never overlap (a lock per instance); the router's membership leaves a
non-awake instance out (`excluded`), and stall detection and canaries leave it alone.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from vsup.engine import health, stop
from vsup.journalevents import (
    DrainEvent,
    JournalEvent,
    SleepEvent,
    SleepFailedEvent,
    SwapEvent,
    WakeEvent,
    WakeFailedEvent,
)
from vsup.snapshot import SleepStatus, WaitReason
from vsup.states import DONE_STARTING, SleepState, State
from vsup.telemetry.httpget import HttpError
from vsup.telemetry.metrics import VllmMetrics, parse_metrics

if TYPE_CHECKING:
    from vsup.clock import Clock
    from vsup.engine.instance import Instance
    from vsup.engine.memory import GpuMemory, GpuMemoryView
    from vsup.engine.stop import RequestsRunning
    from vsup.telemetry.httpget import HttpGetter


class SleepHost(Protocol):
    """What the sleeper uses of the engine (engine.py's Engine is one; a Protocol, so this
    module imports neither the engine nor its router)."""

    clock: Clock
    gpu_memory: GpuMemoryView | None
    requests_running: RequestsRunning | None
    router: Any  # engine.routing.RouterSupervisor: leave, joined, wake, membership

    @property
    def instances(self) -> Mapping[str, Instance]: ...

    def emit(self, inst: Instance | None, event: JournalEvent) -> None: ...

    def notify(self) -> None: ...

    def http_client(self) -> HttpGetter: ...

    def spawn_background(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task: ...

    async def start(self, name: str, wait: bool = False, automatic: bool = False) -> None: ...

    async def wait(
        self, name: str, states: Iterable[str] = ..., timeout: float | None = None
    ) -> State: ...

    async def restart(self, name: str, drain: bool = False, wait: bool = False) -> None: ...


log = logging.getLogger("vsup.engine")

SLEEP_TIMEOUT_S = 300.0  # POST /sleep: level 1 copies the weights to host RAM first
WAKE_TIMEOUT_S = 600.0  # POST /wake_up (level 2 reloads the weights from disk)
ANSWER_TIMEOUT_S = 120.0  # the first completion after a wake
# After /sleep answered, the instance's GPU memory must fall to this share of what it held
# (seen on an H200: 1.7 of 64.6 GiB kept, 2.6%) within RELEASE_TIMEOUT_S.
RELEASED_FRACTION = 0.25
RELEASE_TIMEOUT_S = 30.0
# While a release is awaited the GPU is read directly (NVML/amdsmi through the daemon's probe,
# `gpu_held_now`) this often, not through the telemetry's once-a-second sample.
RELEASE_POLL_S = 0.05
# A drain reads the instance's requests in flight this often (only while some run), and once
# traffic was seen, reads idle once more this much later: the router may have sent a request
# just before the removal that the server had not counted yet.
DRAIN_POLL_S = 0.05
DRAIN_SETTLE_S = 0.1
# host RAM a level-1 sleep wants free beyond the weights themselves (pinned-buffer slack)
HOST_RAM_MARGIN = 1.1
HELD_WAIT_S = 3.0  # for the telemetry's first figure of a server that just became ready
# Reconciling vsup's view with the server's (see the module doc): each read waits this long
# for /is_sleeping and /metrics (an engine busy with a sleep answers /is_sleeping only after
# it: a GPU's first level-1 sleep takes 9-14 s), and is repeated this often until it is final.
RECONCILE_READ_S = 3.0
RECONCILE_POLL_S = 1.0
# A disagreement seen in the daemon's scrapes is checked with the server at most this often.
DRIFT_CHECK_S = 5.0
# Validation's limits (layout/schema.py, which the engine does not import; a unit test keeps
# them equal): what one GPU's instances may claim together, and vLLM's default share.
MAX_GPU_UTILIZATION_SUM = 0.95
VLLM_DEFAULT_GPU_MEMORY_UTILIZATION = 0.92
KEPT_HISTORY = 20  # sleeps whose kept memory a track remembers
# What the server's answer can be: final, or under way (asked again)
_FINAL = (SleepState.AWAKE, SleepState.ASLEEP)


class SleepRefused(Exception):
    """A sleep, wake or swap that cannot be done or failed; the message is for the operator."""


@dataclass
class SleepTrack:
    """One sleep-mode instance's sleep state, as vsup drives and last saw it."""

    level: int
    state: SleepState = SleepState.AWAKE
    since: float = 0.0  # clock monotonic of the last change
    want_awake: bool = True  # what the operator (or the layout) asked for last
    last_sleep_s: float | None = None
    last_wake_s: float | None = None
    error: str | None = None
    held_bytes: int | None = None
    active_at: float | None = None  # the last poll that saw work (idle sleep, eviction order)
    awake_bytes: int | None = None  # what it held awake, measured before its last sleep
    # what it kept on the GPU after each sleep of this process (the latest KEPT_HISTORY)
    kept: list[int] = field(default_factory=list)
    recycling: bool = False  # restarted for what it kept (sleep.recycle_growth_gib), not back yet
    lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)
    # reconciling with the server (see the module doc): the task, set once it first answered,
    # and when a disagreement in the scrapes was last checked
    reconciling: asyncio.Task | None = field(default=None, repr=False)
    told: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    drift_checked: float | None = None


class Sleeper:
    """Sleep, wake and swap for the engine's instances (see the module doc)."""

    def __init__(self, engine: SleepHost) -> None:
        self.e = engine
        self._tracks: dict[str, SleepTrack] = {}
        self.on_change: Callable[[], None] | None = None  # a sleep state changed
        # A level-1 sleep copies the weights to host RAM: the daemon tells their size (vLLM's
        # start-up log, telemetry/memprofile.py; None: unknown, not checked) and the host RAM
        # available now (psutil's `available`).
        self.weights_of: Callable[[str], int | None] = lambda _name: None
        # The engine's own running + waiting, read fresh (None: unknown): a drain that ends
        # with the API server's /load above 0 while the engine holds nothing sleeps anyway.
        self.engine_requests: Callable[[str], Awaitable[float | None]] | None = None
        self.host_available: Callable[[], int] = _host_available
        # What the instance's processes hold on its GPUs, read from the GPU now (the daemon's
        # probe: NVML/amdsmi; None: not known). Without it the telemetry's latest sample.
        self.gpu_held_now: Callable[[str], Awaitable[int | None]] | None = None
        # The GPUs' memory read now (same probe), for eviction by memory; None: the sample.
        self.gpu_memory_now: (
            Callable[[tuple[int, ...]], Awaitable[Sequence[GpuMemory] | None]] | None
        ) = None

    # -- reading ------------------------------------------------------------------------------

    def track(self, name: str) -> SleepTrack | None:
        """The sleep state of a sleep-mode instance (made on first use); None for others."""
        inst = self.e.instances.get(name)
        if inst is None or inst.spec.sleep is None:
            self._tracks.pop(name, None)
            return None
        t = self._tracks.get(name)
        if t is None:
            t = self._tracks[name] = SleepTrack(
                level=inst.spec.sleep.level,
                since=self.e.clock.monotonic(),
                want_awake=self._starts_awake(inst),
            )
        return t

    def excluded(self, name: str) -> bool:
        """Whether a ready instance must get no request because it is not awake."""
        t = self._tracks.get(name)
        # not awake, or about to sleep (a member meant to sleep once its start is done: it must
        # not join the router for the moment before its sleep)
        return t is not None and (t.state != SleepState.AWAKE or not t.want_awake)

    def settled(self, name: str) -> bool:
        """No sleep, wake, recycle or reconciliation under way (or not in sleep mode): awake
        as wanted, or asleep as wanted. An unsettled instance is scraped every poll."""
        t = self._tracks.get(name)
        if t is None:
            return True
        if t.lock.locked() or t.recycling:
            return False
        if t.reconciling is not None and not t.reconciling.done():
            return False
        return (t.state == SleepState.AWAKE and t.want_awake) or (
            t.state == SleepState.ASLEEP and not t.want_awake
        )

    def awake(self, name: str) -> bool:
        """False while the instance sleeps, falls asleep or wakes (no canary, no stall)."""
        return not self.excluded(name)

    def status(self, name: str) -> SleepStatus | None:
        inst = self.e.instances.get(name)
        t = self.track(name)
        if inst is None or t is None:
            return None
        now = self.e.clock.monotonic()
        idle_in = None
        after = inst.spec.sleep.after_idle_s if inst.spec.sleep else 0.0
        if after > 0 and t.state == SleepState.AWAKE and inst.state == State.READY:
            since = t.active_at if t.active_at is not None else inst.state_since
            idle_in = round(max(0.0, after - (now - since)), 1)
        return SleepStatus(
            state=t.state,
            level=t.level,
            group=inst.spec.swap_group,
            since_s=round(now - t.since, 3),
            last_sleep_s=t.last_sleep_s,
            last_wake_s=t.last_wake_s,
            error=t.error,
            held_bytes=t.held_bytes if t.state == SleepState.ASLEEP else None,
            idle_sleep_in_s=idle_in,
            kept_bytes=tuple(t.kept),
            kept_growth_bytes=t.kept[-1] - t.kept[0] if len(t.kept) > 1 else None,
        )

    def members(self, group: str) -> list[Instance]:
        """The instances of swap group `group`, in layout order."""
        return [i for i in self.e.instances.values() if i.spec.swap_group == group]

    def pool(self, inst: Instance) -> list[Instance]:
        """The other sleep-mode instances without a swap group that share a GPU with `inst`
        (itself one): awake together while their memory fits, evicted by memory (least
        recently used first) when one wakes. Empty for anything else."""
        if not _pooled(inst):
            return []
        gpus = set(inst.spec.gpus)
        return [
            i
            for i in self.e.instances.values()
            if i is not inst and _pooled(i) and gpus & set(i.spec.gpus)
        ]

    def _starts_awake(self, inst: Instance) -> bool:
        """What `vsup up` leaves it as: the `start` key, else awake - except in a swap group,
        where only the first member in layout order (or the one with start = "awake") is."""
        sleep = inst.spec.sleep
        if sleep is not None and sleep.start is not None:
            return sleep.start == "awake"
        group = inst.spec.swap_group
        if group is None:
            return self._fits_at_start(inst)
        members = self.members(group)
        chosen = [m for m in members if m.spec.sleep and m.spec.sleep.start == "awake"]
        if chosen:
            return False
        eligible = [m for m in members if not (m.spec.sleep and m.spec.sleep.start == "asleep")]
        return bool(eligible) and eligible[0].name == inst.name

    def _fits_at_start(self, inst: Instance) -> bool:
        """A pool member (see `pool`) starts awake when its utilization, beside the pool's
        earlier members (layout order) that start awake and the GPU's other instances (a swap
        group by its largest member), stays within MAX_GPU_UTILIZATION_SUM on each of its
        GPUs; the others start asleep. Anything else starts awake."""
        if not _pooled(inst) or not self.pool(inst):
            return True
        order = list(self.e.instances.values())
        for gpu in inst.spec.gpus:
            claim = _utilization(inst)
            groups: dict[str, float] = {}
            for other in order:
                if other is inst or gpu not in other.spec.gpus:
                    continue
                if _pooled(other):
                    if order.index(other) < order.index(inst) and self._starts_awake(other):
                        claim += _utilization(other)
                elif other.spec.swap_group is not None:
                    g = other.spec.swap_group
                    groups[g] = max(groups.get(g, 0.0), _utilization(other))
                else:
                    claim += _utilization(other)
            if claim + sum(groups.values()) > MAX_GPU_UTILIZATION_SUM + 1e-9:
                return False
        return True

    # -- the start gate -----------------------------------------------------------------------

    def gate(self, inst: Instance) -> WaitReason | None:
        """What a swap-group member's start waits for (None: it may start now)."""
        group = inst.spec.swap_group
        t = self.track(inst.name)
        if t is None:
            return None
        if group is None:
            return self._pool_gate(inst, t)
        for other in self.members(group):
            if other is inst:
                continue
            ot = self.track(other.name)
            if other.pid is not None and (ot is None or ot.state != SleepState.ASLEEP):
                doing = {
                    State.STARTING: "is starting",
                    State.STOPPING: "is stopping",
                }.get(other.state) or (
                    "is falling asleep"
                    if ot is not None and ot.state == SleepState.FALLING_ASLEEP
                    else "is awake"
                )
                hint = (
                    f"; `vsup wake {inst.name}` puts it to sleep first"
                    if other.state == State.READY
                    and ot is not None
                    and ot.state == SleepState.AWAKE
                    else ""
                )
                return WaitReason(
                    kind="swap_group",
                    message=f"{other.name} {doing} in swap group {group}{hint}",
                    instances=(other.name,),
                )
            if (
                other.pid is None
                and other.control.wants_run
                and ot is not None
                and not ot.want_awake
                and t.want_awake
            ):
                return WaitReason(
                    kind="swap_group",
                    message=f"{other.name} starts first in swap group {group} (it sleeps once "
                    "ready)",
                    instances=(other.name,),
                )
        return None

    def _pool_gate(self, inst: Instance, t: SleepTrack) -> WaitReason | None:
        """What a pool member's start waits for: a member that is to sleep first (started,
        or not yet), and - when it is itself to sleep - room for its whole share beside the
        awake members (vLLM profiles the GPU's free memory at start)."""
        pool = self.pool(inst)
        awake_share = _utilization(inst)
        awake: list[str] = []
        for other in pool:
            ot = self.track(other.name)
            if ot is None:
                continue
            if other.pid is not None and ot.state != SleepState.ASLEEP:
                if ot.state == SleepState.FALLING_ASLEEP or (
                    not ot.want_awake and other.state in (State.STARTING, State.READY)
                ):
                    return WaitReason(
                        kind="swap_group",
                        message=f"{other.name} is going to sleep on a GPU it shares with "
                        f"{inst.name}",
                        instances=(other.name,),
                    )
                awake.append(other.name)
                awake_share += _utilization(other)
            elif (
                other.pid is None and other.control.wants_run and not ot.want_awake and t.want_awake
            ):
                return WaitReason(
                    kind="swap_group",
                    message=f"{other.name} starts first (it sleeps once ready)",
                    instances=(other.name,),
                )
        if not t.want_awake and awake and awake_share > MAX_GPU_UTILIZATION_SUM + 1e-9:
            return WaitReason(
                kind="swap_group",
                message=f"no room beside {', '.join(awake)} awake on its GPU; "
                f"`vsup wake {inst.name}` puts the least recently used to sleep",
                instances=tuple(awake),
            )
        return None

    def sleeps_after_start(self, inst: Instance) -> bool:
        """Whether an instance that just became ready is to be put to sleep now."""
        t = self.track(inst.name)
        return t is not None and not t.want_awake and t.state == SleepState.AWAKE

    def process_started(self, inst: Instance) -> None:
        """A new process of the instance: it starts awake."""
        t = self.track(inst.name)
        if t is not None:
            self._set(inst, t, SleepState.AWAKE)
            t.held_bytes = None
            t.active_at = self.e.clock.monotonic()  # a start is a use (eviction order)
            t.kept.clear()  # a new process: its own sleeps
            t.recycling = False

    def adopting(self, inst: Instance) -> None:
        """A process an earlier daemon left, just taken over: nothing is known of its sleep
        until its server says (`unknown`: out of the router, never shown awake meanwhile)."""
        t = self.track(inst.name)
        if t is not None:
            t.told.clear()
            self._set(inst, t, SleepState.UNKNOWN)

    async def adopted(self, inst: Instance) -> None:
        """The adopted process answers HTTP: its sleep state is what the server says, asked
        until the answer is final (in the background: the runner goes on supervising)."""
        t = self.track(inst.name)
        if t is not None:
            self._reconcile_soon(inst, t, "adopted")

    async def told(self, name: str) -> None:
        """Until the server of an adopted instance first said where its sleep is (a daemon's
        first status waits for it, bounded: restore.py)."""
        t = self._tracks.get(name)
        if t is not None and t.state == SleepState.UNKNOWN:
            await t.told.wait()

    def observe_server(self, name: str, metrics: VllmMetrics | None) -> None:
        """The daemon's latest scrape of a ready instance: a sleep or wake call in flight, or a
        sleep-state gauge that disagrees with vsup's view while no operation of vsup's runs,
        is checked with the server (at most every DRIFT_CHECK_S)."""
        t = self._tracks.get(name)
        inst = self.e.instances.get(name)
        if t is None or inst is None or metrics is None or t.state not in _FINAL:
            return
        if t.lock.locked() or (t.reconciling is not None and not t.reconciling.done()):
            return
        in_flight = bool(metrics.sleeps_in_flight) or bool(metrics.wakes_in_flight)
        disagrees = metrics.sleeping is not None and metrics.sleeping != (
            t.state == SleepState.ASLEEP
        )
        if not (in_flight or disagrees):
            return
        now = self.e.clock.monotonic()
        if t.drift_checked is not None and now - t.drift_checked < DRIFT_CHECK_S:
            return
        t.drift_checked = now
        self._reconcile_soon(inst, t, "its server's metrics disagree with vsup's view")

    def _reconcile_soon(self, inst: Instance, t: SleepTrack, why: str) -> None:
        if t.reconciling is None or t.reconciling.done():
            t.reconciling = self.e.spawn_background(self._reconcile(inst, t, why))

    async def _reconcile(self, inst: Instance, t: SleepTrack, why: str) -> None:
        """Ask the server until its answer is final (see the module doc). An operation of
        vsup's on the instance (which holds the lock) or another process ends it."""
        proc = inst.process
        while inst.process is proc and proc is not None and proc.alive:
            async with t.lock:
                if inst.process is not proc:
                    return
                seen, level = await self._server_state(inst)
                if seen is not None:
                    t.told.set()
                    if level is not None:
                        t.level = level
                    if seen == SleepState.ASLEEP:
                        t.want_awake = False
                    elif seen == SleepState.AWAKE:
                        t.want_awake = True
                    if seen != t.state:
                        log.info(
                            "%s: its server says %s (vsup had %s; %s)", inst.name, seen, t.state,
                            why,
                        )  # fmt: skip
                        self._set(inst, t, seen)
                    if seen in _FINAL:
                        self._rejoin(inst.name)  # out while not awake (`excluded`)
                        return
            await asyncio.sleep(RECONCILE_POLL_S)

    async def _server_state(self, inst: Instance) -> tuple[SleepState | None, int | None]:
        """Where the server says its sleep is (None: it does not say), and the level it sleeps
        at when its metrics tell. A call in flight wins: /is_sleeping says true from the moment
        a sleep pauses the scheduler, before the memory is given back."""
        metrics = await self._metrics(inst)
        level = metrics.sleep_level if metrics is not None else None
        if metrics is not None and metrics.sleeps_in_flight:
            return SleepState.FALLING_ASLEEP, level
        if metrics is not None and metrics.wakes_in_flight:
            return SleepState.WAKING, level
        sleeping = await self._is_sleeping(inst, RECONCILE_READ_S)
        if sleeping is not None:
            return (SleepState.ASLEEP if sleeping else SleepState.AWAKE), level
        if metrics is not None and metrics.sleeping:
            # the gauge is set once a sleep is done: asleep, whatever keeps the engine busy now
            return SleepState.ASLEEP, level
        return None, level

    async def _metrics(self, inst: Instance) -> VllmMetrics | None:
        try:
            resp = await self.e.http_client().get(
                inst.spec.base_url + "/metrics", RECONCILE_READ_S, 2.0
            )
        except (HttpError, OSError):
            return None
        if resp.status != 200:
            return None
        return parse_metrics(resp.body.decode("utf-8", "replace"))

    # -- idle sleep ---------------------------------------------------------------------------

    def observe(self, name: str, active: bool) -> None:
        """The daemon's poll: whether the instance had work (requests, tokens) this time."""
        t = self._tracks.get(name)
        if t is not None and active:
            t.active_at = self.e.clock.monotonic()

    def idle_due(self) -> list[str]:
        """Awake, ready instances with `after_idle_s` and no work for that long."""
        out = []
        now = self.e.clock.monotonic()
        for name, inst in self.e.instances.items():
            sleep = inst.spec.sleep
            t = self._tracks.get(name)
            if sleep is None or t is None or sleep.after_idle_s <= 0:
                continue
            if inst.state != State.READY or t.state != SleepState.AWAKE or t.lock.locked():
                continue
            since = max(t.active_at or 0.0, inst.state_since, t.since)
            if now - since >= sleep.after_idle_s:
                out.append(name)
        return out

    # -- what sleep leaves behind ---------------------------------------------------------------

    def recycle_due(self) -> list[str]:
        """Sleepers with `sleep.recycle_growth_gib` whose kept memory grew that much since
        their process's first sleep, asleep now, whose restart can go back to sleep at once
        (its swap group all asleep; its pool with room for its start)."""
        return [
            name
            for name, inst in self.e.instances.items()
            if (t := self._tracks.get(name)) is not None
            and not t.lock.locked()
            and self._recyclable(inst, t)
        ]

    def _recyclable(self, inst: Instance, t: SleepTrack) -> bool:
        sleep = inst.spec.sleep
        if sleep is None or sleep.recycle_growth_gib <= 0 or len(t.kept) < 2 or t.recycling:
            return False
        if inst.state != State.READY or inst.pid is None or t.state != SleepState.ASLEEP:
            return False
        if t.kept[-1] - t.kept[0] < sleep.recycle_growth_gib * 2**30:
            return False
        if inst.spec.swap_group is not None:
            return all(
                o.pid is None or (ot := self._tracks.get(o.name)) is None
                or ot.state == SleepState.ASLEEP
                for o in self._group_of(inst)
            )  # fmt: skip
        claim = _utilization(inst)
        for other in self.pool(inst):
            ot = self._tracks.get(other.name)
            if other.pid is not None and (ot is None or ot.state != SleepState.ASLEEP):
                claim += _utilization(other)
        return claim <= MAX_GPU_UTILIZATION_SUM + 1e-9

    async def recycle(self, name: str) -> bool:
        """Restart a sleeper whose kept memory grew (see `recycle_due`); its new process goes
        back to sleep once ready, keeping only what a first sleep keeps. False: no longer due."""
        inst, t = self._sleep_mode(name)
        async with t.lock:
            if not self._recyclable(inst, t):
                return False
            log.info(
                "%s: keeps %s GiB more asleep than after its first sleep: restarting it",
                name, _gib(t.kept[-1] - t.kept[0]),
            )  # fmt: skip
            t.want_awake, t.recycling = False, True
            await self.e.restart(name)
        return True

    # -- operations ---------------------------------------------------------------------------

    async def sleep(self, name: str, level: int | None = None, why: str = "operator") -> dict:
        """Put `name` to sleep (see the module doc). Raises SleepRefused."""
        inst, t = self._sleep_mode(name)
        async with t.lock:
            return await self._sleep_locked(inst, t, level, why)

    async def wake(self, name: str, why: str = "operator") -> dict:
        """Wake `name`; in a swap group the awake member sleeps first (the answer's
        `group_slept` lists those sleeps' answers). Raises SleepRefused."""
        inst, t = self._sleep_mode(name)
        group = inst.spec.swap_group
        t.want_awake = True
        slept: list[dict] = []
        if group is not None:
            for other in self.members(group):
                ot = self.track(other.name)
                if other is inst or ot is None:
                    continue
                ot.want_awake = False
                if other.pid is not None and ot.state != SleepState.ASLEEP:
                    try:
                        slept.append(
                            await self.sleep(other.name, why=f"{name} wakes in swap group {group}")
                        )
                    except SleepRefused as exc:
                        t.want_awake = False
                        raise SleepRefused(
                            f"{name} stays asleep: {other.name} must sleep first and did not "
                            f"({exc})"
                        ) from exc
        elif self.pool(inst) and not (
            t.state == SleepState.AWAKE and inst.pid is not None and inst.state == State.READY
        ):
            try:
                slept += await self._make_room(inst, t)
            except SleepRefused:
                t.want_awake = False
                raise
        async with t.lock:
            if inst.pid is None or inst.state != State.READY:
                woke = await self._start_awake(inst, t, why)
            else:
                woke = await self._wake_locked(inst, t, why)
        return {**woke, "group_slept": slept} if slept else woke

    async def swap(self, a: str, b: str) -> dict:
        """`a` sleeps (its memory seen released), then `b` wakes; when `b` does not come up,
        `a` is woken again so the GPU serves what it served before."""
        if a == b:
            raise SleepRefused(f"swap {a} {a}: name two instances")
        self._sleep_mode(a)
        self._sleep_mode(b)
        t0 = self.e.clock.monotonic()
        slept = await self.sleep(a, why=f"swap to {b}")
        try:
            woke = await self.wake(b, why=f"swap from {a}")
        except SleepRefused as exc:
            try:
                await self.wake(a, why=f"swap to {b} failed")
                back = f"; {a} is awake again"
            except SleepRefused as again:
                back = f"; {a} did not wake again either ({again})"
            raise SleepRefused(f"{b} did not wake ({exc}){back}") from exc
        took = round(self.e.clock.monotonic() - t0, 3)
        # the two operations' phases in order (their keys differ), plus what came between
        phases = {**slept.get("phases", {}), **woke.get("phases", {})}
        self.e.emit(self.e.instances[b], SwapEvent(slept=a, took_s=took, phases=phases or None))
        return {"slept": slept, "woke": woke, "took_s": took, "phases": phases}

    # -- internals ----------------------------------------------------------------------------

    def _sleep_mode(self, name: str) -> tuple[Instance, SleepTrack]:
        inst = self.e.instances.get(name)
        if inst is None:
            raise SleepRefused(f"unknown instance {name!r}")
        t = self.track(name)
        if t is None:
            raise SleepRefused(
                f"{name} does not use sleep mode: give it a sleep table in the layout "
                "(sleep = { level = 1 }) and apply it"
            )
        return inst, t

    def _set(self, inst: Instance, t: SleepTrack, state: SleepState) -> None:
        if t.state != state:
            t.state, t.since = state, self.e.clock.monotonic()
        for other in self._group_of(inst):
            other.control.kick.set()  # a start waiting at the gate looks again
        self.e.router.wake()
        self.e.notify()
        if self.on_change is not None:
            self.on_change()

    def _group_of(self, inst: Instance) -> list[Instance]:
        """Those whose start gate depends on `inst`'s sleep state: its swap group, its pool."""
        group = inst.spec.swap_group
        return [m for m in self.members(group) if m is not inst] if group else self.pool(inst)

    # -- eviction by memory -------------------------------------------------------------------

    async def _make_room(self, inst: Instance, t: SleepTrack) -> list[dict]:
        """Before a pool member wakes (or starts): put the pool's awake members to sleep, the
        least recently used first, until its awake memory fits on each of its GPUs; each
        sleep drains first (one still busy after its drain_timeout_s is skipped, awake).
        The answers of those sleeps; SleepRefused when it cannot fit."""
        slept: list[dict] = []
        skipped: dict[str, str] = {}
        while True:
            short = await self._shortfall(inst, t)
            if short is None:
                return slept
            candidates = [
                m
                for m in self.pool(inst)
                if m.name not in skipped
                and m.pid is not None
                and m.state == State.READY
                and (mt := self._tracks.get(m.name)) is not None
                and mt.state == SleepState.AWAKE
                and set(m.spec.gpus) & set(short[0])
            ]
            if not candidates:
                why = "; ".join(f"{n}: {e}" for n, e in skipped.items())
                raise SleepRefused(
                    f"{inst.name} stays asleep: it needs {short[1]} on GPU "
                    f"{','.join(map(str, short[0]))} and no awake instance there could be "
                    "put to sleep" + (f" ({why})" if why else "")
                )
            candidates.sort(key=self._last_used)
            victim = candidates[0]
            try:
                slept.append(
                    await self.sleep(
                        victim.name,
                        why=f"{inst.name} wakes: least recently used, put to sleep for room",
                    )
                )
            except SleepRefused as exc:
                skipped[victim.name] = str(exc)

    def _last_used(self, inst: Instance) -> float:
        """When it last had work, woke or started (the daemon's polls: `observe`)."""
        t = self._tracks.get(inst.name)
        return t.active_at if t is not None and t.active_at is not None else inst.state_since

    async def _shortfall(self, inst: Instance, t: SleepTrack) -> tuple[tuple[int, ...], str] | None:
        """None when `inst` awake fits on its GPUs now; else the GPUs short and by how much
        (words). Measured: the GPU's free memory read now against what it held awake (its
        last sleep's figure, else its planned share); without a read of the GPU now (the
        telemetry's sample would not show an eviction a moment ago), the pool's utilizations."""
        gpus = tuple(inst.spec.gpus)
        figures = await self._gpu_now(gpus)
        if figures:
            per_gpu = len(figures)
            need = t.awake_bytes or self._planned_bytes(inst)
            if need is None:
                return None
            # what it holds asleep comes back with the wake: only the rest is needed
            kept = t.held_bytes if inst.pid is not None and t.held_bytes else 0
            want = max(0, need - kept) / per_gpu
            short = [g for g in figures if g.total_bytes - g.used_bytes < want]
            if not short:
                return None
            free = min(g.total_bytes - g.used_bytes for g in short)
            return tuple(g.index for g in short), f"{_gib(int(want))} GiB ({_gib(free)} free)"
        claim = _utilization(inst)
        for other in self.pool(inst):
            ot = self._tracks.get(other.name)
            if other.pid is not None and ot is not None and ot.state != SleepState.ASLEEP:
                claim += _utilization(other)
        if claim <= MAX_GPU_UTILIZATION_SUM + 1e-9:
            return None
        return gpus, f"{_utilization(inst):.2f} of the GPU beside the awake ({claim:.2f} in all)"

    def _planned_bytes(self, inst: Instance) -> int | None:
        util = inst.spec.gpu_memory_utilization
        if self.e.gpu_memory is None or not inst.spec.gpus or util is None:
            return None
        gpus = self.e.gpu_memory(tuple(inst.spec.gpus))
        return int(util * sum(g.total_bytes for g in gpus)) if gpus else None

    async def _gpu_now(self, gpus: tuple[int, ...]) -> Sequence[GpuMemory] | None:
        """The GPUs' memory read now (the daemon's probe); None when it cannot be read."""
        if self.gpu_memory_now is None:
            return None
        try:
            return await self.gpu_memory_now(gpus)
        except Exception:
            log.exception("reading GPU memory failed")
            return None

    async def _sleep_locked(
        self, inst: Instance, t: SleepTrack, level: int | None, why: str
    ) -> dict:
        name = inst.name
        level = level if level is not None else t.level
        if t.state == SleepState.ASLEEP and level in (1, 2):
            t.want_awake = False
            return {"instance": name, "already": True, "level": t.level}
        self._check_sleepable(inst, t, level, why)
        t.want_awake = False
        t0 = self.e.clock.monotonic()
        before = await self._held_now(inst)
        self._set(inst, t, SleepState.FALLING_ASLEEP)
        phases = Phases(self.e.clock.monotonic)
        try:
            await self._fall_asleep(inst, level, phases)
        except SleepRefused as exc:
            t.want_awake = True
            t.error = f"sleep failed: {exc}"
            self._set(inst, t, SleepState.AWAKE)
            self._rejoin(name)
            self.e.emit(inst, SleepFailedEvent(level=level, why=why, error=str(exc)))
            raise
        t.level = level
        if before:
            t.awake_bytes = before
        kept = await self._await_release(inst, self._awake_bytes(inst, before))
        phases.mark("release_seen_s")
        took = round(self.e.clock.monotonic() - t0, 3)
        t.last_sleep_s, t.held_bytes = took, kept
        if kept is not None:
            t.kept = [*t.kept, kept][-KEPT_HISTORY:]
        t.error = self._release_error(inst, before, kept)
        self._set(inst, t, SleepState.ASLEEP)
        self._rejoin(name)  # its sleep state keeps it out of the router until it is awake
        self.e.emit(
            inst,
            SleepEvent(
                level=level,
                why=why,
                took_s=took,
                held_before=before,
                held_after=kept,
                error=t.error,
                phases=phases.done,
            ),
        )
        if t.error is not None:
            raise SleepRefused(f"{name} is {t.error}")
        return {
            "instance": name,
            "level": level,
            "took_s": took,
            "held_bytes": kept,
            "phases": phases.done,
        }

    def _check_sleepable(self, inst: Instance, t: SleepTrack, level: int, why: str) -> None:
        """SleepRefused unless `inst` can go to sleep at `level` now (level 1: host RAM for
        its weights, a refusal journaled as `sleep_failed`)."""
        if level not in (1, 2):
            raise SleepRefused(f"sleep level {level}: use 1 or 2")
        if inst.pid is None or inst.state != State.READY:
            raise SleepRefused(
                f"{inst.name} is {inst.state}: only a ready instance can be put to sleep"
            )
        if level == 1:
            try:
                self._check_host_ram(inst)
            except SleepRefused as exc:
                t.error = f"sleep failed: {exc}"
                self.e.emit(inst, SleepFailedEvent(level=level, why=why, error=str(exc)))
                raise

    async def _fall_asleep(self, inst: Instance, level: int, phases: Phases) -> None:
        """Out of the router, drained, then vLLM's /sleep; SleepRefused when it could not.
        No settle wait after the removal: the drain reads what is in flight at once, and
        only when something is does it wait (see `_drain`)."""
        name = inst.name
        await self.e.router.leave(name)
        phases.mark("leave_router_s")
        drained, waited, left = await self._drain(inst)
        phases.mark("drain_s")
        if drained is False and await self._engine_idle(inst):
            # /load counts requests the engine does not hold: ones still in the API
            # server's hands (the paused scheduler keeps them for the wake) or a count
            # vLLM never took back (seen on CPU vLLM 0.32 behind vllm-router)
            why_anyway = f"/load still {left:g} while its engine runs none: sleeps anyway"
            self.e.emit(
                inst,
                DrainEvent(drained=False, waited_s=round(waited, 3), requests=left, why=why_anyway),
            )
            drained = True
        if drained is False:
            raise SleepRefused(
                f"{name} still runs {left:g} request(s) after {waited:.0f} s "
                f"(drain_timeout_s); nothing slept - try again when it is quieter"
            )
        # mode=wait: vLLM 0.32 lets requests in flight end (its default aborts them); older
        # versions ignore the parameter, and the drain above covers them
        await self._post(inst, f"/sleep?level={level}&mode=wait", SLEEP_TIMEOUT_S)
        if await self._is_sleeping(inst) is False:
            raise SleepRefused(f"{name} answered the sleep but says it is not sleeping")
        phases.mark("sleep_call_s")

    def _release_error(self, inst: Instance, before: int | None, kept: int | None) -> str | None:
        """Why an instance that went to sleep is not really asleep: its memory stayed held."""
        awake_bytes = self._awake_bytes(inst, before)
        if awake_bytes and kept is not None and kept > awake_bytes * RELEASED_FRACTION:
            return (
                f"asleep but its GPU memory was not released ({_gib(kept)} GiB still held "
                f"{RELEASE_TIMEOUT_S:.0f} s after the sleep, of {_gib(awake_bytes)} GiB awake)"
            )
        return None

    async def _wake_locked(self, inst: Instance, t: SleepTrack, why: str) -> dict:
        name = inst.name
        if t.state == SleepState.AWAKE:
            self._rejoin(name)
            return {"instance": name, "already": True}
        t0 = self.e.clock.monotonic()
        self._set(inst, t, SleepState.WAKING)
        phases = Phases(self.e.clock.monotonic)
        try:
            if t.level == 2:
                await self._post(inst, "/wake_up?tags=weights", WAKE_TIMEOUT_S)
                await self._post(
                    inst,
                    "/collective_rpc",
                    WAKE_TIMEOUT_S,
                    json.dumps({"method": "reload_weights"}).encode(),
                )
                await self._post(inst, "/wake_up?tags=kv_cache", WAKE_TIMEOUT_S)
            else:
                await self._post(inst, "/wake_up", WAKE_TIMEOUT_S)
            if await self._is_sleeping(inst):
                raise SleepRefused(f"{name} answered the wake but says it is still sleeping")
            phases.mark("wake_call_s")
            await self._answers(inst)
            phases.mark("first_answer_s")
        except SleepRefused as exc:
            t.error = f"wake failed: {exc}"
            sleeping = await self._is_sleeping(inst)
            t.want_awake = False
            self._set(inst, t, SleepState.ASLEEP if sleeping is not False else SleepState.AWAKE)
            self.e.emit(inst, WakeFailedEvent(why=why, error=str(exc)))
            raise
        took = round(self.e.clock.monotonic() - t0, 3)
        t.last_wake_s, t.error, t.held_bytes = took, None, None
        t.active_at = self.e.clock.monotonic()
        self._set(inst, t, SleepState.AWAKE)
        self._rejoin(name)
        joined = await self.e.router.joined(name)
        phases.mark("rejoin_s")
        self.e.emit(
            inst,
            WakeEvent(why=why, took_s=took, level=t.level, in_router=joined, phases=phases.done),
        )
        return {"instance": name, "took_s": took, "phases": phases.done}

    async def _start_awake(self, inst: Instance, t: SleepTrack, why: str) -> dict:
        """Waking a member with no ready process: it starts (cold), awake."""
        name = inst.name
        t0 = self.e.clock.monotonic()
        if not inst.control.wants_run:
            await self.e.start(name)
        else:
            inst.control.kick.set()
        try:
            state = await self.e.wait(name, DONE_STARTING, inst.spec.start_timeout_s + 60)
        except TimeoutError:
            state = inst.state
        if state != State.READY:
            raise SleepRefused(f"{name} was not running and its start ended {state}")
        took = round(self.e.clock.monotonic() - t0, 3)
        self.e.emit(inst, WakeEvent(why=why, took_s=took, cold=True, level=t.level))
        return {"instance": name, "took_s": took, "cold": True}

    def _check_host_ram(self, inst: Instance) -> None:
        """A level-1 sleep needs host RAM for the weights (vLLM pins a buffer that size): refuse
        it, with the figures, when the node does not have it available now."""
        weights = self.weights_of(inst.name)
        if not weights:
            return
        available = self.host_available()
        need = int(weights * HOST_RAM_MARGIN)
        if available < need:
            raise SleepRefused(
                f"a level-1 sleep of {inst.name} copies its {_gib(weights)} GiB of weights to "
                f"host RAM and only {_gib(available)} GiB is available: use --level 2 (the wake "
                "reloads them from disk) or free host memory; nothing slept"
            )

    def _rejoin(self, name: str) -> None:
        membership = self.e.router.membership
        if membership is not None:
            membership.rejoin(name)
        self.e.router.wake()

    async def _drain(self, inst: Instance) -> tuple[bool | None, float, float]:
        spec = inst.spec
        load = None
        if spec.load_tracking:
            client = self.e.http_client()

            async def read() -> int | None:
                return await health.server_load(client, spec.base_url)

            load = read
        requests = self.e.requests_running
        t0 = time.monotonic()
        drained, waited, first = await stop.drain(
            requests, inst.name, spec.drain_timeout_s, poll_s=DRAIN_POLL_S, server_load=load
        )
        # traffic was there: the router may have sent one more just before the removal that
        # the server had not counted yet - idle once more a moment later, else drain on
        while drained and first is not None and first > 0:
            await asyncio.sleep(DRAIN_SETTLE_S)
            again = await stop._in_flight(requests, inst.name, load)
            waited = time.monotonic() - t0
            if not again or again <= 0:
                break
            left_s = max(0.0, spec.drain_timeout_s - waited)
            drained, _w, first = await stop.drain(
                requests, inst.name, left_s, poll_s=DRAIN_POLL_S, server_load=load
            )
            waited = time.monotonic() - t0
        left = 0.0
        if drained is False:
            left = float(await stop._in_flight(self.e.requests_running, inst.name, load) or 0)
        return drained, waited, left

    async def _engine_idle(self, inst: Instance) -> bool:
        if self.engine_requests is None:
            return False
        value = await self.engine_requests(inst.name)
        return value is not None and value <= 0

    def _held(self, inst: Instance) -> int | None:
        """GPU bytes the instance's processes hold now, as the telemetry last saw them."""
        if self.e.gpu_memory is None or not inst.spec.gpus:
            return None
        gpus = self.e.gpu_memory(tuple(inst.spec.gpus))
        if not gpus:
            return None
        held = [h.bytes for g in gpus for h in g.holders if h.instance == inst.name and h.bytes]
        return sum(held) if held else None

    def _awake_bytes(self, inst: Instance, before: int | None) -> int | None:
        """What the instance holds awake: the larger of the telemetry's figure before the
        sleep (which may predate a wake a moment ago) and its planned share."""
        planned = None
        util = inst.spec.gpu_memory_utilization
        if self.e.gpu_memory is not None and inst.spec.gpus and util is not None:
            gpus = self.e.gpu_memory(tuple(inst.spec.gpus))
            if gpus:
                planned = int(util * sum(g.total_bytes for g in gpus))
        known = [v for v in (before, planned) if v]
        return max(known) if known else None

    async def _held_now(self, inst: Instance) -> int | None:
        """What the instance holds before its sleep: the telemetry polls once a second, so a
        server that just became ready (a member put to sleep after its start) may not be in
        its figures yet - wait for them up to HELD_WAIT_S where GPU telemetry runs."""
        fresh = await self._held_fresh(inst)
        if fresh is not None:
            return fresh
        held = self._held(inst)
        if held is not None or self.e.gpu_memory is None or not inst.spec.gpus:
            return held
        if self.e.gpu_memory(tuple(inst.spec.gpus)) is None:
            return None  # no GPU figures at all (no probe): nothing to wait for
        deadline = time.monotonic() + HELD_WAIT_S
        while held is None and time.monotonic() < deadline:
            await asyncio.sleep(RELEASE_POLL_S)
            held = self._held(inst)
        return held

    async def _await_release(self, inst: Instance, before: int | None) -> int | None:
        """What the instance holds once its memory is seen released (or after the timeout)."""
        if before is None:
            return None
        deadline = time.monotonic() + RELEASE_TIMEOUT_S
        held = await self._held_direct(inst)
        while held is not None and held > before * RELEASED_FRACTION:
            if time.monotonic() >= deadline:
                break
            await asyncio.sleep(RELEASE_POLL_S)
            held = await self._held_direct(inst)
        return held

    async def _held_fresh(self, inst: Instance) -> int | None:
        """What the instance holds, read from the GPU now (None: no direct read, or it says
        nothing of this instance)."""
        if self.gpu_held_now is None or not inst.spec.gpus or inst.pid is None:
            return None
        try:
            return await self.gpu_held_now(inst.name)
        except Exception:  # a driver surprise: the telemetry's sample decides
            log.exception("%s: reading its GPU memory failed", inst.name)
            return None

    async def _held_direct(self, inst: Instance) -> int | None:
        """The GPU's figure now where it can be read, else the telemetry's latest sample."""
        fresh = await self._held_fresh(inst)
        return fresh if fresh is not None else self._held(inst)

    def _headers(self, inst: Instance) -> dict[str, str]:
        import os

        key = os.environ.get(inst.spec.api_key_env) if inst.spec.api_key_env else None
        return {"Authorization": f"Bearer {key}"} if key else {}

    async def _post(self, inst: Instance, path: str, timeout: float, body: bytes = b"") -> None:
        url = inst.spec.base_url + path
        try:
            resp = await self.e.http_client().request(
                "POST", url, timeout, min(timeout, 5.0), body, self._headers(inst)
            )
        except (HttpError, OSError) as exc:
            raise SleepRefused(f"POST {path}: {exc}") from exc
        if resp.status == 404:
            raise SleepRefused(
                f"POST {path}: 404 - the server runs without sleep mode (started before its "
                "sleep table was applied? restart it)"
            )
        if resp.status != 200:
            text = resp.body[:300].decode("utf-8", "replace").strip()
            raise SleepRefused(f"POST {path}: HTTP {resp.status} {text}".rstrip())

    async def _is_sleeping(self, inst: Instance, timeout: float = 10.0) -> bool | None:
        try:
            resp = await self.e.http_client().get(
                inst.spec.base_url + "/is_sleeping", timeout, min(timeout, 2.0)
            )
            doc = json.loads(resp.body) if resp.status == 200 else None
        except (HttpError, OSError, ValueError):
            return None
        value = doc.get("is_sleeping") if isinstance(doc, Mapping) else None
        return value if isinstance(value, bool) else None

    async def _answers(self, inst: Instance) -> None:
        """One max_tokens = 1 completion, answered: the engine serves again."""
        model = inst.spec.served_model_name or inst.spec.model
        body = json.dumps({"model": model, "prompt": ".", "max_tokens": 1}).encode()
        url = inst.spec.base_url + "/v1/completions"
        try:
            resp = await self.e.http_client().post_json(
                url, body, ANSWER_TIMEOUT_S, 5.0, self._headers(inst)
            )
        except (HttpError, OSError) as exc:
            raise SleepRefused(f"no completion after the wake: {exc}") from exc
        if resp.status != 200:
            raise SleepRefused(f"the first completion after the wake answered HTTP {resp.status}")


class Phases:
    """Where an operation's time goes: each `mark(name)` records the seconds since the
    previous mark (or the start); `done` the marks so far, in order."""

    def __init__(self, now: Callable[[], float]) -> None:
        self._now = now
        self._last = now()
        self.done: dict[str, float] = {}

    def mark(self, name: str) -> None:
        now = self._now()
        self.done[name] = round(now - self._last, 3)
        self._last = now


def _pooled(inst: Instance) -> bool:
    """A sleep-mode instance on GPUs without a swap group: evicted by memory (`pool`)."""
    return inst.spec.sleep is not None and inst.spec.swap_group is None and bool(inst.spec.gpus)


def _utilization(inst: Instance) -> float:
    util = inst.spec.gpu_memory_utilization
    return VLLM_DEFAULT_GPU_MEMORY_UTILIZATION if util is None else util


def _host_available() -> int:
    import psutil

    return int(psutil.virtual_memory().available)


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f}"
