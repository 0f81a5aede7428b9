"""vllm-router as a supervised process of its own kind, and its worker set kept equal to the
instances that are ready (docs/router.md).

The router runs through the same Runner as an instance (spawn in its own session, run logs,
restart policy, exit classification, stop by group, adoption by a restarted daemon): its
`RouterProcessSpec` is an `InstanceSpec` whose command line is vllm-router's, whose readiness is
`/liveness` (`/readiness` is 503 with no worker, a normal state) and whose start turns use a
device of their own, so it never waits for a vLLM start. It is not one of `engine.instances`
(those are the layout's `[[instance]]`s): `engine.router` holds it.

Membership: the router starts with no worker (it would bind its port only once every listed
worker answers) and `RouterMembership` adds the ready instances through its worker API. Every
instance state change wakes one reconcile task (debounced, serialised, retried while the
router does not answer); before the engine stops, restarts or drains a member it calls `leave`,
which removes it from the router first, so it gets no new request while its running ones end.

Changes vsup did not make: vllm-router's worker API has no authentication, so anyone who
reaches its port can add a server of their own or remove a member. While the router serves, a
watch reads its worker list every WATCH_S and undoes both at once: a worker that is no member is
removed (`foreign`), a member vsup had put there and still wants is added back (`removed`), each
in a task of its own: the router answers an add only once the member answers /health, so the
watch reads on meanwhile and a second removal is undone without waiting for the first.
Each is counted, journaled (`router_foreign_worker`, `router_worker_removed`; rate-limited),
named with the other local users connected to the router's port then (router/peers.py), and
kept for the advice and the status for FOREIGN_RECENT_S (docs/router.md, "Who can reach it").
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
import os
import socket
from collections.abc import Callable, Collection, Coroutine, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from vsup.clock import Clock, iso_utc
from vsup.engine.adoption import take_over
from vsup.engine.health import HttpGetter
from vsup.engine.host import EngineHost
from vsup.engine.instance import AdoptRecord, Instance
from vsup.engine.memory import GpuMemoryView
from vsup.engine.proc import ProcInfo
from vsup.engine.runlog import RunLogs
from vsup.engine.runner import Runner
from vsup.engine.scheduler import DeviceScheduler
from vsup.engine.settings import EngineSettings
from vsup.engine.sleep import SleepRefused
from vsup.engine.states import IDLE, State
from vsup.engine.stop import GpuReleaseCheck, RequestsRunning
from vsup.journalevents import (
    ActionEvent,
    ForeignEvent,
    HoldEndEvent,
    HoldWakeEvent,
    JournalEvent,
    RouterForeignWorkerEvent,
    RouterWorkerRemovedEvent,
    RouterWorkersEvent,
    StateEvent,
)
from vsup.layout.spec import InstanceSpec
from vsup.router import (
    EXCLUDED,
    ROUTER_MISSING_HINT,
    ROUTER_STOP_GRACE_S,
    ForeignWorker,
    MembershipChange,
    RemovedWorker,
    RouterClient,
    RouterError,
    RouterMembership,
    RouterMetrics,
    RouterSpec,
)
from vsup.router.holder import HoldCounts, Holder
from vsup.router.peers import other_users
from vsup.snapshot import (
    RouterForeignWorker,
    RouterHolder,
    RouterRemovedWorker,
    RouterStatus,
    RouterWorker,
)
from vsup.states import SleepState
from vsup.telemetry.httpget import HttpError

log = logging.getLogger("vsup.engine")

# Not a valid instance name (those start with a letter or digit): the router's run logs
# (`logs/@router/`) and start turns never clash with an instance's.
ROUTER_NAME = "@router"
# Requests the router sent a worker just before removing it are still on their way into vLLM
# (not yet counted as running or waiting) for a few milliseconds; wait this long before a
# drain reads the count.
LEAVE_SETTLE_S = 1.0
# A router that does not answer a removal in this long is not waited for: the stop goes on
# (the router's retries send a refused request to another worker).
LEAVE_TIMEOUT_S = 5.0
# While the router starts, /liveness is asked this often (docs/router.md, "What a router change
# costs": each poll of the 1 s health interval added half a second to the gap on average).
START_POLL_S = 0.05
# ... and once it serves, its /liveness is read this often (a request to it fails meanwhile)
ROUTER_HEALTH_INTERVAL_S = 1.0
RETRY_S = 1.0  # a reconcile the router refused is tried again this often
RECHECK_S = 10.0  # and the worker set is compared with vsup's view at least this often
DEBOUNCE_S = 0.05  # state changes that come together make one reconcile
# A rollout waits at most this long for a restarted instance to be a worker again (add_worker
# waits for its /health, which a ready instance answers at once).
JOIN_TIMEOUT_S = 30.0
# While the router serves, its worker list is read this often: a worker vsup did not add is
# removed, a member someone else removed is put back (docs/router.md: the worker API has no
# authentication). The router retries a request that finds no worker for about 0.4 s (its
# default 5 attempts), so a member put back within this long costs no request.
WATCH_S = 0.1
# ... and this often while someone else keeps changing them (for ATTACK_S after the last
# change undone): a remove loop takes a member out again as soon as it is back, so the sooner
# vsup sees it gone, the more of the time it is there for the router's retries to find.
WATCH_BUSY_S = 0.02
ATTACK_S = 5.0
WATCH_TIMEOUT_S = 2.0
# A foreign worker is news (event, advice, alert) for this long after its last removal...
FOREIGN_RECENT_S = 600.0
# ... and while it keeps coming back, its event is journaled at most this often.
FOREIGN_EVENT_S = 60.0
FOREIGN_MAX = 64  # foreign URLs remembered at once (someone may add many)


@dataclass(frozen=True)
class RouterProcessSpec(InstanceSpec):
    """The router as the Runner runs it (see the module doc)."""

    router: RouterSpec | None = None

    @property
    def devices(self) -> tuple[str, ...]:
        return ("router",)

    @property
    def health_url(self) -> str:
        assert self.router is not None
        return f"{self.router.base_url}/liveness"

    @property
    def command_hint(self) -> str:
        return ROUTER_MISSING_HINT

    @property
    def start_poll_s(self) -> float:
        # every request to the router fails until it serves again (a `[router]` change
        # restarts it): see that it listens within this long of its bind
        return START_POLL_S

    def argv(self) -> list[str]:
        assert self.router is not None
        return self.router.argv([])

    def child_env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        assert self.router is not None
        env = dict(os.environ if base is None else base)
        env.update(self.router.env)
        return env


def process_spec(spec: RouterSpec) -> RouterProcessSpec:
    """The Runner's view of a router: its restart policy is `[router] restart`."""
    return RouterProcessSpec(
        name=ROUTER_NAME,
        model=spec.model or "",
        command=spec.command,
        host=spec.host,
        port=spec.port,
        gpus=(),
        gpu_memory_utilization=None,
        restart=spec.restart,
        # the Python launcher loads a 60 MB binary: 1.5-3 s here
        start_timeout_s=60.0,
        stop_grace_s=ROUTER_STOP_GRACE_S,
        drain_timeout_s=0.0,
        health_interval_s=ROUTER_HEALTH_INTERVAL_S,
        unhealthy_after=3,
        unhealthy_grace_s=10.0,
        router=spec,
    )


