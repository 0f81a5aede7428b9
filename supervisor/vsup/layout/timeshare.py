"""Time-sharing a GPU: what a swap group claims of its GPUs and of the node's host RAM.

Instances of one `swap_group` take turns on their GPUs with vLLM's sleep mode: at most one is
awake, the others sleep (docs/layout.md, docs/sleep.md). So one GPU's memory is claimed by

    solo instances        their gpu_memory_utilization, summed (as without groups)
    each swap group       its largest member's utilization (whichever is awake)
                          + a remainder per sleeper: SLEEPER_RESERVE_BYTES of the GPU
    the pool              the sleep-mode instances in no swap group: awake together while
                          their memory fits, put to sleep by memory (least recently used
                          first) when one wakes; at least its largest member awake + a
                          remainder per sleeper, at most their sum (all awake)

and the sum must stay at or below MAX_GPU_UTILIZATION_SUM, as for solo instances. vLLM checks
at start and at wake that the GPU's free memory covers the awake member's whole share, so the
sleepers' remainders come on top of it, not out of it.

A level-1 sleeper keeps its weights in host RAM (pinned: not swappable) while it sleeps; any
instance with a sleep table can be put to sleep (`vsup sleep`, idle sleep), so the node must
hold every level-1 instance's weights at once: `host_ram_need`.

Validation (`rules/gpus.py`, `rules/sleep.py`), `vsup plan` and `vsup validate` all count
through here, so they cannot disagree.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vsup.layout.modelinfo import model_info
from vsup.layout.node import GIB, NodeFacts
from vsup.layout.parallel import find_arg, parallel_shape
from vsup.layout.schema import VLLM_DEFAULT_GPU_MEMORY_UTILIZATION
from vsup.layout.spec import InstanceSpec

# What a sleeping vLLM keeps on each of its GPUs: its CUDA context, NCCL and cuBLAS buffers and
# CUDA graphs (not offloaded by default). Seen on an H200 (vLLM 0.26, a 1.5B-shape model at
# 0.45 of the GPU): ~1.7 GiB of its 64.6 GiB share stayed. None of that grows with
# the share, so it is a fixed figure, rounded up for larger models' graphs.
SLEEPER_RESERVE_BYTES = 2 * GIB
# The same as a share of the GPU when its memory is unknown (`--node-gpus N`, no probe): 2 GiB
# of the smallest GPU vsup knows (H100, 80 GiB). On an H200 it is 0.014.
SLEEPER_RESERVE_SHARE_UNKNOWN = 0.025
# Level-1 sleepers' weights against the node's host RAM: pinned memory the kernel cannot swap,
# beside the daemon, vLLM's own processes (a few GiB each) and the page cache.
HOST_RAM_ERROR_SHARE = 0.80
HOST_RAM_WARN_SHARE = 0.50


@dataclass(frozen=True)
class Tenant:
    """One instance as the accounting sees it."""

    name: str
    gpus: tuple[int, ...]
    utilization: float  # its gpu_memory_utilization (vLLM's default when unset)
    explicit: bool = True  # False: the utilization is vLLM's default
    # the group it time-shares in; None when it has none or cannot sleep (no sleep table)
    swap_group: str | None = None
    sleep_level: int | None = None  # None: no sleep table
    weight_bytes: int | None = None  # the whole instance's (all TP and DP ranks); None: unknown


@dataclass(frozen=True)
class GroupShare:
    """One swap group on one GPU: the largest member awake, the others asleep."""

    group: str
    members: tuple[Tenant, ...]
    reserve: float  # one sleeper's remainder, as a share of the GPU

    @property
    def largest(self) -> float:
        return max(t.utilization for t in self.members)

    @property
    def sleepers(self) -> int:
        return len(self.members) - 1

    @property
    def total(self) -> float:
        return self.largest + self.sleepers * self.reserve


@dataclass(frozen=True)
class PoolShare:
    """The sleep-mode instances of one GPU in no swap group: what must fit is the largest
    awake with the others asleep, or all of them awake when that is less."""

    members: tuple[Tenant, ...]
    reserve: float

    @property
    def largest(self) -> float:
        return max(t.utilization for t in self.members)

    @property
    def evicts(self) -> bool:
        """Whether they cannot all be awake at once: a wake puts others to sleep."""
        return self.total < sum(t.utilization for t in self.members)

    @property
    def total(self) -> float:
        together = sum(t.utilization for t in self.members)
        return min(together, self.largest + (len(self.members) - 1) * self.reserve)


@dataclass(frozen=True)
class GpuShare:
    """What one GPU's tenants claim together."""

    gpu: int
    solo: tuple[Tenant, ...]
    groups: tuple[GroupShare, ...]
    pool: PoolShare | None = None

    @property
    def total(self) -> float:
        pool = self.pool.total if self.pool is not None else 0.0
        return sum(t.utilization for t in self.solo) + sum(g.total for g in self.groups) + pool

    def describe(self) -> str:
        """'a' 0.45, swap group g0 ('b', 'c') 0.90 + 1 sleeper x 0.014"""
        parts = [
            f"'{t.name}' {t.utilization:g}" + ("" if t.explicit else " (vLLM's default)")
            for t in self.solo
        ]
        for g in self.groups:
            names = ", ".join(f"'{t.name}'" for t in g.members)
            parts.append(
                f"swap group {g.group} ({names}) {g.largest:g} for the one awake + "
                f"{_plural(g.sleepers, 'sleeper')} x {g.reserve:.3f}"
            )
        if self.pool is not None:
            p = self.pool
            names = ", ".join(f"'{t.name}' {t.utilization:g}" for t in p.members)
            if p.evicts:
                parts.append(
                    f"sleep mode without a swap group ({names}): {p.largest:g} for the largest "
                    f"awake + {_plural(len(p.members) - 1, 'sleeper')} x {p.reserve:.3f}"
                )
            else:
                parts.append(names)
        return ", ".join(parts)


