"""The status snapshot: the one contract between the daemon and every client.

`vsup status --json` (schema 1), the control API, the dashboard and `vsup probe --json` all
speak these dataclasses. Unknown values are `None` (JSON `null`), never a made-up number.
Keys may be added within schema 1; none is removed or renamed.
"""

from __future__ import annotations

import enum
import functools
import sys
import types
import typing
from dataclasses import MISSING, dataclass, fields, is_dataclass
from typing import Any

from vsup.states import ExitReason, PullState, RolloutState, SleepState, State

SCHEMA = 1
_T = typing.TypeVar("_T")

# The wire's names, in the enums' order (vsup.states is their one source).
STATES = tuple(s.value for s in State)
EXIT_REASONS = tuple(r.value for r in ExitReason)

# Where a per-instance HBM figure came from.
HBM_SOURCES = ("process", "device", "unavailable")
# Where the attention backend name came from.
BACKEND_SOURCES = ("log", "flag", "default")


def rank_words(start_rank: int, ranks: int, across: str = "data") -> str:
    """`rank 1` / `ranks 8-15`: a node's data-parallel ranks, as status and the fleet say them;
    `worker 1` / `workers 8-15` for a span of `nodes` (`across` "model": the tensor/pipeline
    parallel workers, torch.distributed ranks, of one group over the nodes)."""
    word = "worker" if across == "model" else "rank"
    last = start_rank + ranks - 1
    return f"{word} {last}" if ranks == 1 else f"{word}s {start_rank}-{last}"


@dataclass(frozen=True)
class LastExit:
    code: int | None  # exit status, when the process exited by itself
    signal: str | None  # e.g. "SIGKILL", when a signal ended it
    reason: str  # one of EXIT_REASONS
    at: str  # ISO 8601 UTC
    log_excerpt: str | None  # the decisive log line(s)
    rank: int | None = None  # data parallel: the rank whose EngineCore died first, if one did


@dataclass(frozen=True)
class Advice:
    """Live advice the daemon derived from telemetry (docs/ARCHITECTURE.md, advice)."""

    kind: str  # kv_exhausted | hbm_over_plan | foreign_process | crash_loop | ...
    severity: str  # info | warning | critical
    message: str
    instance: str | None = None
    gpu: int | None = None


@dataclass(frozen=True)
class Parallel:
    """An instance's parallel shape: tensor x pipeline x data parallel (layout/parallel.py)."""

    tp: int
    pp: int
    dp: int

    @property
    def label(self) -> str:
        """`TP1 x DP8`, `TP2 x PP2`, `TP1`: the table cell of `vsup status` and the dashboard."""
        parts = [f"TP{self.tp}"]
        if self.pp > 1:
            parts.append(f"PP{self.pp}")
        if self.dp > 1:
            parts.append(f"DP{self.dp}")
        return " x ".join(parts)


@dataclass(frozen=True)
class RankStatus:
    """One data-parallel rank of an instance: its `VLLM::EngineCore_DP{rank}` process and GPUs.

    `alive`: True while that process runs, False once it ended during this run (the rank that
    died), None when vsup has not seen it (the instance is not running, or still starting)."""

    rank: int
    gpus: tuple[int, ...]  # gpus[i*tp*pp:(i+1)*tp*pp], i the rank's index on this node
    pid: int | None
    alive: bool | None
    hbm_bytes: int | None  # its process and its workers, summed over every GPU; None: unknown


@dataclass(frozen=True)
class SpanNodeStatus:
    """One node of a server across nodes: its fleet name and its data-parallel ranks."""

    node: str
    start_rank: int
    ranks: int


@dataclass(frozen=True)
class SpanStatus:
    """This node's part of one server across nodes (docs/fleet.md, "One server across nodes"):
    which node this is, head or follower, its ranks, and where the rest of the unit lives
    (every node in rank order, the head first; the head's address and API port)."""

    node: str
    head: bool
    start_rank: int
    ranks: int
    size: int
    nodes: tuple[SpanNodeStatus, ...]
    address: str
    port: int
    # "data": data-parallel ranks per node; "model": one TP/PP group's workers (layout/span.py)
    across: str = "data"


# Why an instance that should run is not running yet (`InstanceStatus.wait`).
WAIT_KINDS = (
    "co_tenant",  # an instance on a device it needs is starting or stopping now
    "start_slot",  # queued for its turn on the device behind other starts that wait too
    "gpu_memory",  # processes that are no instance's hold the GPU memory its start needs
    "backoff",  # the restart policy's delay before the next attempt
    "swap_group",  # another member of its swap group is not asleep (docs/sleep.md)
)
# A span's follower that runs and waits for its head (engine/spanwatch.py): not among
# WAIT_KINDS (those are waits before a start, each exported for every instance); its process
# runs, and only a follower ever has it.
SPAN_HEAD_WAIT = "span_head"


@dataclass(frozen=True)
class WaitReason:
    """What an instance waits for before its next start, and one human line saying it.

    Only the keys of its kind are filled: `instances` (co_tenant, start_slot: whom it waits
    for), `pids`/`held_bytes`/`gpus` (gpu_memory: the processes that are no instance's, the
    bytes they hold, the GPUs short of memory), `remaining_s` (backoff). Clients switch on
    `kind` (a newer daemon may add kinds: show `message` for one you do not know)."""

    kind: str  # one of WAIT_KINDS
    message: str
    instances: tuple[str, ...] = ()
    pids: tuple[int, ...] = ()
    held_bytes: int | None = None
    gpus: tuple[int, ...] = ()
    remaining_s: float | None = None


