"""Live advice: what the telemetry says an operator should change (docs/ARCHITECTURE.md, advice).

Pure functions over a snapshot's instances and GPUs plus a little history, so every rule is
tested with plain data. The daemon runs them each poll and puts the result in the snapshot.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from vsup.control.stalls import stall_work
from vsup.router import ForeignWorker, RemovedWorker
from vsup.snapshot import (
    SPAN_HEAD_WAIT,
    THROTTLE_HARDWARE,
    THROTTLE_THERMAL,
    Advice,
    GpuHealth,
    GpuStatus,
    InstanceStatus,
    RouterStatus,
    SleepStatus,
)
from vsup.states import ExitReason, PullState, SleepState, State

KV_FULL = 0.95
KV_PEAK_WINDOW_S = 60.0  # the KV-usage peak the advice quotes is over this window
GiB = 1024**3
# HBM above the planned share plus vLLM's memory outside it (hbm_allowance) by more than this
# fraction of the share (at least HBM_OVER_MIN_BYTES) is reported, and so is growth since the
# instance started serving by more than that fraction (at least HBM_GROWTH_MIN_BYTES).
HBM_OVER_FRACTION = 0.02
HBM_OVER_MIN_BYTES = 512 * 1024**2
HBM_GROWTH_MIN_BYTES = 1 * GiB
# Memory vLLM's profile does not see, per GPU. Seen on an H200 with vLLM 0.26 (tests/fixtures/
# vllm-0.26-cuda/README.md): 1.41 GiB above the share, of which the log named 0.67 GiB
# (non-torch + CUDA graphs); 0.51 GiB was gone before vLLM's baseline (the CUDA context).
CUDA_CONTEXT_BYTES = 1 * GiB
# Without vLLM's memory line: context, non-torch memory and CUDA graphs at TP1 (1.41 GiB seen
# above), and with TP > 1 the NCCL and custom all-reduce buffers on top.
DEFAULT_ALLOWANCE_TP1 = int(1.5 * GiB)
DEFAULT_ALLOWANCE_TP = int(2.5 * GiB)
FOREIGN_WORKERS_SHOWN = 5  # foreign router workers a message names
CRASH_LOOP_EXITS = 3  # failures within the window that make a crash loop
CRASH_WINDOW_S = 600.0


@dataclass(frozen=True)
class AdviceInputs:
    """Everything the rules look at besides the snapshot itself."""

    recent_failures: Mapping[str, int]  # instance -> failed exits in the crash window
    problems: tuple[Advice, ...] = ()  # the daemon's own (e.g. a corrupt state file)
    kv_peak: Mapping[str, float | None] = field(default_factory=dict)  # max KV usage, last minute
    # workers someone else added to the router and vsup removed, recently (engine/routing.py)
    foreign_workers: tuple[ForeignWorker, ...] = ()
    # members someone else removed from the router and vsup put back, recently
    removed_workers: tuple[RemovedWorker, ...] = ()
    router: RouterStatus | None = None  # the layout's router, as the status shows it


def compute_advice(
    instances: Iterable[InstanceStatus], gpus: Iterable[GpuStatus], inputs: AdviceInputs
) -> tuple[Advice, ...]:
    """Every rule, most severe first, then in instance order."""
    out: list[Advice] = list(inputs.problems)
    instances = list(instances)
    for inst in instances:
        out += kv_too_small(inst, inputs.kv_peak.get(inst.name))
        out += hbm_over_plan(inst)
        out += crash_loop(inst, inputs.recent_failures.get(inst.name, 0))
        out += start_timed_out(inst)
        out += waits_for_head(inst)
        out += stalled(inst)
        out += sleep_trouble(inst)
    out += pull_failed(instances)
    for gpu in gpus:
        out += foreign_processes(gpu)
        out += gpu_health(gpu, instances)
    out += router_failed(inputs.router)
    out += router_foreign_workers(inputs.foreign_workers)
    out += router_removed_workers(inputs.removed_workers)
    order = {"critical": 0, "warning": 1, "info": 2}
    return tuple(sorted(out, key=lambda a: order.get(a.severity, 3)))


def pull_failed(instances: Iterable[InstanceStatus]) -> list[Advice]:
    """A hub model's pull failed (control/pulls.py): its instances did not start. One piece
    of advice per pull, naming them (eight replicas of one model are one problem)."""
    out: list[Advice] = []
    seen: set[tuple[str, str]] = set()
    for inst in instances:
        p = inst.pull
        if p is None or p.state != PullState.FAILED or (p.model, p.revision) in seen:
            continue
        seen.add((p.model, p.revision))
        names = ", ".join(p.instances) or inst.name
        out.append(
            Advice(
                kind="pull_failed",
                severity="critical",
                message=(
                    f"{names}: not started: the pull of {p.model} failed ({p.reason}): "
                    f"{p.message}; fix that, then `vsup up` again (it retries the pull)"
                ),
                instance=inst.name if len(p.instances) <= 1 else None,
            )
        )
    return out


def kv_too_small(inst: InstanceStatus, kv_peak: float | None = None) -> list[Advice]:
    """Preemptions rising (the counter grew within the last minute): the KV cache is too small
    for the load.

    The product design asked for KV >= 95% as well. vLLM V1 preempts only when it cannot
    allocate a KV block, so a rising counter already proves the cache ran full; a 1 Hz sample of
    the gauge mostly misses that moment (measured on the CPU build: 13 preemptions while the
    gauge never read above 0.8), and with few blocks the gauge cannot even reach 95%. So the rise
    alone triggers the advice, and the KV figure only sets how loud it is: critical when the cache
    read >= 95% now or at its peak in the last minute, a warning otherwise."""
    rate = inst.telemetry.preemptions_per_min
    if rate is None or rate <= 0:
        return []
    usage = [v for v in (inst.telemetry.kv_cache_usage, kv_peak) if v is not None]
    peak = max(usage) if usage else None
    if peak is not None and peak > 0:
        kv_txt = f"KV cache peaked at {peak:.0%} in the last minute"
    else:
        # A preemption proves the cache ran full; a 0% (or no) reading only means the 1 Hz
        # sample missed that moment (the CPU build's gauge often reads 0 between steps).
        peak = None
        kv_txt = "its cache ran full between samples"
    if not inst.gpus:
        size = (
            f" ({inst.telemetry.kv_capacity_tokens:,} tokens)"
            if inst.telemetry.kv_capacity_tokens is not None
            else ""
        )
        fix = (
            f"its KV cache{size} is too small for this load and throughput suffers. On CPU the "
            "cache is host memory sized by VLLM_CPU_KVCACHE_SPACE (GiB, in the instance's env; "
            "args num-gpu-blocks-override caps it too): raise it, lower max-num-seqs, or send "
            "fewer requests at once."
        )
    else:
        fix = (
            "the KV cache is too small for this load and throughput suffers. Run fewer "
            "instances per GPU, raise gpu_memory_utilization, use an fp8 KV cache (args "
            'kv-cache-dtype = "fp8") or lower max-num-seqs.'
        )
    return [
        Advice(
            kind="kv_exhausted",
            severity="critical" if peak is not None and peak >= KV_FULL else "warning",
            instance=inst.name,
            message=f"{inst.name}: preempting ({rate:.0f}/min; {kv_txt}): {fix}",
        )
    ]


def hbm_allowance(inst: InstanceStatus) -> tuple[int, str]:
    """The HBM an instance may hold above its planned share, and what that figure rests on.

    vLLM fits what its allocator sees into gpu_memory_utilization x the GPU's memory; memory it
    does not budget comes on top. With its start-up memory line: the non-torch and CUDA graph
    parts it logged plus `CUDA_CONTEXT_BYTES` per GPU (the context that exists before its
    baseline, kernels loaded after its profile). Without: a default per GPU."""
    gpus = max(1, len(inst.gpus))
    logged = (inst.memory.vllm_non_torch_bytes, inst.memory.vllm_cudagraph_bytes)
    if any(v is not None for v in logged):
        parts = sum(v or 0 for v in logged)
        return parts + CUDA_CONTEXT_BYTES * gpus, "log"
    per_gpu = DEFAULT_ALLOWANCE_TP1 if gpus == 1 else DEFAULT_ALLOWANCE_TP
    return per_gpu * gpus, "default"


def _gib(n: int | float) -> str:
    # parts under a GiB (non-torch, CUDA graphs) need the second decimal vLLM logs them with
    return f"{n / GiB:.1f} GiB" if abs(n) >= GiB else f"{n / GiB:.2f} GiB"


def hbm_over_plan(inst: InstanceStatus) -> list[Advice]:
    """HBM beyond the planned share plus what vLLM keeps outside it, or grown since the
    instance started serving: drift, not the constant overhead every instance has."""
    used, plan = inst.memory.hbm_bytes, inst.memory.planned_hbm_bytes
    if used is None or not plan:
        return []
    allowance, source = hbm_allowance(inst)
    reasons = []
    limit = plan + allowance + max(plan * HBM_OVER_FRACTION, HBM_OVER_MIN_BYTES)
    if used > limit:
        if source == "log":
            why = (
                f"{_gib(allowance)} that vLLM keeps outside it (non-torch "
                f"{_gib(inst.memory.vllm_non_torch_bytes or 0)}, CUDA graphs "
                f"{_gib(inst.memory.vllm_cudagraph_bytes or 0)} from its start-up log, "
                "CUDA context "
                f"~{_gib(CUDA_CONTEXT_BYTES)} per GPU)"
            )
        else:
            why = (
                f"the ~{_gib(allowance)} that vLLM usually keeps outside it (CUDA context, "
                "non-torch memory, CUDA graphs; its log has no memory line to say exactly)"
            )
        reasons.append(
            f"{_gib(used - plan - allowance)} above its planned share of {_gib(plan)} "
            f"(gpu_memory_utilization {inst.memory.gpu_memory_utilization}) plus {why}"
        )
    start = inst.memory.hbm_start_bytes
    if start and used - start > max(plan * HBM_OVER_FRACTION, HBM_GROWTH_MIN_BYTES):
        reasons.append(
            f"grew by {_gib(used - start)} since it started serving ({_gib(start)} then): vLLM "
            "allocates its memory at start-up, so something outside its budget keeps growing"
        )
    if not reasons:
        return []
    return [
        Advice(
            kind="hbm_over_plan",
            severity="warning",
            instance=inst.name,
            gpu=inst.gpus[0] if inst.gpus else None,
            message=(
                f"{inst.name}: holds {_gib(used)} HBM, " + "; and ".join(reasons) + ". "
                "Co-tenants on its GPU may run out of memory: lower its "
                "gpu_memory_utilization or give it a GPU of its own."
            ),
        )
    ]


def crash_loop(inst: InstanceStatus, recent_failures: int) -> list[Advice]:
    """The breaker tripped (`failed`), or the instance keeps failing within the window."""
    reason = inst.lifecycle.last_exit.reason if inst.lifecycle.last_exit else "unknown"
    excerpt = ""
    if inst.lifecycle.last_exit and inst.lifecycle.last_exit.log_excerpt:
        excerpt = (
            f" Last log: {inst.lifecycle.last_exit.log_excerpt.strip().splitlines()[-1][:200]}"
        )
    if inst.lifecycle.state == State.FAILED:
        if inst.lifecycle.failed_why:
            says_what_to_do = (
                "vsup start" in inst.lifecycle.failed_why
                or "vsup restart" in inst.lifecycle.failed_why
            )
            hint = "" if says_what_to_do else f" Fix the cause, then `vsup restart {inst.name}`."
            policy = inst.lifecycle.failed_why.startswith("the restart policy gave up")
            why = inst.lifecycle.failed_why
            if reason in FIXED_IN_LAYOUT or reason == ExitReason.PORT_IN_USE:
                why, hint = _fails_fast(inst, reason, why)
            return [
                Advice(
                    kind="crash_loop" if policy else "failed",
                    severity="critical",
                    instance=inst.name,
                    message=(f"{inst.name}: failed: {why} (last exit: {reason}).{hint}{excerpt}"),
                )
            ]
        return [
            Advice(
                kind="crash_loop",
                severity="critical",
                instance=inst.name,
                message=(
                    f"{inst.name}: failed after repeated crashes (last exit: {reason}); vsup will "
                    f"not restart it. Fix the cause, then `vsup restart {inst.name}`.{excerpt}"
                ),
            )
        ]
    if recent_failures >= CRASH_LOOP_EXITS:
        return [
            Advice(
                kind="crash_loop",
                severity="warning",
                instance=inst.name,
                message=(
                    f"{inst.name}: crash loop, {recent_failures} failures in the last "
                    f"{CRASH_WINDOW_S / 60:.0f} min (last exit: {reason}); restarts back off."
                    f"{excerpt}"
                ),
            )
        ]
    return []


def start_timed_out(inst: InstanceStatus) -> list[Advice]:
    """Its last start was ended at `start_timeout_s` and it does not serve yet (starting again,
    backing off, or failed): a start slower than its timeout, most often on a busy node (other
    starts, a load on its cores), where the next try may time out the same way."""
    last = inst.lifecycle.last_exit
    if last is None or last.reason != ExitReason.STARTUP_TIMEOUT:
        return []
    if inst.lifecycle.state not in (State.STARTING, State.BACKOFF, State.FAILED):
        return []
    limit = (
        f"{inst.lifecycle.start_timeout_s:g} s"
        if inst.lifecycle.start_timeout_s
        else "its start_timeout_s"
    )
    # starting again: that start's log is the previous run's
    log = f"vsup logs {inst.name}" + (
        " --previous" if inst.lifecycle.state == State.STARTING else ""
    )
    span = inst.span
    if span is not None and not span.head and span.nodes:
        # a follower is ready only behind its head: the head is what did not come
        head = span.nodes[0].node
        what = (
            f": this node ({span.node}) runs ranks of a server across nodes, ready only once "
            f"its head {head} at {span.address}:{span.port} answers with every rank joined. "
            f"Look at the head first (`vsup logs {inst.name}` on {head}, `vsup fleet status`: "
            f"the unit's row names the member that holds it up), then `{log}` here."
        )
    else:
        what = (
            f". A busy node (other instances starting or serving on the same cores or GPUs) "
            f"slows a start down: raise start_timeout_s for {inst.name} in the layout "
            f"([defaults] or its [[instance]]) and run `vsup up LAYOUT`, or start it when the "
            f"node is quieter. `{log}` shows how far that start got."
        )
    return [
        Advice(
            kind="start_timeout",
            severity="warning",
            instance=inst.name,
            message=(
                f"{inst.name}: its last start timed out (not ready {limit} after it began, "
                f"start_timeout_s){what}"
            ),
        )
    ]


def waits_for_head(inst: InstanceStatus) -> list[Advice]:
    """A follower of a server across nodes that runs and waits for its head (its `wait`, kind
    span_head: the head does not answer, or an older head still does). Part of every start of
    the unit; a wait that lasts means the head does not come."""
    wait = inst.lifecycle.wait
    span = inst.span
    if wait is None or wait.kind != SPAN_HEAD_WAIT or span is None:
        return []
    head = span.nodes[0].node if span.nodes else "its head's node"
    return [
        Advice(
            kind="span_head",
            severity="info",
            instance=inst.name,
            message=(
                f"{inst.name}: ranks of a server across nodes on {span.node}, waiting for "
                f"{wait.message}. It is ready once the head answers with every rank joined; "
                f"if that does not come, look at the head (`vsup logs {inst.name}` on {head}) "
                "and the unit's row in `vsup fleet status`."
            ),
        )
    ]


# Exits that the same command line repeats: the layout must change, and `vsup restart` would
# run that command line again.
FIXED_IN_LAYOUT = {
    "bad_args": "vLLM refused its command line (a flag or value it does not take)",
    "model_not_found": "vLLM found no model there",
}


def _fails_fast(inst: InstanceStatus, reason: str, why: str) -> tuple[str, str]:
    """(why, what to do) for an exit that fails fast: vsup tried once, since a retry of the
    same command would fail the same way."""
    if why.startswith("the restart policy gave up: ") and why.endswith(" recurs"):
        why = f"{reason} fails fast: vsup does not retry an exit that recurs"
    if reason in FIXED_IN_LAYOUT:
        return (
            f"{FIXED_IN_LAYOUT[reason]}; {why}",
            " Edit the layout (its args, model or command) and run `vsup up LAYOUT`: "
            f"`vsup restart {inst.name}` would run the same command line again.",
        )
    port = f"port {inst.port}" if inst.port is not None else "its port"
    if inst.span is not None and inst.span.head:
        # the head of a server across nodes: its followers on other nodes wait for it
        node = inst.span.node
        others = ", ".join(n.node for n in inst.span.nodes[1:]) or "none"
        return (
            f"{port} on {node} is taken by another process ({node} runs the head of a server "
            f"across nodes; its followers on {others} wait for it); {why}",
            f" Stop what holds {port} on {node} (`ss -ltnp 'sport = :{inst.port}'` there "
            f"names it), or give {inst.name} another port in the layout and run `vsup fleet "
            "up LAYOUT`.",
        )
    return (
        f"{port} is taken by another process; {why}",
        f" Stop what holds {port} (`ss -ltnp 'sport = :{inst.port}'` names it), or give "
        f"{inst.name} another port in the layout and run `vsup up LAYOUT`.",
    )


def _requests(n: float | None, what: str) -> str:
    count = int(n or 0)
    return f"{count} {what}"


def stalled(inst: InstanceStatus) -> list[Advice]:
    """Work (requests at the engine or the API server, or a canary) and no progress for
    `stall_after_s` while /health answers 200 (telemetry/stall.py): the engine is hung, and its
    clients wait for nothing."""
    stall = inst.active_stall
    if stall is None:
        return []
    for_s = stall.for_s or 0.0
    since = f" (since {stall.since})" if stall.since else ""
    return [
        Advice(
            kind="stalled",
            severity="critical",
            instance=inst.name,
            message=(
                f"{inst.name}: stalled: {stall_work(inst)}, 0 tokens processed for "
                f"{for_s:.0f} s{since} while /health answers 200: its engine is hung (a GPU "
                f"hang, a stuck collective, a frozen EngineCore). Look at `vsup logs "
                f"{inst.name}` and the GPU's health (XID errors), then `vsup restart "
                f"{inst.name}` (its requests fail); restart.on_stall = true makes vsup do that "
                "by itself."
            ),
        )
    ]


def sleep_trouble(inst: InstanceStatus) -> list[Advice]:
    """vLLM's sleep mode (docs/sleep.md): a sleep or wake that failed, or a sleep that left
    the GPU memory held (seen on some ROCm builds): the swap group's other members cannot use
    that memory, and a wake that failed leaves the model unserved."""
    sleep = inst.sleep
    grows = []
    if sleep is not None and (sleep.kept_growth_bytes or 0) >= KEPT_GROWTH_ADVICE_BYTES:
        grows.append(kept_grows(inst, sleep))
    if sleep is None or not sleep.error:
        return grows
    if sleep.error.startswith("wake failed"):
        todo = (
            f"`vsup logs {inst.name}` says why; `vsup wake {inst.name}` tries again, and "
            f"`vsup restart {inst.name}` starts it fresh (a cold start)"
        )
        severity = "critical" if sleep.state != SleepState.AWAKE else "warning"
    elif "not released" in sleep.error:
        todo = (
            "this vLLM build does not free its memory on sleep: the swap group's other members "
            f"cannot start or wake beside it. `vsup stop {inst.name}` frees it for good; "
            "report the build (docs/sleep.md, 'Sleep that keeps the memory')"
        )
        severity = "warning"
    else:
        todo = f"it stays awake and serving; `vsup logs {inst.name}` says why"
        severity = "warning"
    return [
        *grows,
        Advice(
            kind="sleep_failed",
            severity=severity,
            instance=inst.name,
            gpu=inst.gpus[0] if inst.gpus else None,
            message=f"{inst.name}: {sleep.error}. {todo}.",
        ),
    ]


# A sleeper that keeps this much more after a sleep than after its first (docs/sleep.md,
# "What sleep leaves behind": a known vLLM failure, memory a sleep does not give back).
KEPT_GROWTH_ADVICE_BYTES = GiB


def kept_grows(inst: InstanceStatus, sleep: SleepStatus) -> Advice:
    grown = (sleep.kept_growth_bytes or 0) / GiB
    kept = sleep.kept_bytes[-1] / GiB if sleep.kept_bytes else 0.0
    return Advice(
        kind="sleep_kept_grows",
        severity="warning",
        instance=inst.name,
        gpu=inst.gpus[0] if inst.gpus else None,
        message=(
            f"{inst.name} keeps {kept:.1f} GiB of GPU memory asleep, {grown:.1f} GiB more than "
            f"after its first sleep ({len(sleep.kept_bytes)} sleeps): vLLM does not give it all "
            f"back. `vsup restart {inst.name}` in a quiet moment frees it, or "
            "`sleep.recycle_growth_gib` in the layout does it when it sleeps"
        ),
    )


def foreign_processes(gpu: GpuStatus) -> list[Advice]:
    """Processes holding memory on a GPU that no instance owns."""
    out = []
    for proc in gpu.processes:
        if proc.instance is not None:
            continue
        held = f" holds {proc.hbm_bytes / GiB:.1f} GiB and" if proc.hbm_bytes else ""
        out.append(
            Advice(
                kind="foreign_process",
                severity="warning",
                gpu=gpu.index,
                message=(
                    f"GPU {gpu.index}: pid {proc.pid}{held} belongs to no instance; it takes "
                    "memory the layout planned for its instances (a leftover vLLM EngineCore "
                    "keeps its memory until killed)."
                ),
            )
        )
    return out


def router_failed(router: RouterStatus | None) -> list[Advice]:
    """The router failed (its restart policy gave up, or its command is not there): every
    request to its endpoint fails although the instances behind it serve."""
    if router is None or router.state != State.FAILED:
        return []
    why = router.failed_why
    if why is None and router.last_exit is not None:
        why = router.last_exit.log_excerpt or router.last_exit.reason
    where = router.endpoint or router.url or f"port {router.port}"
    return [
        Advice(
            kind="router_failed",
            severity="critical",
            message=(
                f"the router ({where}) failed: {why or 'see its log'}; every request to it "
                "fails until it runs again. Its log: `vsup logs @router`; fix the cause, then "
                "`vsup start @router` (or `vsup up` with the corrected layout)"
            ),
        )
    ]


def _incidents(lines: list[str]) -> str:
    """The first FOREIGN_WORKERS_SHOWN of a router incident's workers, and how many more."""
    seen = "; ".join(lines[:FOREIGN_WORKERS_SHOWN])
    if len(lines) > FOREIGN_WORKERS_SHOWN:
        seen += f"; and {len(lines) - FOREIGN_WORKERS_SHOWN} more (vsup status --json)"
    return seen


