"""`vsup plan`: a layout packing one model onto a node's GPUs, and its memory budget per GPU.

N TP1 replicas per GPU, or groups of TP x DP consecutive GPUs (N instances per group with
`per_gpu`): with `dp` > 1 each instance is one vLLM data-parallel server (one port, DP engine
ranks of TP GPUs each; vsup.layout.parallel). Each GPU's memory share is split evenly:
`utilization` (0.90 by default) divided by the instances on it, rounded down to 0.01, so the
sum stays at or below 0.95.

The budget per instance (one GPU of it):
    budget   = utilization x GPU memory
    weights  = model weights / TP (a plan has no pipeline parallel; validation's estimate of a
               layout with it takes each stage's weights: vsup.layout.budget)
    overhead = activations, CUDA/HIP graphs and allocator slack (an estimate, OVERHEAD_BYTES,
               plus COMM_OVERHEAD_BYTES for TP > 1)
    KV       = budget - weights - overhead;  KV tokens: as vLLM counts them from its KV groups
               (vsup.layout.kvcache), per DP rank; the instance holds DP times that
    max concurrency at max-model-len = KV tokens / max-model-len
A plan in which an instance cannot hold one request of max-model-len tokens is refused.

With `time_share` (`vsup plan --time-share`) the instances of each GPU (or group) are one swap
group instead: each gets the whole `utilization`, one is awake at a time and the others sleep
(vLLM's sleep mode; docs/layout.md). The GPU then holds the awake member's share plus each
sleeper's remainder (vsup.layout.timeshare), and level-1 sleepers' weights wait in host RAM: a
plan whose level-1 weights exceed HOST_RAM_ERROR_SHARE of the node's RAM is refused.

`make_plan` composes the stages `--explain` prints (vsup.layout.planstages: weights, KV bytes
per token by layer kind, the budget of one GPU, placement), then writes the layout and checks
the swap groups; the `Plan` and its tables are vsup.layout.planreport's.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vsup.layout.budget import overhead_bytes
from vsup.layout.model import Layout
from vsup.layout.modelinfo import ModelInfo
from vsup.layout.node import GIB, PLATFORM_PROFILES
from vsup.layout.planreport import (
    InstanceBudget,
    Plan,
    gpu_ranges,
    render_budget,
    render_explain,
    tenants_of,
)
from vsup.layout.planstages import (
    DEFAULT_PORT_BASE,
    DEFAULT_UTILIZATION,
    FALLBACK_MAX_MODEL_LEN,
    ContextLength,
    GpuBudget,
    PlanError,
    PlanRequest,
    Seat,
    budget_per_gpu,
    check_request,
    context_length,
    gpu_memory,
    kv_per_token,
    model_facts,
    model_weights,
    place,
    split_utilization,
)
from vsup.layout.schema import MAX_GPU_UTILIZATION_SUM
from vsup.layout.timeshare import (
    HOST_RAM_ERROR_SHARE,
    HOST_RAM_WARN_SHARE,
    SLEEPER_RESERVE_BYTES,
    Tenant,
    gpu_shares,
    host_ram_need,
)

# what callers import from here: the request, the plan and its reports, the stages' figures
__all__ = [
    "DEFAULT_PORT_BASE",
    "DEFAULT_UTILIZATION",
    "FALLBACK_MAX_MODEL_LEN",
    "NODE_GPUS",
    "InstanceBudget",
    "Plan",
    "PlanError",
    "PlanRequest",
    "make_plan",
    "overhead_bytes",
    "parse_gpus",
    "render_budget",
    "render_explain",
    "split_utilization",
]

# GPUs of one node on every platform KNOWN_GPUS names (HGX H100/H200, MI300X/MI325X/MI355X
# OAM): what `--gpus all` means when planning for another node from a machine without GPUs.
NODE_GPUS = 8


def parse_gpus(spec: str, node_count: int | None, other_node: str | None = None) -> list[int]:
    """`all` -> every GPU of this node; `0,1,4-7` -> [0, 1, 4, 5, 6, 7].

    `other_node`: the plan is for another node's GPUs (`--gpu H200`, `--gpu-mem-gib G`: what
    the flag said); on a machine without GPUs `all` is then that node's NODE_GPUS."""
    spec = spec.strip()
    if spec == "all":
        if not node_count and other_node:
            return list(range(NODE_GPUS))
        if not node_count:
            raise PlanError(
                "--gpus all: no GPU found on this node; list the GPUs instead, e.g. --gpus "
                "0,1,2,3,4,5,6,7, or name the node's GPU (--gpu H200: all is its 8)"
            )
        return list(range(node_count))
    out: list[int] = []
    for part in spec.split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            raise PlanError(f"--gpus {spec!r}: write 'all' or indices like 0,1,2 or 0-7")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) else lo
        if hi < lo:
            raise PlanError(f"--gpus: range {part} runs backwards; write {hi}-{lo}")
        out += range(lo, hi + 1)
    if len(set(out)) != len(out):
        raise PlanError(f"--gpus {spec!r} lists a GPU twice")
    return out