# What a hub model's pull is doing (status JSON `pulls[].state`; docs/pull.md).
PULL_STATES = tuple(s.value for s in PullState)


@dataclass(frozen=True)
class PullStatus:
    """A hub model being pulled into the node's cache before its instances start.

    `instances`: the instances that start from it once it is done; `current`: files in
    flight; `reason` and `message` say why a pull failed (vsup.pull.errors.REASONS)."""

    model: str
    revision: str
    state: str  # PULL_STATES
    instances: tuple[str, ...] = ()
    commit: str | None = None
    cache_dir: str | None = None
    bytes_done: int | None = None
    bytes_total: int | None = None
    fetched_bytes: int | None = None  # over the network by this pull
    files_done: int | None = None
    files_total: int | None = None
    rate_bps: float | None = None
    eta_s: float | None = None
    current: tuple[str, ...] = ()
    elapsed_s: float | None = None
    started_at: str | None = None  # ISO 8601 UTC
    reason: str | None = None
    message: str | None = None
    snapshot: str | None = None  # the local snapshot, once done

    @property
    def fraction(self) -> float | None:
        if not self.bytes_total:
            return None
        return min(1.0, (self.bytes_done or 0) / self.bytes_total)


@dataclass(frozen=True)
class SleepStatus:
    """An instance that uses vLLM's sleep mode (its layout has a `sleep` table; docs/sleep.md).

    `state` is a `SleepState` (awake, falling_asleep, asleep, waking); `level` the level of the
    current (or last) sleep; `group` its swap group (at most one member awake at a time);
    `since_s` seconds in this sleep state; `last_sleep_s`/`last_wake_s` how long the last sleep
    and wake took (the request until vLLM answered and the memory was seen released or the
    server answered again); `error` why the last sleep or wake failed (None once one works);
    `held_bytes` the GPU memory vLLM keeps while asleep where the probe sees it;
    `idle_sleep_in_s` seconds until idle sleep (`after_idle_s`) puts it to sleep, None when it
    will not; `kept_bytes` what it kept after each sleep of this process (oldest first, the
    latest 20) and `kept_growth_bytes` how much more the latest kept than the first (memory
    vLLM did not give back; None before a second sleep)."""

    state: SleepState
    level: int
    group: str | None = None
    since_s: float | None = None
    last_sleep_s: float | None = None
    last_wake_s: float | None = None
    error: str | None = None
    held_bytes: int | None = None
    idle_sleep_in_s: float | None = None
    kept_bytes: tuple[int, ...] = ()
    kept_growth_bytes: int | None = None

    @property
    def asleep(self) -> bool:
        return self.state != SleepState.AWAKE


@dataclass(frozen=True)
class LifecycleStatus:
    """Where an instance is in its life, as the engine says (engine/instance.py).

    `state` is the engine's `State`; `wait` what a start waits for (None: nothing), and
    `waiting_for` its message while a start waits for a turn or for memory (kept for older
    clients). `outdated` is True when the instance runs (or would start with) another spec than
    the layout says - a rolling apply not yet at it, or one a killed daemon left half-done -
    and `outdated_fields` names the differing spec fields; None: no layout to compare with."""

    state: State
    pid: int | None = None
    restarts: int = 0
    uptime_s: float | None = None
    state_since_s: float | None = None  # seconds in the current state
    run: int | None = None  # how many times this instance was spawned by this supervisor
    backoff_remaining_s: float | None = None
    failed_why: str | None = None  # state `failed`: why vsup will not start it again by itself
    wait: WaitReason | None = None
    waiting_for: str | None = None  # a start waiting for its turn on a device, e.g. "a starting"
    start_timeout_s: float | None = None  # a start not ready after this long is ended
    last_exit: LastExit | None = None
    outdated: bool | None = None
    outdated_fields: tuple[str, ...] = ()

    @property
    def start_elapsed_s(self) -> float | None:
        """Seconds since a `starting` instance was spawned (None before the spawn or in
        another state): its progress against `start_timeout_s`."""
        if self.state != State.STARTING or self.pid is None:
            return None
        return self.uptime_s


@dataclass(frozen=True)
class TelemetryStatus:
    """What the instance's server reports (its /metrics, /load, start-up log), as of the last
    poll (telemetry/view.py). Server figures are None while it does not serve."""

    kv_cache_usage: float | None = None  # 0..1
    kv_capacity_tokens: int | None = None
    preemptions_total: float | None = None
    preemptions_per_min: float | None = None
    requests_running: float | None = None
    requests_waiting: float | None = None
    generation_tokens_per_s: float | None = None
    prompt_tokens_per_s: float | None = None
    prefix_cache_hit_rate: float | None = None
    backend: str | None = None  # the attention backend people know (AITER MHA, FLASH_ATTN)
    backend_source: str | None = None  # BACKEND_SOURCES
    backend_name: str | None = None  # the enum name (ROCM_AITER_FA) behind `backend`
    # requests in flight at vLLM's API server (`GET /load`); None without load tracking
    requests_in_flight: int | None = None
    # whether vsup reads /load (the instance runs with --enable-server-load-tracking); None
    # while it does not run
    load_tracking: bool | None = None