def reserve_share(gpu_memory_bytes: int | None) -> float:
    """One sleeper's remainder as a share of a GPU of `gpu_memory_bytes`."""
    if not gpu_memory_bytes:
        return SLEEPER_RESERVE_SHARE_UNKNOWN
    return SLEEPER_RESERVE_BYTES / gpu_memory_bytes


def gpu_shares(tenants: Iterable[Tenant], gpu_memory_bytes: int | None) -> list[GpuShare]:
    """Each GPU's claim, by GPU index; a swap group counts by its largest member there."""
    reserve = reserve_share(gpu_memory_bytes)
    solo: dict[int, list[Tenant]] = {}
    grouped: dict[int, dict[str, list[Tenant]]] = {}
    pooled: dict[int, list[Tenant]] = {}
    for t in tenants:
        for g in dict.fromkeys(t.gpus):
            if t.swap_group is not None:
                grouped.setdefault(g, {}).setdefault(t.swap_group, []).append(t)
            elif t.sleep_level is not None:
                pooled.setdefault(g, []).append(t)
            else:
                solo.setdefault(g, []).append(t)
    return [
        GpuShare(
            g,
            tuple(solo.get(g, ())),
            tuple(
                GroupShare(name, tuple(members), reserve)
                for name, members in grouped.get(g, {}).items()
            ),
            PoolShare(tuple(pooled[g]), reserve) if g in pooled else None,
        )
        for g in sorted(set(solo) | set(grouped) | set(pooled))
    ]


@dataclass(frozen=True)
class SwapGroup:
    """A swap group of the layout, for `vsup validate` and `vsup plan` to show on one line."""

    name: str
    members: tuple[Tenant, ...]

    @property
    def gpus(self) -> tuple[int, ...]:
        return tuple(sorted({g for t in self.members for g in t.gpus}))

    @property
    def largest(self) -> float:
        return max(t.utilization for t in self.members)

    @property
    def host_ram_bytes(self) -> int | None:
        """Its level-1 members' weights, all asleep at once; None when one is unknown."""
        weights = [t.weight_bytes for t in self.members if t.sleep_level == 1]
        if any(w is None for w in weights):
            return None
        return sum(w for w in weights if w is not None)

    def describe(self, gpu_memory_bytes: int | None) -> str:
        """g0: a, b time-share GPU 0 - one awake at a time, 0.90 of the GPU; sleepers keep
        ~2.0 GiB each, level-1 weights 3.1 GiB in host RAM"""
        names = ", ".join(t.name for t in self.members)
        gpus = self.gpus
        on = ("GPU " if len(gpus) == 1 else "GPUs ") + ",".join(map(str, gpus)) if gpus else "CPU"
        if gpu_memory_bytes:
            kept = f"~{SLEEPER_RESERVE_BYTES / GIB:.1f} GiB"
        else:
            kept = f"~{SLEEPER_RESERVE_SHARE_UNKNOWN:g} of the GPU"
        level1 = [t for t in self.members if t.sleep_level == 1]
        ram = self.host_ram_bytes
        if not level1:
            host = "no level-1 member: nothing kept in host RAM"
        elif ram is None:
            host = "level-1 weights in host RAM: size unknown (no model files here)"
        else:
            host = f"level-1 weights {ram / GIB:.1f} GiB in host RAM"
        each = "each GPU" if len(gpus) > 1 else "the GPU"
        return (
            f"{self.name}: {names} time-share {on} - one awake at a time, {self.largest:.2f} of "
            f"{each}; sleepers keep {kept} each, {host}"
        )