def _slug(model: str) -> str:
    base = model.rstrip("/").split("/")[-1] or "model"
    return re.sub(r"[^a-z0-9.]+", "-", base.lower()).strip("-.") or "model"


def _grouped(problems: list[tuple[str, tuple[int, ...], str]]) -> tuple[str, ...]:
    """One line per distinct problem, naming the instances (and GPUs) it affects: `--per-gpu 8`
    on 8 GPUs refused would otherwise say the same thing 64 times."""
    by_text: dict[str, list[tuple[str, tuple[int, ...]]]] = {}
    for name, gpus, text in problems:
        by_text.setdefault(text, []).append((name, gpus))
    out = []
    for text, who in by_text.items():
        names = [n for n, _ in who]
        if len(names) <= 3:
            subject = ", ".join(names)
        else:
            on = sorted({g for _, group in who for g in group})
            subject = (
                f"{len(names)} instances ({names[0]} to {names[-1]}) on "
                f"GPU{'s' if len(on) > 1 else ''} {gpu_ranges(on)}"
            )
        out.append(f"{subject}: {text}")
    return tuple(out)


def make_plan(req: PlanRequest, base_dir: Path | None = None, out_path: Path | None = None) -> Plan:
    """Plan `req`: the layout and its budget (check `plan.ok`; `problems` say what to change).

    The stages `--explain` prints (weights, KV bytes per token by layer kind, the budget of one
    GPU, placement: vsup.layout.planstages), then the layout and the time-sharing checks.

    `base_dir` resolves a relative local model path (the working directory by default);
    `out_path` is where the layout will be written (its relative model path is rewritten for it).
    """
    base_dir = base_dir or Path.cwd()
    check_request(req)
    info = model_facts(req, base_dir)
    gpu = gpu_memory(req)
    weights = model_weights(req, info)
    context = context_length(req, info)
    kv = kv_per_token(req, info)
    profiles, profile_notes = _profiles(req, gpu.kind)
    budget = budget_per_gpu(req, gpu, weights, kv, context)
    seats = place(req)
    budgets = tuple(_instance_budget(req, seat, budget) for seat in seats)
    # every instance has the same budget: its problem is theirs, said once (_grouped)
    problems = [(s.name, s.gpus, budget.problem) for s in seats if budget.problem]
    host_memory, host_source = _host_memory(req)
    time_problems, time_notes = _time_share_checks(
        budgets, weights.bytes, gpu.bytes, host_memory, host_source
    )
    layout = _layout(req, info, seats, budget.utilization, context, profiles, base_dir)
    shared = [TIME_SHARE_NOTE] if req.time_share else []
    notes = [*kv.notes, *_parallel_notes(req, info), *profile_notes, *shared, *time_notes]
    return Plan(
        layout=layout if out_path is None else layout.relocated(out_path),
        budgets=budgets,
        info=info,
        weight_bytes=weights.bytes,
        weight_source=weights.source,
        kv_bytes_per_token=kv.bytes,
        kv_source=kv.source,
        max_model_len=context.tokens,
        max_model_len_source=context.source,
        gpu_memory_bytes=gpu.bytes,
        gpu_memory_source=gpu.source,
        notes=tuple(notes),
        problems=_grouped([*problems, *time_problems]),
        kv_layout=kv.layout,
        tp=req.tp,
        dp=req.dp,
        host_memory_bytes=host_memory,
        host_memory_source=host_source,
    )