@dataclass(frozen=True)
class MemoryStatus:
    """The instance's GPU memory: what its processes hold (the probe), what the plan gave it,
    and vLLM's own account from its start-up log (telemetry/memprofile.py, summed over its
    worker processes; None where the log did not say: CPU, not started yet)."""

    hbm_bytes: int | None = None
    hbm_source: str = "unavailable"  # HBM_SOURCES
    # bytes per GPU index ("0": ...) the instance's processes hold, summed over its processes on
    # each GPU; None without per-process GPU figures (CPU instances, no probe)
    hbm_per_gpu: dict[str, int | None] | None = None
    hbm_start_bytes: int | None = None  # HBM held when it first served (growth baseline)
    planned_hbm_bytes: int | None = None
    gpu_memory_utilization: float | None = None  # the spec's (vLLM's flag)
    vllm_requested_hbm_bytes: int | None = None  # gpu_memory_utilization x what CUDA reports
    vllm_weights_bytes: int | None = None
    vllm_activation_bytes: int | None = None  # peak activation of its profile run
    vllm_non_torch_bytes: int | None = None  # allocations its torch allocator does not see
    vllm_cudagraph_bytes: int | None = None
    vllm_kv_cache_bytes: int | None = None


@dataclass(frozen=True)
class StallStatus:
    """Stall detection's verdict (telemetry/stall.py): a `ready` instance with requests running
    or waiting and no token processed for its `stall_after_s`. A part beside the state, not a
    state, so that clients switching on the state keep working; the instance's `stall` is None
    where vsup cannot tell (not ready, no fresh figures, off)."""

    stalled: bool
    since: str | None = None  # ISO 8601 UTC: its last progress (or its work's start)
    for_s: float | None = None  # seconds since then
    # what showed the work: `engine` (vLLM's gauges), `server` (requests the API server holds,
    # /load, that no engine shows: a freeze that began while idle), `canary`; None unless stalled
    evidence: str | None = None
    ranks: tuple[int, ...] = ()  # data parallel: the ranks with work and no progress


@dataclass(frozen=True)
class InstanceStatus:
    """One instance: who it is (name, where it serves, what model on which GPUs) and its typed
    parts - `lifecycle` (the engine's state and restarts), `telemetry` (server figures),
    `memory` (GPU memory held, planned and as vLLM accounts it), `stall` (None: cannot tell),
    `sleep` (None: no sleep mode), `pull` (the pull its start waits for, or that failed),
    `parallel` and `ranks` (its data-parallel shape and ranks).

    On the wire (schema 1) it is one flat object: `to_json` writes the keys of `WIRE_KEYS` in
    that order and `from_json` reads them back into the parts (docs/ARCHITECTURE.md)."""

    name: str
    lifecycle: LifecycleStatus
    port: int | None = None
    gpus: tuple[int, ...] = ()
    model: str | None = None
    # The name vLLM serves the model under when it is not `model` (--served-model-name, or the
    # hub id of a pulled model loaded from its local snapshot); None: `model` itself.
    served_model_name: str | None = None
    host: str | None = None
    telemetry: TelemetryStatus = TelemetryStatus()
    memory: MemoryStatus = MemoryStatus()
    stall: StallStatus | None = None
    # vLLM's sleep mode (docs/sleep.md): None for an instance that does not use it. A part
    # beside the state like `stall`: a sleeping server stays `ready` but serves nothing.
    sleep: SleepStatus | None = None
    # The pull this instance waits for before its start (the state stays what the engine says:
    # `stopped` for a new instance), or the pull that failed and kept it from starting.
    pull: PullStatus | None = None
    parallel: Parallel | None = None  # TP x PP x DP as the instance runs
    ranks: tuple[RankStatus, ...] = ()  # data parallel only: one per rank on this node
    span: SpanStatus | None = None  # a server across nodes: this node's part; None otherwise

    @property
    def is_ready(self) -> bool:
        return self.lifecycle.state == State.READY

    @property
    def active_stall(self) -> StallStatus | None:
        """The stall part while stall detection flags the instance now, else None."""
        stall = self.stall
        return stall if stall is not None and stall.stalled else None

    def to_json(self) -> dict[str, Any]:
        """This instance's schema 1 object (`status --json`'s `instances[]`): flat keys."""
        return _instance_plain(self)

    def with_wire(self, **values: Any) -> InstanceStatus:
        """A copy with these schema 1 keys (`WIRE_KEYS`, values typed) changed."""
        return InstanceStatus.from_wire(self.name, **{**_wire_values(self), **values})

    @classmethod
    def from_wire(cls, name: str, /, **values: Any) -> InstanceStatus:
        """An instance from schema 1's flat keys (`WIRE_KEYS`, values already typed): every
        key left out is unknown (the state `stopped`). Unknown keys raise TypeError."""
        # one dict per part, filled by index: the daemon builds every instance's row from
        # these keys each poll (docs/benchmarks.md, 2026-12-06)
        own: dict[str, Any] = {}
        parts: tuple[dict[str, Any], ...] = (own, {}, {}, {}, {})
        place = _WIRE_INDEX
        for key, value in values.items():
            try:
                at, attr = place[key]
            except KeyError:
                raise TypeError(f"InstanceStatus has no key {key!r}") from None
            parts[at][attr] = value
        life, tel, mem, stall = parts[1], parts[2], parts[3], parts[4]
        life["state"] = State(life.get("state", State.STOPPED))
        own["name"] = own.get("name", name)
        own["lifecycle"] = _filled(LifecycleStatus, life)
        own["telemetry"] = _filled(TelemetryStatus, tel) if tel else _EMPTY_TELEMETRY
        own["memory"] = _filled(MemoryStatus, mem) if mem else _EMPTY_MEMORY
        own["stall"] = (
            None if not stall or stall.get("stalled") is None else _filled(StallStatus, stall)
        )
        return _filled(InstanceStatus, own)