def router_foreign_workers(workers: Iterable[ForeignWorker]) -> list[Advice]:
    """Someone added a worker of their own to the router (its worker API has no
    authentication): vsup removed it, but requests may have gone there meanwhile, and whoever
    did it can do it again. Critical: traffic was steered to a server nobody vetted. One advice
    for all of them (one incident to alert)."""
    workers = list(workers)
    if not workers:
        return []
    first = workers[0]
    seen = _incidents(
        [
            f"{w.url} (first at {w.first_seen}, removed "
            + ("once" if w.removals == 1 else f"{w.removals} times, last at {w.last_seen}")
            + ")"
            for w in workers
        ]
    )
    return [
        Advice(
            kind="router_foreign_worker",
            severity="critical",
            message=(
                f"the router on {first.router_host}:{first.router_port} was given workers vsup "
                f"did not add, and vsup removed them: {seen}.{_users_line(workers)} Anyone who "
                "reaches the router's port can do this (vllm-router's /add_worker has no "
                "authentication): find who sent it, and keep [router] host on 127.0.0.1 or "
                "firewall the port (docs/router.md, Who can reach it)."
            ),
        )
    ]


def router_removed_workers(workers: Iterable[RemovedWorker]) -> list[Advice]:
    """Someone removed members from the router (`POST /remove_worker`, no authentication):
    vsup put them back, but requests that found no worker meanwhile failed, and a loop of
    removals fails many. Critical, one advice for all of them."""
    workers = list(workers)
    if not workers:
        return []
    first = workers[0]
    seen = _incidents(
        [
            f"{w.name} {w.url} (first at {w.first_seen}, put back "
            + ("once" if w.restores == 1 else f"{w.restores} times, last at {w.last_seen}")
            + ")"
            for w in workers
        ]
    )
    return [
        Advice(
            kind="router_worker_removed",
            severity="critical",
            message=(
                f"someone removed workers from the router on {first.router_host}:"
                f"{first.router_port}, and vsup put them back: {seen}.{_users_line(workers)} "
                "Requests that found no worker meanwhile failed. Anyone who reaches the "
                "router's port can do this (vllm-router's /remove_worker has no "
                "authentication): find who sent it; only a firewall rule by user keeps other "
                "local users out (docs/router.md, Who can reach it)."
            ),
        )
    ]


