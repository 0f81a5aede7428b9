"""Live advice: what the telemetry says an operator should change (DESIGN.md, "Live advice").

Pure functions over a snapshot's instances and GPUs plus a little history, so every rule is
tested with plain data. The daemon runs them each poll and puts the result in the snapshot.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from supervisor.snapshot import Advice, GpuStatus, InstanceStatus

KV_FULL = 0.95
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


def compute_advice(
    instances: Iterable[InstanceStatus], gpus: Iterable[GpuStatus], inputs: AdviceInputs
) -> tuple[Advice, ...]:
    """Every rule, most severe first, then in instance order."""
    out: list[Advice] = list(inputs.problems)
    instances = list(instances)
    for inst in instances:
        out += kv_too_small(inst)
        out += hbm_over_plan(inst)
        out += crash_loop(inst, inputs.recent_failures.get(inst.name, 0))
    for gpu in gpus:
        out += foreign_processes(gpu)
    order = {"critical": 0, "warning": 1, "info": 2}
    return tuple(sorted(out, key=lambda a: order.get(a.severity, 3)))


def kv_too_small(inst: InstanceStatus) -> list[Advice]:
    """KV cache >= 95% full while preemptions rise (the preemption counter grew within the
    last minute: its per-minute rate is above zero): the cache is too small for the load."""
    if inst.kv_cache_usage is None or inst.kv_cache_usage < KV_FULL:
        return []
    rate = inst.preemptions_per_min
    if rate is None or rate <= 0:
        return []
    rate_txt = f", {rate:.0f} preemptions/min" if rate else ""
    return [
        Advice(
            kind="kv_exhausted",
            severity="warning",
            instance=inst.name,
            message=(
                f"{inst.name}: KV cache {inst.kv_cache_usage:.0%} full and preempting{rate_txt}: "
                "the KV cache is too small for this load. Run fewer instances per GPU, raise "
                "gpu_memory_utilization, use an fp8 KV cache (args kv-cache-dtype = \"fp8\") "
                "or lower max-num-seqs."
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