# The wire (schema 1): each flat key of an instance in `status --json`, in the order the
# document has always carried them, and where it lives: (key, part, attribute); part None is
# the instance itself. A field added to a part must be added here too (test_status_parts.py);
# a null `stalled` reads as `stall = None` (no verdict: its other keys are empty then too).
_WIRE: tuple[tuple[str, str | None, str], ...] = (
    ("name", None, "name"),
    ("state", "lifecycle", "state"),
    ("pid", "lifecycle", "pid"),
    ("port", None, "port"),
    ("gpus", None, "gpus"),
    ("model", None, "model"),
    ("restarts", "lifecycle", "restarts"),
    ("uptime_s", "lifecycle", "uptime_s"),
    ("hbm_bytes", "memory", "hbm_bytes"),
    ("hbm_source", "memory", "hbm_source"),
    ("kv_cache_usage", "telemetry", "kv_cache_usage"),
    ("kv_capacity_tokens", "telemetry", "kv_capacity_tokens"),
    ("preemptions_total", "telemetry", "preemptions_total"),
    ("preemptions_per_min", "telemetry", "preemptions_per_min"),
    ("requests_running", "telemetry", "requests_running"),
    ("requests_waiting", "telemetry", "requests_waiting"),
    ("generation_tokens_per_s", "telemetry", "generation_tokens_per_s"),
    ("backend", "telemetry", "backend"),
    ("backend_source", "telemetry", "backend_source"),
    ("last_exit", "lifecycle", "last_exit"),
    ("prompt_tokens_per_s", "telemetry", "prompt_tokens_per_s"),
    ("prefix_cache_hit_rate", "telemetry", "prefix_cache_hit_rate"),
    ("planned_hbm_bytes", "memory", "planned_hbm_bytes"),
    ("gpu_memory_utilization", "memory", "gpu_memory_utilization"),
    ("state_since_s", "lifecycle", "state_since_s"),
    ("run", "lifecycle", "run"),
    ("host", None, "host"),
    ("backoff_remaining_s", "lifecycle", "backoff_remaining_s"),
    ("backend_name", "telemetry", "backend_name"),
    ("waiting_for", "lifecycle", "waiting_for"),
    ("failed_why", "lifecycle", "failed_why"),
    ("vllm_requested_hbm_bytes", "memory", "vllm_requested_hbm_bytes"),
    ("vllm_weights_bytes", "memory", "vllm_weights_bytes"),
    ("vllm_activation_bytes", "memory", "vllm_activation_bytes"),
    ("vllm_non_torch_bytes", "memory", "vllm_non_torch_bytes"),
    ("vllm_cudagraph_bytes", "memory", "vllm_cudagraph_bytes"),
    ("vllm_kv_cache_bytes", "memory", "vllm_kv_cache_bytes"),
    ("hbm_start_bytes", "memory", "hbm_start_bytes"),
    ("parallel", None, "parallel"),
    ("hbm_per_gpu", "memory", "hbm_per_gpu"),
    ("ranks", None, "ranks"),
    ("stalled", "stall", "stalled"),
    ("stalled_since", "stall", "since"),
    ("stalled_for_s", "stall", "for_s"),
    ("stall_evidence", "stall", "evidence"),
    ("stalled_ranks", "stall", "ranks"),
    ("requests_in_flight", "telemetry", "requests_in_flight"),
    ("load_tracking", "telemetry", "load_tracking"),
    ("wait", "lifecycle", "wait"),
    ("start_timeout_s", "lifecycle", "start_timeout_s"),
    ("outdated", "lifecycle", "outdated"),
    ("outdated_fields", "lifecycle", "outdated_fields"),
    ("pull", None, "pull"),
    ("served_model_name", None, "served_model_name"),
    ("sleep", None, "sleep"),
    ("span", None, "span"),
)
WIRE_KEYS = tuple(key for key, _part, _attr in _WIRE)
_SOURCES = (None, "lifecycle", "telemetry", "memory", "stall")  # `_wire_values`' order
_WIRE_AT = tuple((key, _SOURCES.index(part), attr) for key, part, attr in _WIRE)
_WIRE_PLACE = {key: (part, attr) for key, part, attr in _WIRE}
_WIRE_INDEX = {key: (at, attr) for key, at, attr in _WIRE_AT}  # at: `_SOURCES`' index
# the parts that travel flat, and their types
_PART_TYPES: dict[str, type] = {
    "lifecycle": LifecycleStatus,
    "telemetry": TelemetryStatus,
    "memory": MemoryStatus,
    "stall": StallStatus,
}
# what the wire carries for an instance without a stall verdict
_NO_STALL = StallStatus(stalled=None)  # type: ignore[arg-type]
_EMPTY_TELEMETRY = TelemetryStatus()
_EMPTY_MEMORY = MemoryStatus()