def _instance_budget(req: PlanRequest, seat: Seat, m: GpuBudget) -> InstanceBudget:
    return InstanceBudget(
        seat.name,
        seat.gpus,
        seat.port,
        req.tp,
        m.utilization,
        m.budget,
        m.weights,
        m.overhead,
        m.kv,
        m.tokens,
        m.concurrency,
        req.dp,
        seat.group if req.time_share else None,
        req.sleep_level if req.time_share else None,
    )


TIME_SHARE_NOTE = (
    "time-shared: the instances of each GPU are one swap group, one awake at a time "
    "(vsup sleep / wake / swap; docs/sleep.md); they listen on 127.0.0.1 because sleep "
    "mode's endpoints are vLLM's dev-mode ones: put a router in front for clients"
)


def _profiles(req: PlanRequest, kind: str | None) -> tuple[list[str], list[str]]:
    """The profiles the layout lists (the GPU's platform profile unless given), and a note."""
    if req.profiles is not None:
        return list(req.profiles), []
    if kind and kind in PLATFORM_PROFILES:
        profile = PLATFORM_PROFILES[kind]
        return [profile], [f"profile {profile} chosen for {kind}; pass --profile to choose others"]
    return [], []


def _parallel_notes(req: PlanRequest, info: ModelInfo) -> list[str]:
    if req.dp <= 1:
        return []
    notes = []
    if info.is_moe:
        notes.append(
            "a mixture-of-experts model with --dp: the layout sets enable-expert-parallel, so the "
            "experts spread over all TP x DP GPUs; the weights per GPU below count each rank "
            "holding all of them / TP (an upper bound)"
        )
    notes.append(
        f"each instance is one vLLM server with {req.dp} data-parallel ranks behind one port: "
        "vsup supervises it as one process group (a dead rank takes the instance down and "
        "vsup restarts it whole; docs/layout.md)"
    )
    return notes


def _layout(
    req: PlanRequest,
    info: ModelInfo,
    seats: Sequence[Seat],
    share: float,
    context: ContextLength,
    profiles: list[str],
    base_dir: Path,
) -> Layout:
    header = _header(req, len(seats))
    if profiles:
        header["profiles"] = profiles
    defaults: dict[str, Any] = {"model": req.model, "args": _args(req, info, context)}
    if req.time_share:
        # sleep mode's endpoints are vLLM's dev-mode ones: loopback only (docs/layout.md)
        defaults["host"] = "127.0.0.1"
    tables = [_instance_table(req, seat, share) for seat in seats]
    return Layout.from_tables(tables, defaults=defaults, header=header, path=base_dir / "plan.toml")


def _instance_table(req: PlanRequest, seat: Seat, share: float) -> dict[str, Any]:
    table: dict[str, Any] = {
        "name": seat.name,
        "gpus": list(seat.gpus),
        "port": seat.port,
        "gpu_memory_utilization": share,
    }
    if req.time_share:
        table["swap_group"] = seat.group
        table["sleep"] = {"level": req.sleep_level}
    return table


def _args(req: PlanRequest, info: ModelInfo, context: ContextLength) -> dict[str, Any]:
    args: dict[str, Any] = {"max-model-len": context.tokens}
    if req.tp > 1:
        args["tensor-parallel-size"] = req.tp
    if req.dp > 1:
        args["data-parallel-size"] = req.dp
        if info.is_moe:
            args["enable-expert-parallel"] = True
    if req.kv_cache_dtype:
        args["kv-cache-dtype"] = req.kv_cache_dtype
    return args