class _RouterHost:
    """The engine as the router's Runner sees it (a RunnerHost): events name the router, not an
    instance; its only instance is the router; a resume after stuck processes starts the
    router. Everything else is the engine's."""

    def __init__(self, engine: EngineHost, sup: RouterSupervisor) -> None:
        self._engine = engine
        self._sup = sup

    @property
    def clock(self) -> Clock:
        return self._engine.clock

    @property
    def settings(self) -> EngineSettings:
        return self._engine.settings

    @property
    def gpu_release_check(self) -> GpuReleaseCheck | None:
        return self._engine.gpu_release_check

    @property
    def requests_running(self) -> RequestsRunning | None:
        return self._engine.requests_running

    @property
    def gpu_memory(self) -> GpuMemoryView | None:
        return self._engine.gpu_memory

    @property
    def scheduler(self) -> DeviceScheduler:
        return self._engine.scheduler

    @property
    def instances(self) -> Mapping[str, Instance]:
        inst = self._sup.inst
        return {inst.name: inst} if inst is not None else {}

    @property
    def sleeper(self) -> None:
        return None  # the router never sleeps

    @property
    def detached(self) -> bool:
        return self._engine.detached

    def emit(self, inst: Instance | None, event: JournalEvent) -> None:
        self._sup.emit(event)

    def notify(self) -> None:
        self._engine.notify()

    def http_client(self) -> HttpGetter:
        return self._engine.http_client()

    async def scan_processes(self) -> dict[int, ProcInfo]:
        return await self._engine.scan_processes()

    def spawn_background(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task:
        return self._engine.spawn_background(coro)

    async def start(self, name: str, wait: bool = False, automatic: bool = False) -> None:
        await self._sup.start(automatic=automatic)


class RouterSupervisor:
    """The layout's router (at most one) and its membership; `engine.router`."""

    def __init__(self, engine: EngineHost) -> None:
        self.e = engine
        self.spec: RouterSpec | None = None
        self.inst: Instance | None = None
        self.membership: RouterMembership | None = None
        self.client: RouterClient | None = None
        # (name) -> True while an instance must not get requests although it is ready (a
        # stalled engine, say); the daemon sets it
        self.exclude: Callable[[str], bool] | None = None
        self.last_error: str | None = None  # the router's worker API refused or did not answer
        self.in_router: list[str] | None = None  # worker URLs as the router last listed them
        self.metrics: RouterMetrics | None = None
        self.requests_per_s: float | None = None
        self.errors_per_s: float | None = None
        # workers someone else added through the router's open worker API, by URL (watch)
        self.foreign: dict[str, ForeignWorker] = {}
        # members someone else removed through it and vsup put back, by URL (watch)
        self.removed: dict[str, RemovedWorker] = {}
        self._told: dict[tuple[str, str], float] = {}  # (kind, url) -> when its last event went
        # worker URLs vsup put in the running router and has not taken out itself: one of them
        # missing from the router's list was removed by someone else
        self._placed: set[str] = set()
        self._attacked_at: float | None = None  # when the watch last undid someone's change
        # put-backs in flight, by worker URL: the watch goes on reading the list meanwhile, so a
        # member removed while another's add waits for the router is put back at once too
        self._putting: dict[str, asyncio.Task] = {}
        self._last_counts: tuple[float, float | None, float | None] | None = None
        self._host = _RouterHost(engine, self)
        self._dirty = asyncio.Event()
        self._lock = asyncio.Lock()
        self._loop_task: asyncio.Task | None = None
        self._watch_task: asyncio.Task | None = None
        # wake on request (router/holder.py): model -> the endpoint that stands in for it in the
        # router while none of its instances is awake; and the wake each one asked for last
        self.holders: dict[str, Holder] = {}
        self._woke: dict[str, tuple[str, float]] = {}
        # holder URLs that are no longer (closed, or a previous daemon's: restore.py): removed
        # from the router like a foreign worker, but quietly (vsup put them there)
        self.retired: set[str] = set()

    # -- events -----------------------------------------------------------------------------

    def emit(self, event: JournalEvent) -> None:
        """An engine event about the router: no `instance` key, `router` = its port."""
        port = self.spec.port if self.spec is not None else None
        self.e.emit(None, dataclasses.replace(event, router=port))

    def _on_state(self, inst: Instance, old: State, new: State) -> None:
        self.emit(StateEvent(from_=old, to=new))
        if new != State.READY:
            self._placed.clear()  # a restarted router starts with no worker
        if new == State.READY:
            self.wake()
            self._watch()
        self.e.notify()

    def instance_state(self, name: str, new: State) -> None:
        """An instance changed state (the engine calls this): membership follows."""
        if self.membership is None or name not in self.membership.workers:
            return
        if new != State.READY:
            # its state keeps it out from now on; once ready again it joins
            self.membership.rejoin(name)
        self.wake()

    # -- the layout -------------------------------------------------------------------------

    async def apply(self, spec: RouterSpec | None) -> str:
        """Run the layout's router: start, restart (its own settings changed), update (only
        its workers changed: no restart), stop (the layout has none) or unchanged."""
        if spec is None:
            if self.inst is None:
                return "unchanged"
            await self.stop()
            self._forget()
            return "stop"
        old = self.spec
        self.spec = spec
        self.membership = (
            self.membership.with_workers(spec.workers, spec.models)
            if self.membership is not None
            else RouterMembership(spec.workers, spec.models)
        )
        if self.inst is None:
            self._new(spec)
            await self.start()
            return "start"
        assert old is not None
        if not old.same_process(spec):
            await self._replace_client(spec)
            await self.restart(spec)
            return "restart"
        idle = self.inst.state in IDLE and not self.inst.supervised
        self.inst.set_spec(process_spec(spec))
        if idle:
            await self.start()
            return "start"
        self.wake()
        return "update" if old != spec else "unchanged"

    def diff(self, spec: RouterSpec | None) -> str:
        """What `apply(spec)` would do (for a dry run's plan)."""
        if spec is None:
            return "stop" if self.inst is not None else "unchanged"
        if self.inst is None or self.spec is None:
            return "start"
        if not self.spec.same_process(spec):
            return "restart"
        if self.inst.state in IDLE and not self.inst.supervised:
            return "start"
        return "update" if self.spec != spec else "unchanged"

    def adopt(self, spec: RouterSpec, record: AdoptRecord) -> bool:
        """Take over a router an earlier daemon started (adoption.py: pid, start time and group
        must still match). False when it is gone: it is registered stopped, its exit
        classified; start it (or apply)."""
        self.spec = spec
        self.membership = RouterMembership(spec.workers, spec.models)
        inst = self._new(spec)
        if not take_over(self._host, inst, record):
            return False
        self._ensure_runner()
        return True

    def register(self, spec: RouterSpec, run: int = 0, restarts: int = 0) -> None:
        """Know a router without a process (a state file's stopped one); nothing starts."""
        self.spec = spec
        self.membership = RouterMembership(spec.workers, spec.models)
        inst = self._new(spec)
        inst.lifecycle.run = run
        inst.lifecycle.restarts = restarts

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self, automatic: bool = False) -> None:
        """Run the router (a failed one too: the breaker resets unless `automatic`)."""
        inst = self._need()
        self.emit(ActionEvent(action="start", automatic=automatic))
        inst.control.start()
        inst.lifecycle.request_start(automatic=automatic)
        self._ensure_runner()

    async def restart(self, spec: RouterSpec | None = None) -> None:
        """End the running router and start it again (with `spec`, when given)."""
        inst = self._need()
        self.emit(ActionEvent(action="restart"))
        self.e.relaunch(inst, spec=process_spec(spec) if spec is not None else None)
        self._ensure_runner()

    async def stop(self) -> None:
        """Stop the router and return when its process is gone."""
        inst = self.inst
        if inst is None:
            return
        self.emit(ActionEvent(action="stop"))
        await self.e.halt(inst)

    async def shutdown(self, stop_router: bool) -> None:
        """Stop the router (`vsup down`) or leave it running for the next daemon."""
        if stop_router:
            await self.stop()
        tasks = (
            self._loop_task,
            self._watch_task,
            self.inst.control.task if self.inst else None,
            *self._putting.values(),
        )
        for task in tasks:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        if self.inst is not None and self.inst.process is not None:
            self.inst.process.close()
        if self.client is not None:
            await self.client.aclose()
            self.client = None
        for holder in self.holders.values():
            await holder.aclose()
        self.holders.clear()

    # -- membership -------------------------------------------------------------------------

    async def leave(self, name: str, settle: bool = False) -> None:
        """Take instance `name` out of the router before the engine touches it: removed now
        (bounded wait), kept out until it is ready again. A no-op for a non-member. `settle`
        (before a drain): wait until requests sent just before the removal are counted."""
        if self.membership is None or self.membership.leave(name) is None:
            return
        inst = self.e.instances.get(name)
        if inst is None or inst.state != State.READY or not self.serving:
            self.wake()
            return
        url = self.membership.workers[name]
        try:
            async with asyncio.timeout(LEAVE_TIMEOUT_S):
                # a put-back of it on its way would land after the removal: let it land first
                # (none starts from now on: a leaving member is not wanted)
                await self._put_back_done((url,))
            async with asyncio.timeout(LEAVE_TIMEOUT_S), self._lock:
                assert self.client is not None
                # the watch may have taken it out already (it follows `desired` too): then
                # the removal is journaled once, by it
                already = self.in_router is not None and url not in self.in_router
                await self._stand_in_for(name)
                await self.client.remove_worker(url)
                self._placed.discard(url)
        except (RouterError, TimeoutError) as exc:
            self.last_error = f"removing {name} from the router: {exc}"
            log.warning("%s", self.last_error)
            self.wake()
            return
        if self.in_router is not None:
            self.in_router = [u for u in self.in_router if u != url]
        if not already:
            self.emit(RouterWorkersEvent(add=[], remove=[url], why=f"{name} leaves"))
        if settle:
            await asyncio.sleep(LEAVE_SETTLE_S)

    async def _stand_in_for(self, name: str) -> None:
        """The last awake instance of a model with a holder leaves: the holder goes in first,
        so that no request for the model finds no worker of it. The caller holds `_lock`."""
        assert self.client is not None and self.membership is not None
        model = self.membership.models.get(name)
        standin = self.membership.standins.get(model) if model is not None else None
        if standin is None or standin not in self.membership.desired(self.states()):
            return
        if self.in_router is not None and standin in self.in_router:
            return
        await self.client.add_worker(standin)
        self._placed.add(standin)
        if self.in_router is not None:
            self.in_router = [*self.in_router, standin]
        self.emit(RouterWorkersEvent(add=[standin], remove=[], why=f"{name} leaves: hold {model}"))

    async def joined(self, name: str, timeout_s: float = JOIN_TIMEOUT_S) -> bool:
        """Wait until the router routes to `name` again (a rollout's next wave waits for it);
        True at once when there is nothing to wait for (not a member, not wanted, no router
        serving). False after `timeout_s`."""

        def waiting() -> bool:
            if not self.serving or self.membership is None or name not in self.membership.workers:
                return False
            url = self.membership.workers[name]
            if url not in self.membership.desired(self.states()):
                return False
            return self.in_router is None or url not in self.in_router

        if not waiting():
            return True
        self.wake()
        try:
            await asyncio.wait_for(self.e.until(lambda: not waiting()), timeout_s)
        except TimeoutError:
            log.warning("%s is ready but not back in the router after %.0f s", name, timeout_s)
            return False
        return True

    def states(self) -> dict[str, str]:
        """Instance states as membership reads them (an excluded one is not `ready`)."""
        out = {}
        for name, inst in self.e.instances.items():
            state: str = inst.state
            if state == State.READY and self.exclude is not None and self.exclude(name):
                state = EXCLUDED
            out[name] = state
        return out

    def wake(self) -> None:
        """Reconcile soon (one task, debounced)."""
        self._dirty.set()
        if self._loop_task is None or self._loop_task.done():
            with contextlib.suppress(RuntimeError):  # no running loop: nothing to reconcile yet
                self._loop_task = self.e.spawn_background(self._reconcile_loop())

    @property
    def serving(self) -> bool:
        return self.inst is not None and self.inst.state == State.READY and self.client is not None

    async def reconcile(self) -> None:
        """Make the router's workers the ready members now; raises RouterError."""
        if not self.serving or self.membership is None:
            return
        assert self.client is not None
        # the put-backs in flight first (the list it reads then holds them), without the lock:
        # the watch reads on meanwhile
        await self._put_back_done()
        await self._ensure_holders()
        async with self._lock:
            await self._sync(await self.client.list_workers())
        self.last_error = None
        self.e.notify()  # a rollout may wait for a member to be back (joined)

    async def _sync(self, listed: list[str], undo_only: bool = False) -> None:
        """Make the router's workers (`listed`, just read) the ready members: remove what vsup
        does not want there (workers someone else added among them), add what it wants (members
        someone else removed among them). `undo_only` (the watch): only undo someone else's
        changes, and leave vsup's own to the reconcile (woken when there are some). The caller
        holds `_lock`. Raises RouterError; what was done before is recorded all the same."""
        assert self.client is not None and self.membership is not None
        states = self.states()
        foreign = tuple(u for u in self.membership.foreign(listed) if u not in self.retired)
        putting = set(self._putting)
        taken = self.membership.taken(states, self._placed | putting, listed)
        change = self.membership.plan(states, listed)
        if undo_only:
            if set(change.add) - set(taken) or set(change.remove) - set(foreign):
                self.wake()
            # each put-back in a task of its own, so the watch reads on while the router checks
            # the member; removals at once (the router answers them without a check)
            for url in taken:
                if url not in putting:
                    self._put_back(url)
            undone: list[str] = []
            try:
                for url in foreign:
                    await self.client.remove_worker(url)
                    undone.append(url)
            finally:
                self._synced(listed, states, undone, [], (), foreign)
            return
        # members someone else removed: put back as the watch does, without holding the lock
        # (and the watch) for as long as the router checks them
        for url in taken:
            if url not in putting:
                self._put_back(url)
        change = MembershipChange(
            add=tuple(u for u in change.add if u not in taken), remove=change.remove
        )
        removed: list[str] = []
        added: list[str] = []
        try:
            await self._change(change, removed, added)
        finally:
            self._synced(listed, states, removed, added, taken, foreign)

    async def _change(self, change: MembershipChange, removed: list[str], added: list[str]) -> None:
        """Remove then add workers; `removed` and `added` get what was done (on an error too)."""
        assert self.client is not None
        # a holder leaves only once its model's instance is in (a model with no worker gets
        # another model's: vllm-router's gateway mode falls back to any worker)
        standins = set(self.membership.standins.values()) if self.membership else set()
        for url in change.remove:
            if url not in standins:
                await self.client.remove_worker(url)
                removed.append(url)
        # at once: each add waits for the worker's /health, slow on a busy CPU server
        client = self.client
        results = await asyncio.gather(
            *(client.add_worker(url) for url in change.add), return_exceptions=True
        )
        added += [u for u, r in zip(change.add, results, strict=True) if r is True or r is False]
        for r in results:
            if isinstance(r, BaseException):
                raise r
        for url in change.remove:
            if url in standins:
                await self.client.remove_worker(url)
                removed.append(url)

    def _synced(
        self,
        listed: list[str],
        states: Mapping[str, str],
        removed: list[str],
        added: list[str],
        taken: Collection[str],
        foreign: Collection[str],
    ) -> None:
        """Record what a sync did: the router's workers now, vsup's own changes journaled,
        someone else's undone changes counted as incidents."""
        assert self.membership is not None
        self.in_router = [u for u in listed if u not in removed] + [
            u for u in added if u not in listed
        ]
        # what vsup wants there and is there (an adopted router's members too): from now
        # on, one of them missing was removed by someone else
        self._placed = set(self.membership.desired(states)) & (
            set(self.in_router) | set(self._putting)
        )
        # vsup's own changes are journaled as such; undoing someone else's is an incident
        # of its own (rate-limited: a loop would otherwise write dozens of events a second)
        own_add = [u for u in added if u not in taken]
        own_remove = [u for u in removed if u not in foreign]
        if own_add or own_remove:
            self.emit(RouterWorkersEvent(add=own_add, remove=own_remove))
        self._note_foreign([u for u in removed if u in foreign])
        self._note_removed([u for u in added if u in taken])
        if foreign or taken:
            self._attacked_at = self.e.clock.monotonic()
        if added or removed:
            self.e.notify()  # a rollout may wait for a member to be back (joined)

    def _put_back(self, url: str) -> None:
        """Add back `url`, a member someone else removed, in a task of its own (the router
        answers an add only once the member answers its /health: tenths of a second on a busy
        node). The watch does not wait for it; `leave` and `reconcile` do."""
        self._attacked_at = self.e.clock.monotonic()
        task = self.e.spawn_background(self._add_back(url))
        self._putting[url] = task
        task.add_done_callback(self._put_back_ended)

    def _put_back_ended(self, task: asyncio.Task) -> None:
        for url in [u for u, t in self._putting.items() if t is task]:
            del self._putting[url]

    async def _add_back(self, url: str) -> None:
        client = self.client
        if client is None:
            return
        try:
            await client.add_worker(url)
        except RouterError as exc:
            self.last_error = str(exc)  # still placed: the watch's next round tries again
            return
        if not self.serving or self.membership is None:
            return
        if self.in_router is not None and url not in self.in_router:
            self.in_router = [*self.in_router, url]
        if url in self.membership.desired(self.states()):
            self._placed.add(url)  # (one leaving meanwhile: `leave` takes it out next)
        self._attacked_at = self.e.clock.monotonic()
        self._note_removed([url])
        self.e.notify()  # a rollout may wait for a member to be back (joined)

    async def _put_back_done(self, urls: Iterable[str] | None = None) -> None:
        """Wait for the put-backs in flight (of `urls`, or all) to be answered."""
        tasks = [t for u, t in self._putting.items() if urls is None or u in urls]
        if tasks:
            await asyncio.wait(tasks)

    async def _reconcile_loop(self) -> None:
        while True:
            # asyncio.timeout, not wait_for: Python 3.11's wait_for can swallow a cancellation
            # that arrives as the event fires (gh-86296), and this loop would outlive shutdown
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(RECHECK_S):
                    await self._dirty.wait()
            self._dirty.clear()
            await asyncio.sleep(DEBOUNCE_S)
            try:
                await self.reconcile()
            except RouterError as exc:
                self.last_error = str(exc)
                if self.serving:
                    await asyncio.sleep(RETRY_S)
                    self._dirty.set()

    # -- figures ----------------------------------------------------------------------------

    async def poll(self) -> None:
        """Read the router's figures and worker list (the daemon calls this each poll)."""
        if not self.serving:
            self.in_router = None
            self.metrics = None
            self.requests_per_s = self.errors_per_s = None
            self._last_counts = None
            return
        assert self.client is not None and self.membership is not None
        self._watch()  # the watch reads the worker list (in_router) and undoes others' changes
        try:
            metrics = await self.client.metrics()
        except RouterError as exc:
            self.last_error = str(exc)
            return
        now = self.e.clock.monotonic()
        counts = (now, metrics.requests_total, metrics.errors_total)
        prev = self._last_counts
        self.requests_per_s = _rate(prev, counts, 1)
        self.errors_per_s = _rate(prev, counts, 2)
        self._last_counts = counts
        self.metrics = metrics
        if self.in_router is not None and set(self.in_router) | set(self._putting) != set(
            self.membership.desired(self.states())
        ):
            self.wake()  # drift (a stalled flag changed, a member added by hand)

    # -- wake on request ---------------------------------------------------------------------

    def _holder_models(self) -> dict[str, tuple[str, ...]]:
        """The models that get a holder: those with a sleep-mode member (model -> the other
        names its requests may give: the `model` values of its instances)."""
        assert self.spec is not None
        out: dict[str, tuple[str, ...]] = {}
        for name in self.spec.workers:
            inst = self.e.instances.get(name)
            # (no model known: a spec an older vsup saved, until the layout is applied again)
            model = self.spec.models.get(name)
            if inst is None or inst.spec.sleep is None or model is None:
                continue
            out[model] = tuple(dict.fromkeys((*out.get(model, ()), inst.spec.model)))
        return out

    async def _ensure_holders(self) -> None:
        """One holder per model with a sleep-mode member, listening; the membership's
        stand-ins follow."""
        if self.spec is None or self.membership is None:
            return
        want = self._holder_models()
        for model in [m for m in self.holders if m not in want]:
            old = self.holders.pop(model)
            if old.port:
                self.retired.add(old.url)
            await old.aclose()
        for model, names in want.items():
            holder = self.holders.get(model)
            if holder is None:
                holder = Holder(
                    model,
                    functools.partial(self._wake_for, model),
                    self.spec.hold_s,
                    self.spec.hold_queue,
                    names=names,
                    on_change=self.e.notify,
                    on_end=functools.partial(self._hold_ended, model),
                )
                await holder.start()
                self.holders[model] = holder
            else:
                holder.set_bounds(self.spec.hold_s, self.spec.hold_queue)
        self.membership.standins = {m: h.url for m, h in self.holders.items()}

    async def _wake_for(self, model: str) -> str:
        """A held request's wake: the worker URL of an instance of `model` once one is awake
        (waking it, as `vsup wake` does: in a swap group the awake member sleeps first).
        Raises with the reason when none can be."""
        spec, membership = self.spec, self.membership
        sleeper = self.e.sleeper
        if spec is None or membership is None or sleeper is None:
            raise RuntimeError("the router's layout changed")
        names = [n for n, m in spec.models.items() if m == model and n in membership.workers]
        desired = set(membership.desired(self.states()))
        for name in names:
            if membership.workers[name] in desired:
                return membership.workers[name]  # awake meanwhile

        def rank(name: str) -> tuple[int, int]:
            inst = self.e.instances.get(name)
            t = sleeper.track(name)
            assert inst is not None and t is not None
            order = {
                SleepState.WAKING: 0,
                SleepState.ASLEEP: 1,
                SleepState.UNKNOWN: 2,
                SleepState.FALLING_ASLEEP: 3,
            }
            running = inst.pid is not None and inst.state == State.READY
            # a running one first (a wake takes seconds, a start minutes)
            return (0 if running else 1, order.get(t.state, 4))

        sleepers = [n for n in names if n in self.e.instances and sleeper.track(n) is not None]
        candidates = sorted(sleepers, key=rank)
        if not candidates:
            raise RuntimeError(f"no instance of {model} uses sleep mode")
        pick = candidates[0]
        holder = self.holders.get(model)
        held = holder.queue.counts.held if holder is not None else 0
        self._woke[model] = (pick, self.e.clock.monotonic())
        self.emit(HoldWakeEvent(model=model, woke=pick, held=held))
        try:
            await sleeper.wake(pick, why=f"a request for {model} (wake on request)")
        except SleepRefused as exc:
            raise RuntimeError(f"{pick}: {exc}") from exc
        return membership.workers[pick]

    def _hold_ended(self, model: str, counts: HoldCounts, error: str | None) -> None:
        woke = self._woke.pop(model, None)
        if woke is None:
            return  # no wake: an instance was awake when asked
        took = round(self.e.clock.monotonic() - woke[1], 3)
        self.emit(
            HoldEndEvent(
                model=model,
                woke=woke[0],
                took_s=took,
                forwarded=counts.forwarded,
                timed_out=counts.timed_out,
                dropped=counts.dropped,
                failed=counts.failed,
                full=counts.full,
                error=error,
            )
        )

    def _holders_status(self) -> tuple[RouterHolder, ...]:
        out = []
        for model, h in self.holders.items():
            c = h.queue.counts
            out.append(
                RouterHolder(
                    model=model,
                    url=h.url if h.port else None,
                    in_router=h.url in self.in_router if self.in_router is not None else None,
                    held=c.held,
                    waking=h.queue.waking,
                    total=c.total,
                    forwarded=c.forwarded,
                    timed_out=c.timed_out,
                    dropped=c.dropped,
                    failed=c.failed,
                    full=c.full,
                    error=h.last_error,
                )
            )
        return tuple(out)

    # -- worker changes vsup did not make ------------------------------------------------

    def _watch(self) -> None:
        """Watch the router's worker list while it serves (one task)."""
        if self._watch_task is None or self._watch_task.done():
            with contextlib.suppress(RuntimeError):  # no running loop: nothing to watch yet
                self._watch_task = self.e.spawn_background(self._watch_loop())

    async def _watch_loop(self) -> None:
        """vllm-router's worker API has no authentication (docs/router.md): anyone who reaches
        its port can add a worker of their own (and get a share of the requests) or remove a
        member (and fail every request once none is left). Read the list every WATCH_S and undo
        either at once, not at the next poll or reconcile."""
        while self.serving:
            try:
                async with self._lock:
                    if self.serving:
                        await self._sync(await self._list_workers(), undo_only=True)
                        self.last_error = None
            except RouterError as exc:
                self.last_error = str(exc)  # the next round tries again
            at = self._attacked_at
            busy = at is not None and self.e.clock.monotonic() - at < ATTACK_S
            await asyncio.sleep(WATCH_BUSY_S if busy else WATCH_S)

    async def _list_workers(self) -> list[str]:
        """The router's worker list over the engine's kept-alive client: a tenth of httpx's
        CPU per read (benchmarks/router_foreign.py), which the watch pays ten times a second."""
        assert self.spec is not None
        url = f"{self.spec.base_url}/list_workers"
        try:
            resp = await self.e.http_client().get(url, WATCH_TIMEOUT_S)
            if resp.status != 200:
                raise RouterError(f"GET {url}: HTTP {resp.status}")
            return [str(u) for u in json.loads(resp.body).get("urls", [])]
        except (HttpError, OSError, ValueError, AttributeError) as exc:
            raise RouterError(f"GET {url}: {type(exc).__name__}: {exc}") from exc

    def _note_foreign(self, urls: Iterable[str]) -> None:
        """Count the removal of each foreign worker URL (someone else added it)."""
        kind = "router_foreign_worker"
        for url in urls:
            old, fields = self._incident(kind, self.foreign, url, "removals")
            rec = ForeignWorker(**fields)
            self._keep(kind, self.foreign, rec)
            self._tell(kind, rec, old is None, removals=rec.removals)

    def _note_removed(self, urls: Iterable[str]) -> None:
        """Count each member vsup put back after someone else removed it."""
        assert self.membership is not None
        kind = "router_worker_removed"
        for url in urls:
            old, fields = self._incident(kind, self.removed, url, "restores")
            rec = RemovedWorker(name=self.membership.name_of(url) or "?", **fields)
            self._keep(kind, self.removed, rec)
            self._tell(kind, rec, old is None, restores=rec.restores)

    def _incident(
        self, kind: str, table: dict[str, Any], url: str, counter: str
    ) -> tuple[Any, dict[str, Any]]:
        """The last record of `url`'s incident (None when new) and the fields of its next one:
        seen now, `counter` (removals or restores) one more, the users connected merged in."""
        assert self.spec is not None
        old = self._recent(table, url)
        users = self._users((kind, url), old)
        at = iso_utc(self.e.clock.wall())
        fields: dict[str, Any] = {
            "url": url,
            "first_seen": old.first_seen if old is not None else at,
            "last_seen": at,
            counter: (getattr(old, counter) if old is not None else 0) + 1,
            "last_seen_mono": self.e.clock.monotonic(),
            "router_host": self.spec.host,
            "router_port": self.spec.port,
            "users": _merged(old.users if old is not None else (), users),
        }
        return old, fields

    def _recent(self, table: dict[str, Any], url: str) -> Any:
        """The record of `url`'s incident, None when it is new (none, or none for
        FOREIGN_RECENT_S); drops the records that have aged out."""
        now_m = self.e.clock.monotonic()
        for u in [u for u, r in table.items() if now_m - r.last_seen_mono > FOREIGN_RECENT_S]:
            del table[u]
        return table.get(url)

    def _keep(self, kind: str, table: dict[str, Any], rec: Any) -> None:
        table.pop(rec.url, None)  # the latest last: the oldest go first below
        table[rec.url] = rec
        while len(table) > FOREIGN_MAX:
            oldest = next(iter(table))
            del table[oldest]
            self._told.pop((kind, oldest), None)

    def _users(self, key: tuple[str, str], old: Any) -> tuple[str, ...] | None:
        """Other users connected to the router's port, read when the incident's event is due
        (its first change, then at most once per FOREIGN_EVENT_S): None when not due."""
        told = self._told.get(key)
        if (
            old is not None
            and told is not None
            and self.e.clock.monotonic() - told < FOREIGN_EVENT_S
        ):
            return None
        assert self.spec is not None
        return other_users(self.spec.port)

    def _tell(self, kind: str, rec: ForeignWorker | RemovedWorker, new: bool, **count: int) -> None:
        """Journal an incident's first change, then one event per FOREIGN_EVENT_S while it
        goes on (a loop would otherwise write dozens of events a second)."""
        key = (kind, rec.url)
        now_m = self.e.clock.monotonic()
        told = self._told.get(key)
        if not new and told is not None and now_m - told < FOREIGN_EVENT_S:
            return
        self._told[key] = now_m
        for k in [k for k, t in self._told.items() if now_m - t > FOREIGN_RECENT_S]:
            del self._told[k]
        what = {
            "router_foreign_worker": "removed a worker vsup did not add",
            "router_worker_removed": "put back a member someone else removed",
        }[kind]
        log.warning(
            "router: %s: %s (%s since %s; other users connected to its port: %s)",
            what,
            rec.url,
            ", ".join(f"{k} {v}" for k, v in count.items()),
            rec.first_seen,
            ", ".join(rec.users) or "none",
        )
        told_by: dict[str, type[ForeignEvent]] = {
            "router_foreign_worker": RouterForeignWorkerEvent,
            "router_worker_removed": RouterWorkerRemovedEvent,
        }
        fields = {"url": rec.url, "first_seen": rec.first_seen, "users": list(rec.users)}
        self.emit(told_by[kind].of(fields | count))

    def foreign_recent(self) -> tuple[ForeignWorker, ...]:
        """Foreign workers removed within the last FOREIGN_RECENT_S (advice, status)."""
        now_m = self.e.clock.monotonic()
        return tuple(
            f for f in self.foreign.values() if now_m - f.last_seen_mono <= FOREIGN_RECENT_S
        )

    def removed_recent(self) -> tuple[RemovedWorker, ...]:
        """Members someone else removed and vsup put back within FOREIGN_RECENT_S."""
        now_m = self.e.clock.monotonic()
        return tuple(
            r for r in self.removed.values() if now_m - r.last_seen_mono <= FOREIGN_RECENT_S
        )

    def status_json(self, node_host: str | None = None) -> RouterStatus | None:
        """The status JSON's `router` (snapshot.RouterStatus), or None when the layout has no
        router."""
        if self.inst is None or self.spec is None:
            return None
        inst, spec = self.inst, self.spec
        fields = inst.status_fields()
        m = self.metrics
        return RouterStatus(
            state=inst.state,
            pid=inst.pid,
            host=spec.host,
            port=spec.port,
            metrics_port=spec.metrics_port,
            policy=spec.policy,
            model=spec.model,
            url=spec.base_url,
            endpoint=endpoint(spec, node_host),
            run=fields["run"],
            restarts=inst.restarts,
            uptime_s=fields["uptime_s"],
            log=str(inst.log_path()) if inst.run else None,
            last_exit=fields["last_exit"],
            failed_why=inst.failed_why,
            requests_per_s=_round(self.requests_per_s),
            errors_per_s=_round(self.errors_per_s),
            requests_total=m.requests_total if m is not None else None,
            errors_total=m.errors_total if m is not None else None,
            retries_total=m.retries_total if m is not None else None,
            error=self.last_error,
            workers=self._workers_status(spec),
            foreign_workers=self._foreign_status(),
            removed_workers=self._removed_status(),
            held=sum(h.queue.counts.held for h in self.holders.values()),
            holders=self._holders_status(),
        )

    def _foreign_status(self) -> tuple[RouterForeignWorker, ...]:
        return tuple(
            RouterForeignWorker(
                url=f.url,
                first_seen=f.first_seen,
                last_seen=f.last_seen,
                removals=f.removals,
                users=f.users,
            )
            for f in self.foreign_recent()
        )

    def _removed_status(self) -> tuple[RouterRemovedWorker, ...]:
        return tuple(
            RouterRemovedWorker(
                url=r.url,
                name=r.name,
                first_seen=r.first_seen,
                last_seen=r.last_seen,
                restores=r.restores,
                users=r.users,
            )
            for r in self.removed_recent()
        )

    def _workers_status(self, spec: RouterSpec) -> tuple[RouterWorker, ...]:
        """Each worker of the layout as the status shows it: its state, whether the router
        has it and should, its share of the requests and the router's health verdict."""
        m = self.metrics
        share = m.worker_share() if m is not None else {}
        states = self.states()
        desired = set(self.membership.desired(states)) if self.membership else set()
        workers = []
        for name, url in spec.workers.items():
            in_router = url in self.in_router if self.in_router is not None else None
            workers.append(
                RouterWorker(
                    name=name,
                    url=url,
                    state=states.get(name),
                    in_router=in_router,
                    wanted=url in desired,
                    share=round(share[url], 4) if url in share else None,
                    requests_total=m.worker_requests.get(url) if m is not None else None,
                    healthy=(
                        bool(m.worker_health[url])
                        if m is not None and url in m.worker_health
                        else None
                    ),
                )
            )
        return tuple(workers)

    def adopt_record(self) -> dict[str, Any] | None:
        """What the state file keeps: the spec it runs and (while it runs) its process."""
        if self.inst is None or self.spec is None:
            return None
        rec = self.inst.adopt_record()
        return {
            "spec": self.spec.to_json(),
            "state": self.inst.state,
            "run": self.inst.run,
            "restarts": self.inst.restarts,
            "process": rec.to_json() if rec is not None else None,
            # wake on request: the next daemon's holders have other ports; these it removes
            "holders": [h.url for h in self.holders.values() if h.port],
        }

    # -- internals --------------------------------------------------------------------------

    def _new(self, spec: RouterSpec) -> Instance:
        st = self.e.settings
        logs = RunLogs(self.e.logs_dir, ROUTER_NAME, st.log_keep_runs, st.log_max_bytes)
        self.inst = Instance(process_spec(spec), self.e.clock, logs, self._on_state)
        self.client = RouterClient(spec.base_url, spec.metrics_url)
        return self.inst

    async def _replace_client(self, spec: RouterSpec) -> None:
        old, self.client = self.client, RouterClient(spec.base_url, spec.metrics_url)
        if old is not None:
            await old.aclose()

    def _forget(self) -> None:
        self.inst = None
        self.spec = None
        self.membership = None
        self.in_router = None
        self.metrics = None
        self.foreign.clear()
        self.removed.clear()
        self._told.clear()
        self._placed.clear()
        if self.client is not None:
            self.e.spawn_background(self.client.aclose())
            self.client = None

    def _need(self) -> Instance:
        if self.inst is None:
            raise RuntimeError("the layout has no [router]")
        return self.inst

    def _ensure_runner(self) -> None:
        inst = self._need()
        if inst.control.task is None:
            inst.control.task = asyncio.get_running_loop().create_task(
                Runner(self._host, inst).run(), name="vsup-runner-router"
            )
        inst.control.kick.set()


def _merged(old: tuple[str, ...], new: tuple[str, ...] | None) -> tuple[str, ...]:
    """The users seen connected over an incident: those seen before and those read now."""
    return old if new is None else tuple(sorted(set(old) | set(new)))


def endpoint(spec: RouterSpec, node_host: str | None = None) -> str:
    """The URL to give clients: the node's name when the router listens on every address."""
    if spec.listens_everywhere:
        return f"http://{node_host or socket.gethostname()}:{spec.port}"
    return spec.base_url


def _rate(
    prev: tuple[float, float | None, float | None] | None,
    now: tuple[float, float | None, float | None],
    i: int,
) -> float | None:
    if prev is None or prev[i] is None or now[i] is None or now[0] <= prev[0]:
        return None
    delta = now[i] - prev[i]  # type: ignore[operator]
    if delta < 0:
        return None  # the router restarted: its counters began again
    return delta / (now[0] - prev[0])


def _round(x: float | None) -> float | None:
    return round(x, 3) if x is not None else None