def _defaults(cls: type) -> tuple[dict[str, Any], frozenset[str]]:
    """A dataclass's fields in their order, each with its default (None for those without
    one: none here has a default_factory), and the names of those without a default."""
    out: dict[str, Any] = {}
    required = []
    for f in fields(cls):
        assert f.default_factory is MISSING, f"{cls.__name__}.{f.name}: a default_factory"
        out[f.name] = None if f.default is MISSING else f.default
        if f.default is MISSING:
            required.append(f.name)
    return out, frozenset(required)


_FILL: dict[type, tuple[dict[str, Any], frozenset[str]]] = {
    cls: _defaults(cls)
    for cls in (InstanceStatus, LifecycleStatus, TelemetryStatus, MemoryStatus, StallStatus)
}


def _filled(cls: type[_T], values: dict[str, Any]) -> _T:
    """`cls(**values)` for the instance's frozen parts without their generated `__init__`
    (a Python call per field: the daemon builds every instance's parts each poll, and
    `from_wire` was a third of its event loop's time at 64 instances; docs/benchmarks.md,
    2026-12-06, later still): the defaults, then `values`, as the instance's attributes, in
    the fields' order. Equal to what `cls(**values)` builds (tests/unit/test_snapshot_fill.py);
    the caller's keys are the fields' own (`_WIRE_INDEX` places them)."""
    defaults, required = _FILL[cls]
    if not required <= values.keys():  # what __init__ would say
        missing = sorted(required - values.keys())
        raise TypeError(f"{cls.__name__}() missing required arguments: {missing}")
    state = {**defaults, **values}
    obj = object.__new__(cls)
    object.__setattr__(obj, "__dict__", state)
    return obj


def _assemble(name: str, parts: dict[str | None, dict[str, Any]]) -> InstanceStatus:
    """An InstanceStatus from its values grouped by part (`_WIRE`'s places)."""
    own = parts.get(None, {})
    name = own.pop("name", name)
    life = parts.get("lifecycle", {})
    life["state"] = State(life.get("state", State.STOPPED))
    stall = parts.get("stall")
    return InstanceStatus(
        name=name,
        lifecycle=LifecycleStatus(**life),
        telemetry=TelemetryStatus(**parts.get("telemetry", {})),
        memory=MemoryStatus(**parts.get("memory", {})),
        stall=None if not stall or stall.get("stalled") is None else StallStatus(**stall),
        **own,
    )


def _wire_values(inst: InstanceStatus) -> dict[str, Any]:
    """Schema 1's flat keys of one instance, `_WIRE`'s order, values as the parts hold them."""
    src = _sources(inst)
    return {key: getattr(src[at], attr) for key, at, attr in _WIRE_AT}


def _sources(inst: InstanceStatus) -> tuple[Any, ...]:
    stall = inst.stall if inst.stall is not None else _NO_STALL
    return (inst, inst.lifecycle, inst.telemetry, inst.memory, stall)


def _instance_plain(inst: InstanceStatus) -> dict[str, Any]:
    """Schema 1's flat object of one instance: `_WIRE`'s keys in its order, JSON data."""
    src = _sources(inst)
    return {key: _plain(getattr(src[at], attr)) for key, at, attr in _WIRE_AT}


def _instance_decoder() -> Any:
    """Schema 1's flat instance object -> InstanceStatus (unknown keys ignored)."""
    own_hints = typing.get_type_hints(InstanceStatus, vars(sys.modules[__name__]))
    hints = {
        name: typing.get_type_hints(t, vars(sys.modules[__name__]))
        for name, t in _PART_TYPES.items()
    }
    # a stall verdict's `stalled` is a bool, but the wire says null where there is none
    hints["stall"]["stalled"] = bool | None
    decoders = tuple(
        (key, part, attr, _decoder(own_hints[attr] if part is None else hints[part][attr]))
        for key, part, attr in _WIRE
    )

    def decode(data: Any) -> InstanceStatus:
        if not isinstance(data, dict):
            raise TypeError(f"InstanceStatus is an object, not {type(data).__name__}")
        parts: dict[str | None, dict[str, Any]] = {}
        for key, part, attr, dec in decoders:
            if key in data:
                parts.setdefault(part, {})[attr] = dec(data[key])
        return _assemble(data["name"], parts)

    return decode


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    hbm_bytes: int | None
    instance: str | None  # the instance owning this pid, or None for a foreign process


# Clock-event reasons a GPU can report (`GpuHealth.throttle_reasons`), vendor-neutral names.
# NVML: nvmlClocksEventReason*; amdsmi: amdsmi_get_violation_status active_* (MI300 and newer),
# else gpu_metrics throttle_status (a bare yes/no: `unspecified`).
THROTTLE_REASONS = (
    "power_cap",  # software power cap: drawing the enforced power limit
    "thermal",  # software thermal slowdown (GPU or memory above its target)
    "hw_thermal",  # hardware thermal slowdown (PROCHOT on AMD)
    "hw_slowdown",  # hardware slowdown: thermal, power brake or power supply
    "hw_power_brake",  # an external power-brake signal (the node's power supply)
    "vr_thermal",  # AMD: voltage regulator too hot
    "hbm_thermal",  # AMD: HBM too hot
    "sync_boost",  # held with other GPUs in a sync-boost group
    "app_clocks",  # applications clocks setting
    "display_clocks",
    "idle",  # nothing to run: clocks low on purpose
    "unspecified",  # the driver says "throttled" without a reason
)
# Reasons that cost throughput and are not the GPU doing what it was told.
THROTTLE_HARDWARE = ("hw_slowdown", "hw_power_brake", "hw_thermal")
THROTTLE_THERMAL = ("thermal", "vr_thermal", "hbm_thermal")