def _header(req: PlanRequest, instances: int) -> dict[str, Any]:
    shape = f"TP{req.tp}" + (f" x DP{req.dp}" if req.dp > 1 else "")
    dp = f"dp{req.dp}" if req.dp > 1 else ""
    per = "GPU" if req.tp * req.dp == 1 else "group"
    return {
        "name": req.name or f"{_slug(req.model)}-{instances}x-tp{req.tp}{dp}",
        "description": f"vsup plan: {req.model} on GPUs {','.join(map(str, req.gpus))}, "
        f"{req.per_gpu} per {per}, {shape}",
    }


def _host_memory(req: PlanRequest) -> tuple[int | None, str]:
    if req.host_memory_bytes:
        return req.host_memory_bytes, "--host-ram-gib"
    if req.node.host_memory_bytes:
        return req.node.host_memory_bytes, "this node"
    return None, "unknown"


def _time_share_checks(
    budgets: Sequence[InstanceBudget],
    weights: int,
    gpu_mem: int,
    host_memory: int | None,
    host_source: str,
) -> tuple[list[tuple[str, tuple[int, ...], str]], list[str]]:
    """A swap group's GPU (its largest member and the sleepers' remainders) and the level-1
    sleepers' host RAM: what `vsup validate` would refuse, refused here with advice."""
    tenants = tenants_of(budgets, weights)
    problems: list[tuple[str, tuple[int, ...], str]] = []
    seen: set[str] = set()
    for share in gpu_shares(tenants, gpu_mem):
        if not share.groups or share.total <= MAX_GPU_UTILIZATION_SUM + 1e-9:
            continue
        group = share.groups[0]
        if group.group in seen:
            continue  # a TP group's GPUs: said once
        seen.add(group.group)
        fits = math.floor((MAX_GPU_UTILIZATION_SUM - group.sleepers * group.reserve) * 100) / 100
        problems.append(
            (
                group.group,
                (share.gpu,),
                f"swap group {group.group} claims {share.total:.2f} of GPU {share.gpu} "
                f"({group.largest:g} awake + {group.sleepers} sleepers x "
                f"{SLEEPER_RESERVE_BYTES / GIB:.0f} GiB), above {MAX_GPU_UTILIZATION_SUM}: "
                f"lower --utilization to {fits:g} or use fewer instances per GPU",
            )
        )
    host_problems, notes = _host_ram_checks(tenants, host_memory, host_source)
    return problems + host_problems, notes


def _host_ram_checks(
    tenants: Sequence[Tenant], host_memory: int | None, host_source: str
) -> tuple[list[tuple[str, tuple[int, ...], str]], list[str]]:
    """The level-1 sleepers' weights in host RAM: refused above HOST_RAM_ERROR_SHARE of it,
    a note above HOST_RAM_WARN_SHARE."""
    problems: list[tuple[str, tuple[int, ...], str]] = []
    notes: list[str] = []
    need = host_ram_need(tenants)
    if need.sleepers and host_memory:
        total = need.bytes
        text = (
            f"level-1 sleepers keep their weights in host RAM: {len(need.sleepers)} x "
            f"{total / len(need.sleepers) / GIB:.1f} GiB = {total / GIB:.1f} GiB when all "
            f"sleep, {total / host_memory:.0%} of {host_memory / GIB:.1f} GiB ({host_source})"
        )
        if total > HOST_RAM_ERROR_SHARE * host_memory:
            names = [t.name for t in need.sleepers]
            problems.append(
                (
                    ", ".join(names)
                    if len(names) <= 3
                    else f"{len(names)} instances ({names[0]} to {names[-1]})",
                    (),
                    f"{text}: above {HOST_RAM_ERROR_SHARE:.0%}; use --sleep-level 2 (weights "
                    "dropped, a wake reloads them) or fewer instances per GPU",
                )
            )
        elif total > HOST_RAM_WARN_SHARE * host_memory:
            notes.append(f"{text}: above {HOST_RAM_WARN_SHARE:.0%}, a large part of the node")
    return problems, notes
