"""Live advice: what the telemetry says an operator should change (DESIGN.md, "Live advice").

Pure functions over a snapshot's instances and GPUs plus a little history, so every rule is
tested with plain data. The daemon runs them each poll and puts the result in the snapshot.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from vsup.snapshot import Advice, GpuStatus, InstanceStatus

KV_FULL = 0.95
KV_PEAK_WINDOW_S = 60.0  # the KV-usage peak the advice quotes is over this window
# HBM above the planned share by more than this fraction (and this many bytes) is reported:
# allocator slack and the CUDA context make small excesses normal.
HBM_OVER_FRACTION = 0.05
HBM_OVER_MIN_BYTES = 512 * 1024**2
CRASH_LOOP_EXITS = 3  # failures within the window that make a crash loop
CRASH_WINDOW_S = 600.0
GiB = 1024**3


@dataclass(frozen=True)
class AdviceInputs:
    """Everything the rules look at besides the snapshot itself."""

    recent_failures: Mapping[str, int]  # instance -> failed exits in the crash window
    problems: tuple[Advice, ...] = ()  # the daemon's own (e.g. a corrupt state file)
    kv_peak: Mapping[str, float | None] = field(default_factory=dict)  # max KV usage, last minute


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
    for gpu in gpus:
        out += foreign_processes(gpu)
    order = {"critical": 0, "warning": 1, "info": 2}
    return tuple(sorted(out, key=lambda a: order.get(a.severity, 3)))


def kv_too_small(inst: InstanceStatus, kv_peak: float | None = None) -> list[Advice]:
    """Preemptions rising (the counter grew within the last minute): the KV cache is too small
    for the load.

    DESIGN.md asks for KV >= 95% as well. vLLM V1 preempts only when it cannot allocate a KV
    block, so a rising counter already proves the cache ran full; a 1 Hz sample of the gauge
    mostly misses that moment (measured on the CPU build: 13 preemptions while the gauge never
    read above 0.8), and with few blocks the gauge cannot even reach 95%. So the rise alone
    triggers the advice, and the KV figure only sets how loud it is: critical when the cache
    read >= 95% now or at its peak in the last minute, a warning otherwise."""
    rate = inst.preemptions_per_min
    if rate is None or rate <= 0:
        return []
    usage = [v for v in (inst.kv_cache_usage, kv_peak) if v is not None]
    peak = max(usage) if usage else None
    kv_txt = (
        f"KV cache peaked at {peak:.0%} in the last minute"
        if peak is not None
        else ("KV cache usage unknown")
    )
    return [
        Advice(
            kind="kv_exhausted",
            severity="critical" if peak is not None and peak >= KV_FULL else "warning",
            instance=inst.name,
            message=(
                f"{inst.name}: preempting ({rate:.0f}/min; {kv_txt}): the KV cache is too "
                "small for this load and throughput suffers. Run fewer instances per GPU, "
                "raise gpu_memory_utilization, use an fp8 KV cache (args kv-cache-dtype = "
                '"fp8") or lower max-num-seqs.'
            ),
        )
    ]


def hbm_over_plan(inst: InstanceStatus) -> list[Advice]:
    """More HBM than `gpu_memory_utilization` x the GPU's memory planned for it."""
    used, plan = inst.hbm_bytes, inst.planned_hbm_bytes
    if used is None or not plan:
        return []
    excess = used - plan
    if excess <= max(plan * HBM_OVER_FRACTION, HBM_OVER_MIN_BYTES):
        return []
    return [
        Advice(
            kind="hbm_over_plan",
            severity="warning",
            instance=inst.name,
            gpu=inst.gpus[0] if inst.gpus else None,
            message=(
                f"{inst.name}: holds {used / GiB:.1f} GiB HBM, {excess / GiB:.1f} GiB above its "
                f"planned share of {plan / GiB:.1f} GiB (gpu_memory_utilization "
                f"{inst.gpu_memory_utilization}); co-tenants on its GPU may run out of memory. "
                "Lower its gpu_memory_utilization or give it a GPU of its own."
            ),
        )
    ]


def crash_loop(inst: InstanceStatus, recent_failures: int) -> list[Advice]:
    """The breaker tripped (`failed`), or the instance keeps failing within the window."""
    reason = inst.last_exit.reason if inst.last_exit else "unknown"
    excerpt = ""
    if inst.last_exit and inst.last_exit.log_excerpt:
        excerpt = f" Last log: {inst.last_exit.log_excerpt.strip().splitlines()[-1][:200]}"
    if inst.state == "failed":
        if inst.failed_why:
            says_what_to_do = "vsup start" in inst.failed_why or "vsup restart" in inst.failed_why
            hint = "" if says_what_to_do else f" Fix the cause, then `vsup restart {inst.name}`."
            policy = inst.failed_why.startswith("the restart policy gave up")
            return [
                Advice(
                    kind="crash_loop" if policy else "failed",
                    severity="critical",
                    instance=inst.name,
                    message=(
                        f"{inst.name}: failed: {inst.failed_why} (last exit: {reason})."
                        f"{hint}{excerpt}"
                    ),
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


def problem(kind: str, message: str, severity: str = "warning") -> Advice:
    """A daemon-level problem shown with the advice (e.g. a corrupt state file)."""
    return Advice(kind=kind, severity=severity, message=message)