@dataclass(frozen=True)
class XidEvent:
    """One NVIDIA XID error as NVML delivered it (critical-error events)."""

    xid: int
    at: str  # ISO 8601 UTC, when vsup read the event
    what: str | None = None  # NVIDIA's description, for the XIDs vsup knows
    hardware: bool = False  # one NVIDIA attributes to the GPU, its memory or the bus


@dataclass(frozen=True)
class GpuHealth:
    """What the driver says about a GPU's health. None: the driver does not give it (or not
    yet read). Counts are as the driver keeps them."""

    ecc_enabled: bool | None = None
    # volatile: since the driver loaded (NVML volatile; amdsmi's counts); aggregate: the
    # GPU's lifetime (NVML's InfoROM count; amdsmi has none)
    ecc_volatile_corrected: int | None = None
    ecc_volatile_uncorrected: int | None = None
    ecc_aggregate_corrected: int | None = None
    ecc_aggregate_uncorrected: int | None = None
    ecc_deferred: int | None = None  # AMD: errors whose correction was deferred
    retired_pages: int | None = None  # NVML retired pages (pre-Ampere); amdsmi bad pages
    retired_pages_pending: bool | None = None  # retirement waits for a GPU reset
    rows_remapped_correctable: int | None = None  # NVML row remapping (Ampere and newer)
    rows_remapped_uncorrectable: int | None = None
    row_remap_pending: bool | None = None  # a remap waits for a GPU reset
    row_remap_failed: bool | None = None  # a remap failed: the GPU needs service
    bad_pages_unreservable: int | None = None  # AMD: bad pages it could not retire
    xid_count: int | None = None  # XID errors seen since vsup began watching; None: no events
    xid_recent: tuple[XidEvent, ...] = ()  # those of the last hour, oldest first (at most 16)
    throttle_reasons: tuple[str, ...] | None = None  # THROTTLE_REASONS active now
    sm_clock_mhz: float | None = None
    sm_clock_max_mhz: float | None = None
    mem_clock_mhz: float | None = None
    mem_clock_max_mhz: float | None = None
    power_limit_w: float | None = None  # the enforced power cap

    @property
    def hardware_xids(self) -> tuple[XidEvent, ...]:
        return tuple(e for e in self.xid_recent if e.hardware)

    def faults(self) -> tuple[str, ...]:
        """Short labels for what needs a person: memory errors and hardware XIDs."""
        out = []
        if self.ecc_volatile_uncorrected:
            out.append(f"{self.ecc_volatile_uncorrected} uncorrectable ECC")
        if self.row_remap_failed:
            out.append("row remap failed")
        if self.row_remap_pending or self.retired_pages_pending:
            out.append("page retirement pending")
        if self.bad_pages_unreservable:
            out.append(f"{self.bad_pages_unreservable} unretirable bad pages")
        hw = self.hardware_xids
        if hw:
            out.append(f"XID {hw[-1].xid}")
        return tuple(out)

    def slowdowns(self) -> tuple[str, ...]:
        """The throttle reasons active now that cost throughput (not idle, app or sync)."""
        costly = (*THROTTLE_HARDWARE, *THROTTLE_THERMAL, "power_cap", "unspecified")
        return tuple(r for r in self.throttle_reasons or () if r in costly)


@dataclass(frozen=True)
class GpuStatus:
    index: int
    name: str | None
    hbm_total_bytes: int | None
    hbm_used_bytes: int | None
    util_pct: float | None
    temp_c: float | None
    power_w: float | None
    processes: tuple[GpuProcess, ...] = ()
    health: GpuHealth | None = None  # None: no health figures from this driver (or no GPU)


@dataclass(frozen=True)
class NodeInfo:
    hostname: str
    gpu_vendor: str  # nvidia | amd | none
    gpu_count: int
    cpu_count: int | None = None


@dataclass(frozen=True)
class SupervisorInfo:
    pid: int
    version: str
    uptime_s: float
    layout: str | None = None
    home: str | None = None


# What a `vsup bench` run is doing (status JSON's `bench`), in the order a layout goes through.
BENCH_PHASES = ("applying", "waiting_ready", "warming", "running", "collecting", "restoring")


# Who reports a bench's progress: `vsup bench`, or `vsup tune` measuring its candidates.
BENCH_TOOLS = ("bench", "tune")


@dataclass(frozen=True)
class BenchStatus:
    """A `vsup bench` run in progress, as its client last reported it to the daemon
    (control/benchprogress.py; status JSON's `bench`).

    `index`/`count`: which layout of how many (None while restoring); `tool`: `vsup bench`, or
    `vsup tune` (its layouts are candidates); `elapsed_s`: seconds in this phase; `age_s`:
    seconds since the bench last reported (it does every second). A key the daemon adds to the
    report must be a field here (with a default), or clients lose it."""

    pid: int
    phase: str
    layout: str | None = None
    index: int | None = None
    count: int | None = None
    requests_done: int | None = None
    requests_total: int | None = None
    elapsed_s: float | None = None
    started_at: str | None = None
    age_s: float | None = None
    tool: str = "bench"  # BENCH_TOOLS: `vsup tune` reports through the same route
    eta_s: float | None = None  # about how long the whole run has left (a tune says it)