def _users_line(workers: Iterable[ForeignWorker | RemovedWorker]) -> str:
    users = sorted({u for w in workers for u in w.users})
    if not users:
        return ""
    return " Other local users connected to the router's port then: " + ", ".join(users) + "."


# Hardware XIDs after which the GPU goes on working: a row remap recorded (63), a rising rate
# of corrected errors (92), an uncorrectable error contained to the process it killed (94).
# Worth a look, not a page at night; the others (48 DBE, 64 remap failure, 79 off the bus, 95
# uncontained, 119/120 GSP, ...) mean the GPU cannot be trusted until someone checks it.
XID_WARNING_ONLY = frozenset({63, 92, 94})
# A power-capped GPU whose SM clock stays above this share of its maximum loses little.
POWER_CAP_CLOCK_SHARE = 0.9


def gpu_health(gpu: GpuStatus, instances: Iterable[InstanceStatus] = ()) -> list[Advice]:
    """What the driver's health figures say needs a person: uncorrectable memory errors, page
    retirement or row remapping waiting for a reset or failed, hardware XID errors of the last
    hour, and clocks held down by heat, hardware or the power cap. Kinds: `gpu_ecc`,
    `gpu_memory`, `gpu_xid`, `gpu_throttle`."""
    h = gpu.health
    if h is None:
        return []
    names = sorted(i.name for i in instances if gpu.index in i.gpus)
    drain = f"drain {', '.join(names)} and " if names else ""
    out = [a for check in _HEALTH_CHECKS if (a := check(gpu, h, drain)) is not None]
    out += _throttle_advice(gpu, drain)
    return out