def swap_groups(tenants: Iterable[Tenant]) -> list[SwapGroup]:
    """The layout's swap groups, in the order their first members come."""
    groups: dict[str, list[Tenant]] = {}
    for t in tenants:
        if t.swap_group is not None:
            groups.setdefault(t.swap_group, []).append(t)
    return [SwapGroup(name, tuple(members)) for name, members in groups.items()]


@dataclass(frozen=True)
class HostRamNeed:
    """What the node's level-1 sleepers hold in host RAM when all of them sleep."""

    sleepers: tuple[Tenant, ...]  # level-1 sleepers on GPUs whose weights are known
    unknown: tuple[Tenant, ...]  # level-1 sleepers whose weights are not known here

    @property
    def bytes(self) -> int:
        return sum(t.weight_bytes or 0 for t in self.sleepers)

    def describe(self) -> str:
        """'a' 15.0 GiB, 'b' 15.0 GiB"""
        return ", ".join(f"'{t.name}' {(t.weight_bytes or 0) / GIB:.1f} GiB" for t in self.sleepers)


def host_ram_need(tenants: Sequence[Tenant]) -> HostRamNeed:
    """Level-1 sleepers on GPUs (on the CPU build sleep frees nothing and moves nothing)."""
    level1 = [t for t in tenants if t.sleep_level == 1 and t.gpus]
    return HostRamNeed(
        tuple(t for t in level1 if t.weight_bytes is not None),
        tuple(t for t in level1 if t.weight_bytes is None),
    )


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"


def spec_tenant(spec: InstanceSpec, base_dir: Path | None = None) -> Tenant:
    """An instance of a compiled layout as the accounting sees it; a level-1 sleeper's weights
    from its model's files or vsup's hub cache (offline), None when not known here."""
    share = spec.gpu_memory_utilization
    level = spec.sleep.level if spec.sleep is not None else None
    weights = None
    if level == 1:
        info = model_info(spec.model, base_dir)
        dtype = find_arg(spec.args, "--dtype")
        quantization = find_arg(spec.args, "--quantization")
        weights, _ = info.weight_bytes(
            str(dtype[1]) if dtype else None, str(quantization[1]) if quantization else None
        )
        if weights is not None:
            weights *= parallel_shape(spec.args, len(spec.gpus)).dp_local
    return Tenant(
        spec.name,
        spec.gpus,
        VLLM_DEFAULT_GPU_MEMORY_UTILIZATION if share is None else share,
        share is not None,
        spec.swap_group if level is not None else None,
        level,
        weights,
    )


def swap_group_summaries(
    specs: Sequence[InstanceSpec], base_dir: Path | None, node: NodeFacts
) -> list[dict[str, Any]]:
    """The swap groups of a compiled layout, for `vsup validate` (`text`: its line)."""
    out = []
    for group in swap_groups(spec_tenant(s, base_dir) for s in specs):
        out.append(
            {
                "name": group.name,
                "members": [t.name for t in group.members],
                "gpus": list(group.gpus),
                "utilization": group.largest,
                "sleeper_reserve_bytes": SLEEPER_RESERVE_BYTES,
                "host_ram_bytes": group.host_ram_bytes,
                "text": group.describe(node.gpu_memory_bytes),
            }
        )
    return out