BenchProgress = BenchStatus  # its earlier name


# A rolling apply's states (engine/rollout.py). `interrupted`: the daemon that drove it ended
# (killed) before it did; the next daemon reports it and `vsup up` of the layout finishes it.
ROLLOUT_STATES = tuple(s.value for s in RolloutState)


@dataclass(frozen=True)
class RolloutStatus:
    """The latest rolling apply (status JSON's `rollout`; engine/rollout.py).

    `wave`/`waves`: the wave under way (or the last one) of how many; `done`/`total`:
    instances restarted with the new spec of how many; `current`: the wave's instances being
    drained and restarted; `pending`: not yet taken down (they serve their old spec);
    `failure`: why it stopped (a wave's instance did not come back) and what keeps its old
    config. Additions: `names` (every instance of the rollout, layout order), `restarted`
    (those done), `old_config` (those that run their old spec now: pending ones, a wave not
    yet back, and after an interruption whatever the next daemon found on the old spec)."""

    state: str  # one of ROLLOUT_STATES
    wave: int
    waves: int
    done: int
    total: int
    current: tuple[str, ...] = ()
    pending: tuple[str, ...] = ()
    max_unavailable: int = 1
    failure: str | None = None
    started_at: str | None = None  # ISO 8601 UTC
    ended_at: str | None = None
    names: tuple[str, ...] = ()
    restarted: tuple[str, ...] = ()
    old_config: tuple[str, ...] = ()
    drain_timeout_s: float | None = None  # None: each instance's own
    interrupted_at: str | None = None  # when the next daemon found it unfinished
    # a canary (docs/canary.md): its instances (the first wave), how long it is watched,
    # watching | passed | failed (None: no canary, or not yet ready), and the gate's words
    canary: tuple[str, ...] = ()
    canary_s: float = 0.0
    canary_state: str | None = None
    verdict: str | None = None

    @property
    def active(self) -> bool:
        """Running, or interrupted with instances left on their old spec."""
        return self.state == RolloutState.RUNNING or (
            self.state == RolloutState.INTERRUPTED and bool(self.old_config)
        )


@dataclass(frozen=True)
class RouterWorker:
    """One member of the router's worker set as vsup sees it."""

    name: str
    url: str | None = None
    state: str | None = None  # the instance's state
    in_router: bool | None = None  # in the router's worker list now (None: not read yet)
    wanted: bool = False  # vsup wants it there (ready, not stalled)
    share: float | None = None  # its fraction of the router's requests so far
    requests_total: float | None = None
    healthy: bool | None = None  # the router's own health verdict


@dataclass(frozen=True)
class RouterForeignWorker:
    """A worker someone else added to the router, found and removed by vsup (the recent ones;
    router/membership.py ForeignWorker)."""

    url: str
    first_seen: str  # ISO 8601 UTC: the first removal of this incident
    last_seen: str  # and the latest
    removals: int  # how often vsup removed it (it comes back while something re-adds it)
    users: tuple[str, ...] = ()  # other local users connected to the router's port then


@dataclass(frozen=True)
class RouterRemovedWorker:
    """A member someone else removed from the router, found missing and put back by vsup (the
    recent ones; router/membership.py RemovedWorker)."""

    url: str
    name: str  # the instance
    first_seen: str  # ISO 8601 UTC: the first restore of this incident
    last_seen: str  # and the latest
    restores: int  # how often vsup put it back (a remove loop takes it out again and again)
    users: tuple[str, ...] = ()  # other local users connected to the router's port then


@dataclass(frozen=True)
class RouterHolder:
    """Wake on request (router/holder.py): the router's worker for a model none of whose
    instances is awake; it holds requests while vsup wakes one. Counts are since the daemon
    started."""

    model: str
    url: str | None = None
    in_router: bool | None = None  # standing in for the model now
    held: int = 0  # requests held now
    waking: bool = False
    total: int = 0
    forwarded: int = 0
    timed_out: int = 0
    dropped: int = 0
    failed: int = 0
    full: int = 0
    error: str | None = None  # why the last held request was refused


@dataclass(frozen=True)
class RouterStatus:
    """The layout's vllm-router (status JSON's `router`; engine/routing.py, docs/router.md)."""

    state: str
    pid: int | None = None
    host: str | None = None
    port: int | None = None
    metrics_port: int | None = None
    policy: str | None = None
    model: str | None = None
    url: str | None = None
    endpoint: str | None = None  # the one address clients should use
    run: int | None = None
    restarts: int = 0
    uptime_s: float | None = None
    log: str | None = None
    last_exit: LastExit | None = None
    failed_why: str | None = None
    requests_per_s: float | None = None
    errors_per_s: float | None = None
    requests_total: float | None = None
    errors_total: float | None = None
    retries_total: float | None = None
    error: str | None = None  # the last error talking to it
    workers: tuple[RouterWorker, ...] = ()
    foreign_workers: tuple[RouterForeignWorker, ...] = ()
    removed_workers: tuple[RouterRemovedWorker, ...] = ()
    held: int = 0  # requests held for a wake now (all models; `holders` has each)
    holders: tuple[RouterHolder, ...] = ()


