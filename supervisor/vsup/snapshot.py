"""The status snapshot: the one contract between the daemon and every client.

`vsup status --json` (schema 1), the control API, the dashboard and `vsup probe --json` all
speak these dataclasses. Unknown values are `None` (JSON `null`), never a made-up number.
Keys may be added within schema 1; none is removed or renamed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from vsup.states import ExitReason, PullState, State

SCHEMA = 1

# The wire's names, in the enums' order (vsup.states is their one source).
STATES = tuple(s.value for s in State)
EXIT_REASONS = tuple(r.value for r in ExitReason)

# Where a per-instance HBM figure came from.
HBM_SOURCES = ("process", "device", "unavailable")
# Where the attention backend name came from.
BACKEND_SOURCES = ("log", "flag", "default")


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
class InstanceStatus:
    name: str
    state: str
    pid: int | None
    port: int | None
    gpus: tuple[int, ...]
    model: str | None
    restarts: int
    uptime_s: float | None
    hbm_bytes: int | None
    hbm_source: str
    kv_cache_usage: float | None  # 0..1
    kv_capacity_tokens: int | None
    preemptions_total: float | None
    preemptions_per_min: float | None
    requests_running: float | None
    requests_waiting: float | None
    generation_tokens_per_s: float | None
    backend: str | None
    backend_source: str | None
    last_exit: LastExit | None
    # Additions beyond the schema's first keys (schema 1 allows added keys).
    prompt_tokens_per_s: float | None = None
    prefix_cache_hit_rate: float | None = None
    planned_hbm_bytes: int | None = None
    gpu_memory_utilization: float | None = None
    state_since_s: float | None = None  # seconds in the current state
    run: int | None = None  # how many times this instance was spawned by this supervisor
    host: str | None = None
    backoff_remaining_s: float | None = None
    backend_name: str | None = None  # the enum name (ROCM_AITER_FA) behind `backend` (AITER MHA)
    waiting_for: str | None = None  # a start waiting for its turn on a device, e.g. "a starting"
    failed_why: str | None = None  # state `failed`: why vsup will not start it again by itself
    # vLLM's own account of its GPU memory, from its start-up log (telemetry/memprofile.py),
    # summed over its worker processes; None where the log did not say (CPU, not started yet).
    vllm_requested_hbm_bytes: int | None = None  # gpu_memory_utilization x what CUDA reports
    vllm_weights_bytes: int | None = None
    vllm_activation_bytes: int | None = None  # peak activation of its profile run
    vllm_non_torch_bytes: int | None = None  # allocations its torch allocator does not see
    vllm_cudagraph_bytes: int | None = None
    vllm_kv_cache_bytes: int | None = None
    hbm_start_bytes: int | None = None  # HBM held when it first served (growth baseline)
    parallel: Parallel | None = None  # TP x PP x DP as the instance runs
    # bytes per GPU index ("0": ...) the instance's processes hold, summed over its processes on
    # each GPU; None without per-process GPU figures (CPU instances, no probe)
    hbm_per_gpu: dict[str, int | None] | None = None
    ranks: tuple[RankStatus, ...] = ()  # data parallel only: one per rank on this node
    # Stall detection (telemetry/stall.py): a `ready` instance with requests running or waiting
    # and no token processed for its `stall_after_s`. A flag, not a state, so that clients
    # switching on `state` keep working. None: cannot tell (not ready, no fresh figures, off).
    stalled: bool | None = None
    stalled_since: str | None = None  # ISO 8601 UTC: its last progress (or its work's start)
    stalled_for_s: float | None = None  # seconds since then
    # The pull this instance waits for before its start (`state` stays what the engine says:
    # `stopped` for a new instance), or the pull that failed and kept it from starting.
    pull: PullStatus | None = None

    @property
    def is_ready(self) -> bool:
        return self.state == State.READY


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


@dataclass(frozen=True)
class BenchProgress:
    """A `vsup bench` run in progress, as its client last reported it to the daemon.

    `index`/`count`: which layout of how many (None while restoring); `elapsed_s`: seconds in
    this phase; `age_s`: seconds since the bench last reported (it does every second)."""

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


@dataclass(frozen=True)
class StatusSnapshot:
    supervisor: SupervisorInfo
    node: NodeInfo
    gpus: tuple[GpuStatus, ...]
    instances: tuple[InstanceStatus, ...]
    advice: tuple[Advice, ...] = ()
    schema: int = SCHEMA
    # the layout's vllm-router (engine/routing.py `status_json`), None without `[router]`
    router: dict[str, Any] | None = None
    bench: BenchProgress | None = None  # a `vsup bench` replaces the layout while it runs
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
        """The `status --json` document (schema 1): `schema` first, tuples as lists."""
        doc = asdict(self)
        return {"schema": doc.pop("schema"), **doc}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> StatusSnapshot:
        """Rebuild a snapshot from `to_json()` output; unknown keys are ignored."""
        if doc.get("schema") != SCHEMA:
            raise ValueError(f"unsupported status schema {doc.get('schema')!r} (expected {SCHEMA})")
        return cls(
            supervisor=_build(SupervisorInfo, doc["supervisor"]),
            node=_build(NodeInfo, doc["node"]),
            gpus=tuple(
                _build(
                    GpuStatus,
                    g,
                    processes=tuple(_build(GpuProcess, p) for p in g.get("processes", ())),
                    health=_health(g.get("health")),
                )
                for g in doc.get("gpus", ())
            ),
            instances=tuple(
                _build(
                    InstanceStatus,
                    i,
                    gpus=tuple(i.get("gpus") or ()),
                    last_exit=_build(LastExit, i["last_exit"]) if i.get("last_exit") else None,
                    parallel=_build(Parallel, i["parallel"]) if i.get("parallel") else None,
                    ranks=tuple(
                        _build(RankStatus, r, gpus=tuple(r.get("gpus") or ()))
                        for r in i.get("ranks") or ()
                    ),
                    pull=_pull(i.get("pull")),
                )
                for i in doc.get("instances", ())
            ),
            advice=tuple(_build(Advice, a) for a in doc.get("advice", ())),
            router=doc.get("router"),
            bench=_build(BenchProgress, doc["bench"]) if doc.get("bench") else None,
            pulls=tuple(p for p in (_pull(d) for d in doc.get("pulls") or ()) if p is not None),
        )


def _build(cls: type, data: dict[str, Any], **override: Any) -> Any:
    names = {f.name for f in fields(cls)}
    kwargs = {k: v for k, v in data.items() if k in names}
    kwargs.update(override)
    return cls(**kwargs)


def _pull(doc: dict[str, Any] | None) -> PullStatus | None:
    if not doc:
        return None
    return _build(
        PullStatus,
        doc,
        instances=tuple(doc.get("instances") or ()),
        current=tuple(doc.get("current") or ()),
    )


def _health(doc: dict[str, Any] | None) -> GpuHealth | None:
    if not doc:
        return None
    reasons = doc.get("throttle_reasons")
    return _build(
        GpuHealth,
        doc,
        xid_recent=tuple(_build(XidEvent, e) for e in doc.get("xid_recent") or ()),
        throttle_reasons=None if reasons is None else tuple(reasons),
    )


def empty_instance(name: str, **values: Any) -> InstanceStatus:
    """An instance with every telemetry value unknown; `values` fill in what is known."""
    base: dict[str, Any] = dict(
        name=name,
        state="stopped",
        pid=None,
        port=None,
        gpus=(),
        model=None,
        restarts=0,
        uptime_s=None,
        hbm_bytes=None,
        hbm_source="unavailable",
        kv_cache_usage=None,
        kv_capacity_tokens=None,
        preemptions_total=None,
        preemptions_per_min=None,
        requests_running=None,
        requests_waiting=None,
        generation_tokens_per_s=None,
        backend=None,
        backend_source=None,
        last_exit=None,
    )
    base.update(values)
    return InstanceStatus(**base)