def _ecc_advice(gpu: GpuStatus, h: GpuHealth, drain: str) -> Advice | None:
    if not h.ecc_volatile_uncorrected:
        return None
    n = h.ecc_volatile_uncorrected
    return Advice(
        kind="gpu_ecc",
        severity="critical",
        gpu=gpu.index,
        message=f"GPU {gpu.index}: {n} uncorrectable ECC error{'s' if n != 1 else ''} since "
        f"boot: {drain}have the node checked (results computed on it may be wrong).",
    )


def _memory_advice(gpu: GpuStatus, h: GpuHealth, drain: str) -> Advice | None:
    where = f"GPU {gpu.index}"
    if h.row_remap_failed or h.bad_pages_unreservable:
        what = (
            "row remapping failed"
            if h.row_remap_failed
            else f"{h.bad_pages_unreservable} bad memory pages could not be retired"
        )
        return Advice(
            kind="gpu_memory",
            severity="critical",
            gpu=gpu.index,
            message=f"{where}: {what}: its memory can no longer hide bad cells; {drain}have the "
            "GPU serviced (field diagnostics, RMA).",
        )
    if h.row_remap_pending or h.retired_pages_pending:
        what = "a row remap" if h.row_remap_pending else "a page retirement"
        return Advice(
            kind="gpu_memory",
            severity="warning",
            gpu=gpu.index,
            message=f"{where}: {what} waits for a GPU reset: {drain}reset the GPU or reboot the "
            "node when convenient; until then the bad memory stays in use.",
        )
    return None