@dataclass(frozen=True)
class StatusSnapshot:
    supervisor: SupervisorInfo
    node: NodeInfo
    gpus: tuple[GpuStatus, ...]
    instances: tuple[InstanceStatus, ...]
    advice: tuple[Advice, ...] = ()
    schema: int = SCHEMA
    # the layout's vllm-router (engine/routing.py `status_json`), None without `[router]`
    router: RouterStatus | None = None
    bench: BenchStatus | None = None  # a `vsup bench` replaces the layout while it runs
    rollout: RolloutStatus | None = None  # the latest rolling apply, None before one
    pulls: tuple[PullStatus, ...] = ()  # the latest apply's pulls (docs/pull.md)

    @property
    def ready_count(self) -> int:
        return sum(1 for i in self.instances if i.is_ready)

    def instance(self, name: str) -> InstanceStatus | None:
        for inst in self.instances:
            if inst.name == name:
                return inst
        return None

    def to_json(self) -> dict[str, Any]:
        """The `status --json` document (schema 1): `schema` first, tuples as lists.

        Built once per snapshot (the daemon serves it to every status request of a poll):
        the document is shared, so treat it as read-only (copy it to change it)."""
        cached = self.__dict__.get("_json")
        if cached is None:
            cached = {"schema": self.schema, **_plain(self)}
            object.__setattr__(self, "_json", cached)
        return cached

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> StatusSnapshot:
        """Rebuild a snapshot from `to_json()` output (or that document after a JSON round
        trip), typed all the way down. Unknown keys are ignored, so a client reads a newer
        daemon's document; keys an older daemon did not send take their defaults."""
        if not isinstance(doc, dict):
            raise ValueError(f"a status document is a JSON object, not {type(doc).__name__}")
        if doc.get("schema") != SCHEMA:
            raise ValueError(f"unsupported status schema {doc.get('schema')!r} (expected {SCHEMA})")
        try:
            # lists a document may leave out when empty (as older tools wrote it)
            snap: StatusSnapshot = _decode_dataclass(cls, {"gpus": [], "instances": [], **doc})
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a status document: {exc}") from None
        return snap

    @staticmethod
    def decode_part(cls: type[_T], doc: dict[str, Any]) -> _T:
        """One part of the document (a `BenchStatus`, `RolloutStatus`, `RouterStatus`, ...)
        from its JSON object, as `from_json` reads it."""
        part: _T = _decode_dataclass(cls, doc)
        return part


_SCALARS = frozenset({str, int, float, bool, type(None)})
_ENUMS = frozenset({State, SleepState})  # the snapshot's enum-typed fields: their values


def _plain(obj: Any) -> Any:
    """JSON data of a snapshot value: dataclasses as objects in field order, tuples as lists.
    (dataclasses.asdict deep-copies every leaf: slower, and this runs for every snapshot.)"""
    kind = type(obj)
    if kind in _SCALARS:
        return obj
    if kind in _ENUMS:
        return obj.value
    if kind is InstanceStatus:
        return _instance_plain(obj)
    if kind is tuple or kind is list:
        return [_plain(v) for v in obj]
    if kind is dict:
        return {k: _plain(v) for k, v in obj.items()}
    names = _field_names(kind)
    if names is None:
        return obj.value if isinstance(obj, enum.Enum) else obj
    return {name: _plain(getattr(obj, name)) for name in names}


_FIELD_NAMES: dict[type, tuple[str, ...] | None] = {}


def _field_names(cls: type) -> tuple[str, ...] | None:
    """A dataclass's field names (None for any other type), read once per class."""
    try:
        return _FIELD_NAMES[cls]
    except KeyError:
        names = tuple(f.name for f in fields(cls)) if is_dataclass(cls) else None
        _FIELD_NAMES[cls] = names
        return names


def _decode_dataclass(cls: type, data: Any) -> Any:
    return _decoder(cls)(data)


def _identity(value: Any) -> Any:
    return value


@functools.cache
def _decoder(hint: Any) -> Any:
    """A function turning JSON data into the type `hint` says (dataclasses rebuilt, lists as
    tuples), made once per type: the dashboard parses a snapshot every second."""
    origin = typing.get_origin(hint)
    if origin is typing.Union or origin is types.UnionType:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        inner = _decoder(args[0]) if len(args) == 1 else _identity
        return lambda v: None if v is None else inner(v)
    if origin is tuple:
        item = _decoder(typing.get_args(hint)[0])
        if item is _identity:
            return lambda v: () if v is None else tuple(v)
        return lambda v: () if v is None else tuple(item(x) for x in v)
    if origin is dict:
        return lambda v: None if v is None else dict(v)
    if hint is InstanceStatus:
        return _instance_decoder()
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return hint  # its value -> its member (an unknown value raises ValueError)
    if isinstance(hint, type) and is_dataclass(hint):
        return _dataclass_decoder(hint)
    return _identity


def _dataclass_decoder(cls: type) -> Any:
    hints = typing.get_type_hints(cls, vars(sys.modules[cls.__module__]))
    parts = tuple((f.name, _decoder(hints[f.name])) for f in fields(cls))

    def decode(data: Any) -> Any:
        if not isinstance(data, dict):
            raise TypeError(f"{cls.__name__} is an object, not {type(data).__name__}")
        return cls(**{name: dec(data[name]) for name, dec in parts if name in data})

    return decode


def empty_instance(name: str, **values: Any) -> InstanceStatus:
    """An instance with every telemetry value unknown; `values` fill in what is known, by
    their wire names (`WIRE_KEYS`: `state=`, `kv_cache_usage=`, `stalled=`, ...)."""
    return InstanceStatus.from_wire(name, **values)
