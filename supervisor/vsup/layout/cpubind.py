"""Cores for CPU instances: each gets its own, so that two never spin on one core.

vLLM's CPU build binds its OpenMP threads itself (`VLLM_CPU_OMP_THREADS_BIND=auto`): every
instance picks the same cores (on the 2-core test machine all of them `core ids=[0]`), and
a serving instance's spinning threads starve a starting one for minutes. So when a layout has
two or more CPU instances, `bind_cpu_instances` gives each of those without their own
`VLLM_CPU_OMP_THREADS_BIND` in `env` a share of the cores this process may run on
(`os.sched_getaffinity`), one logical CPU per physical core first (SMT siblings share a core's
units), in layout order, so the same layout on the same node always gets the same cores. An
instance of TP x PP x DP_local ranks gets that many core lists (`0-3|4-7`, vLLM's format). A
single CPU instance keeps vLLM's own choice (it also picks NUMA-local cores).

Fewer cores than core lists: the lists share cores round robin, and validation warns
(`rules/cpu.py`). Leaf module: it reads the node, nothing of the layout's but the specs.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path

from vsup.layout.spec import InstanceSpec

BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"
_TOPOLOGY = Path("/sys/devices/system/cpu")


def allowed_cpus() -> list[int]:
    """The logical CPUs this process may run on (the daemon's: its instances inherit them)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def _core_key(cpu: int) -> tuple[int, int] | None:
    base = _TOPOLOGY / f"cpu{cpu}" / "topology"
    try:
        package = int((base / "physical_package_id").read_text())
        core = int((base / "core_id").read_text())
    except (OSError, ValueError):
        return None
    return package, core


def core_order(cpus: Iterable[int]) -> list[int]:
    """`cpus` with one logical CPU of each physical core first, then their SMT siblings."""
    first: list[int] = []
    rest: list[int] = []
    seen: set[tuple[int, int]] = set()
    for cpu in sorted(cpus):
        key = _core_key(cpu)
        if key is None or key not in seen:
            first.append(cpu)
            if key is not None:
                seen.add(key)
        else:
            rest.append(cpu)
    return first + rest


def parse_cpu_list(text: str) -> set[int] | None:
    """The CPUs of a bind value (`0-3,8|4-7`); None for `auto`, `nobind` or what is not one."""
    out: set[int] = set()
    for group in text.split("|"):
        for part in group.split(","):
            part = part.strip()
            if not part:
                continue
            lo, _, hi = part.partition("-")
            if not lo.isdigit() or (hi and not hi.isdigit()):
                return None
            out.update(range(int(lo), int(hi or lo) + 1))
    return out or None


def format_cpu_list(cpus: Sequence[int]) -> str:
    """`[0, 1, 2, 5]` -> `0-2,5`."""
    parts: list[str] = []
    ordered = sorted(cpus)
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def ranks(spec: InstanceSpec) -> int:
    """Core lists vLLM expects of a CPU instance: one per rank on this node."""
    shape = spec.parallel
    return max(1, shape.tp) * max(1, shape.pp) * max(1, shape.dp_local)


def core_plan(specs: Sequence[InstanceSpec], cpus: Sequence[int] | None = None) -> dict[str, str]:
    """Instance name -> the `VLLM_CPU_OMP_THREADS_BIND` vsup gives it (module docstring);
    empty when the layout has fewer than two CPU instances or each binds its own."""
    cpu_specs = [s for s in specs if not s.gpus]
    todo = [s for s in cpu_specs if BIND_ENV not in s.env]
    if len(cpu_specs) < 2 or not todo:
        return {}
    allowed = list(allowed_cpus() if cpus is None else cpus)
    taken: set[int] = set()
    for s in cpu_specs:
        if s not in todo:
            taken |= parse_cpu_list(str(s.env[BIND_ENV])) or set()
    pool = core_order(c for c in allowed if c not in taken) or core_order(allowed)
    need = sum(ranks(s) for s in todo)
    physical = pool[: _physical_count(pool)]  # one logical CPU of each physical core
    if len(physical) >= need:
        pool = physical
    each = len(pool) // need
    lists: list[list[int]] = []
    for j in range(need):
        if each >= 1:
            lists.append(pool[j * each : (j + 1) * each])
        else:
            lists.append([pool[j % len(pool)]])  # more ranks than cores: validation warns
    plan: dict[str, str] = {}
    at = 0
    for s in todo:
        n = ranks(s)
        plan[s.name] = "|".join(format_cpu_list(cores) for cores in lists[at : at + n])
        at += n
    return plan


def _physical_count(pool: Sequence[int]) -> int:
    keys = {_core_key(c) for c in pool}
    if None in keys:
        return len(pool)
    return len(keys)


def bind_cpu_instances(
    specs: Sequence[InstanceSpec], cpus: Sequence[int] | None = None
) -> list[InstanceSpec]:
    """`specs` with `VLLM_CPU_OMP_THREADS_BIND` in the env of the CPU instances vsup binds."""
    plan = core_plan(specs, cpus)
    if not plan:
        return list(specs)
    return [
        replace(s, env={**s.env, BIND_ENV: plan[s.name]}) if s.name in plan else s for s in specs
    ]