def _xid_advice(gpu: GpuStatus, h: GpuHealth, drain: str) -> Advice | None:
    hardware = h.hardware_xids
    if not hardware:
        return None
    last = hardware[-1]
    more = f" ({len(hardware)} in the last hour)" if len(hardware) > 1 else ""
    serious = any(e.xid not in XID_WARNING_ONLY for e in hardware)
    return Advice(
        kind="gpu_xid",
        severity="critical" if serious else "warning",
        gpu=gpu.index,
        message=f"GPU {gpu.index}: XID {last.xid} ({last.what or 'hardware error'}) at "
        f"{last.at}{more}: {drain}have the node checked.",
    )


# The health checks of one GPU, in the order their advice is listed (throttling comes last)
_HEALTH_CHECKS: tuple[Callable[[GpuStatus, GpuHealth, str], Advice | None], ...] = (
    _ecc_advice,
    _memory_advice,
    _xid_advice,
)


def _throttle_advice(gpu: GpuStatus, drain: str) -> list[Advice]:
    h = gpu.health
    assert h is not None
    reasons = set(h.slowdowns())
    if not reasons:
        return []
    clock = ""
    share = None
    if h.sm_clock_mhz is not None and h.sm_clock_max_mhz:
        share = h.sm_clock_mhz / h.sm_clock_max_mhz
        clock = f"SM clock {h.sm_clock_mhz:.0f}/{h.sm_clock_max_mhz:.0f} MHz"
    temp = f"{gpu.temp_c:.0f}°C" if gpu.temp_c is not None else ""
    figures = ", ".join(x for x in (temp, clock) if x)
    figures = f" ({figures})" if figures else ""
    where = f"GPU {gpu.index}"

    def advice(severity: str, message: str) -> list[Advice]:
        return [Advice(kind="gpu_throttle", severity=severity, gpu=gpu.index, message=message)]

    if reasons & set(THROTTLE_HARDWARE):
        named = ", ".join(sorted(reasons & set(THROTTLE_HARDWARE))).replace("_", " ")
        return advice(
            "critical",
            f"{where}: hardware slowdown ({named}){figures}: the GPU runs far below its clocks "
            f"because of overheating or the node's power supply; {drain}have cooling and power "
            "checked.",
        )
    if reasons & set(THROTTLE_THERMAL):
        named = ", ".join(sorted(reasons & set(THROTTLE_THERMAL))).replace("_", " ")
        return advice(
            "warning",
            f"{where}: thermal throttling ({named}){figures}: throughput drops; check the "
            "node's cooling and airflow.",
        )
    if "unspecified" in reasons:
        return advice(
            "warning",
            f"{where}: throttled (the driver gives no reason){figures}; throughput drops.",
        )
    if share is not None and share >= POWER_CAP_CLOCK_SHARE:
        return []
    power = ""
    if gpu.power_w is not None and h.power_limit_w:
        power = f"{gpu.power_w:.0f}/{h.power_limit_w:.0f} W, "
    return advice(
        "info",
        f"{where}: held at its power cap ({power}{clock or 'clocks unknown'}): throughput is "
        "power-bound; raise the cap if the node allows it.",
    )


def problem(kind: str, message: str, severity: str = "warning") -> Advice:
    """A daemon-level problem shown with the advice (e.g. a corrupt state file)."""
    return Advice(kind=kind, severity=severity, message=message)
