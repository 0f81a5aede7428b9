"""Whether an instance's GPUs have the memory its start asks for, and who holds the rest.

vLLM refuses to start when a GPU's free memory is below `gpu_memory_utilization` x its total
(`ValueError: Free memory on device cuda:0 (38.77/139.8 GiB) on startup is less than desired
GPU memory utilization (0.9, 125.82 GiB)`; exitreason.py calls that `gpu_memory_insufficient`).
Restarting into the same wall burns the restart policy's failures and fixes nothing. What to
do depends on who holds the memory:
- a process that is no instance's (another user's job, a leftover EngineCore): *wait* for it
  to go - the instance stays `backoff`/`starting` with its `wait` saying who holds how much,
  and starts once the memory is there; no failure is counted;
- the layout's own instances (the utilizations on that GPU add up to more than it has): *short*,
  a person must change the layout - the instance fails fast;
- nobody can tell (no per-process figures, or memory nobody is listed for): the restart policy
  decides, as for any exit.

`judge` is pure; the figures come from the daemon's GPU telemetry through `GpuMemoryView`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from enum import StrEnum

GiB = 2**30
# vLLM's own default for --gpu-memory-utilization.
VLLM_DEFAULT_UTILIZATION = 0.9


@dataclass(frozen=True)
class Holder:
    """A process holding memory on a GPU; `instance` None: no instance's (foreign).
    `known` False: the pid is not in this node's process table (a container without the
    host's pid namespace), so whose it is cannot be told."""

    pid: int
    bytes: int | None
    instance: str | None
    known: bool = True


@dataclass(frozen=True)
class GpuMemory:
    """One GPU's memory as the telemetry last saw it."""

    index: int
    total_bytes: int
    used_bytes: int
    holders: tuple[Holder, ...] = ()


# gpus -> their figures, or None when the telemetry has none (no GPU probe, not polled yet).
GpuMemoryView = Callable[[tuple[int, ...]], "Sequence[GpuMemory] | None"]


class Fit(StrEnum):
    OK = "ok"  # enough free memory (as far as the figures tell)
    WAIT = "wait"  # short, and processes that are no instance's hold memory: wait for them
    SHORT = "short"  # short because of the layout's own instances: a person must change it


@dataclass(frozen=True)
class Verdict:
    fit: Fit
    message: str | None = None
    # WAIT: the processes that are no instance's, what they hold on the GPUs short of memory
    # (summed over those GPUs), and those GPUs
    pids: tuple[int, ...] = ()
    held_bytes: int | None = None
    gpus: tuple[int, ...] = ()


def judge(
    name: str,
    utilization: float | None,
    gpus: Sequence[GpuMemory] | None,
    own_pids: Collection[int] = (),
) -> Verdict | None:
    """Can instance `name` (at `utilization`) start on `gpus` now? None: the figures cannot
    tell. `own_pids` are the instance's own processes (a run that is ending): their memory
    counts as free and they are nobody's holders."""
    if not gpus:
        return None
    util = utilization if utilization is not None else VLLM_DEFAULT_UTILIZATION
    waits: list[str] = []
    shorts: list[str] = []
    holders: list[Holder] = []
    short_gpus: list[int] = []
    for g in gpus:
        short = _short(name, util, g, own_pids)
        if short is None:
            continue
        if short.unknown:
            return None  # memory nobody is listed for (no per-process figures): cannot tell
        if short.foreign:
            waits.append(short.text)
            holders.extend(short.foreign)
            short_gpus.append(g.index)
        else:
            shorts.append(short.text)
    if waits:
        sizes = [h.bytes for h in holders if h.bytes is not None]
        return Verdict(
            Fit.WAIT,
            "memory held by other processes: " + "; ".join(waits),
            pids=tuple(dict.fromkeys(h.pid for h in holders)),
            held_bytes=sum(sizes) if sizes else None,
            gpus=tuple(short_gpus),
        )
    if shorts:
        return Verdict(
            Fit.SHORT,
            "the layout asks for more GPU memory than there is: "
            + "; ".join(shorts)
            + ". Lower gpu_memory_utilization or move an instance to another GPU",
        )
    return Verdict(Fit.OK)


@dataclass(frozen=True)
class _Short:
    """One GPU without the memory an instance asks for: `foreign` holders (no instance's: the
    start waits for them), or `unknown` (memory nobody is listed for), or neither (it never
    fits: other instances or the layout take the rest)."""

    text: str = ""
    foreign: tuple[Holder, ...] = ()
    unknown: bool = False


def _short(name: str, util: float, g: GpuMemory, own_pids: Collection[int]) -> _Short | None:
    """Why `g` lacks the memory `name` needs at `util`; None when it has it."""
    own = sum(h.bytes or 0 for h in g.holders if h.pid in own_pids or h.instance == name)
    free = g.total_bytes - g.used_bytes + own
    needed = util * g.total_bytes
    if free >= needed:
        return None
    others = [h for h in g.holders if h.pid not in own_pids and h.instance != name]
    foreign = [h for h in others if h.instance is None and h.known]
    listed = sum(h.bytes or 0 for h in others if h.known)
    unlisted = g.used_bytes - own - listed
    want = f"{name} needs {_gib(needed)} free ({util:g} of {_gib(g.total_bytes)}), {_gib(free)} is"
    if foreign:
        who = ", ".join(
            f"pid {h.pid}" + (f" holds {_gib(h.bytes)}" if h.bytes is not None else "")
            for h in foreign
        )
        return _Short(f"GPU {g.index}: {who} (no instance's); {want}", tuple(foreign))
    if unlisted >= needed - free:
        return _Short(unknown=True)
    mates = sorted({h.instance for h in others if h.instance is not None})
    held = f"instances {', '.join(mates)} hold the rest" if mates else "it is in use"
    return _Short(f"GPU {g.index}: {want}; {held}")


def _gib(n: float) -> str:
    return f"{n / GiB:.1f} GiB"
