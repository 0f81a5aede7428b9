"""One GPU as a line of text: an HBM bar split by instance, foreign processes and the rest.

The bar reads without colour: instances alternate `█` and `▓`, memory held by processes no
instance owns is `░`, memory in use but not attributed (driver, context, or no per-process
figures) is `▒`, free memory is `·`, and `┊` marks where an instance's planned share ends.
Right after the GPU index, `!` marks a fault that needs a person (uncorrectable ECC errors, a
failed or pending row remap / page retirement, a hardware XID) and `↓` clocks that heat or
hardware hold down; the mark takes the space that follows the index, so widths never change.
Pure (Rich text only), so the widget renders it and tests read it.
"""

from __future__ import annotations

from collections.abc import Sequence, Set
from dataclasses import dataclass

from rich.text import Text

from vsup.snapshot import GpuHealth, GpuStatus, InstanceStatus
from vsup.tui import fmt

INSTANCE_CHARS = ("█", "▓")
INSTANCE_COLOURS = (
    "cyan",
    "dodger_blue2",
    "medium_purple",
    "spring_green3",
    "steel_blue1",
    "plum2",
)
FOREIGN = ("░", "red")
OTHER = ("▒", "grey50")
FREE = ("·", "grey35")
PLAN_MARK = "┊"
FAULT_MARK = ("!", "bold red")
SLOW_MARK = ("↓", "bold yellow")
# Power-capped clocks are normal under full load; heat, hardware and unexplained ones are not.
_SLOW_REASONS = ("thermal", "hw_thermal", "hw_slowdown", "hw_power_brake", "vr_thermal",
                 "hbm_thermal", "unspecified")  # fmt: skip


@dataclass(frozen=True)
class Share:
    """One instance's memory on one GPU."""

    name: str
    actual: int | None  # bytes on this GPU, None when not known per process
    planned: int | None  # bytes the layout planned on this GPU
    over_plan: bool = False  # the daemon's advice says it holds more than planned
    # sleep mode: it keeps a remainder and its planned share is free for the awake member of
    # its swap group (so no plan mark of its own)
    asleep: bool = False


@dataclass(frozen=True)
class GpuUse:
    gpu: GpuStatus
    shares: tuple[Share, ...]
    foreign: int  # bytes held by processes no instance owns
    other: int  # used bytes not attributed to an instance or a foreign process


def gpu_use(
    gpu: GpuStatus, instances: Sequence[InstanceStatus], over_plan: Set[str] = frozenset()
) -> GpuUse:
    """Split a GPU's used memory by the instances placed on it; `over_plan` names the ones the
    advice flags (rows.over_plan_names)."""
    on_gpu = sorted((i for i in instances if gpu.index in i.gpus), key=lambda i: i.name)
    by_instance: dict[str, int] = {}
    foreign = 0
    for proc in gpu.processes:
        if proc.hbm_bytes is None:
            continue
        if proc.instance is None:
            foreign += proc.hbm_bytes
        else:
            by_instance[proc.instance] = by_instance.get(proc.instance, 0) + proc.hbm_bytes
    shares = []
    for inst in on_gpu:
        actual = by_instance.get(inst.name)
        if (
            actual is None
            and inst.memory.hbm_source == "process"
            and inst.memory.hbm_bytes is not None
        ):
            actual = inst.memory.hbm_bytes // max(1, len(inst.gpus))
        planned = None
        if inst.memory.gpu_memory_utilization is not None and gpu.hbm_total_bytes:
            planned = int(inst.memory.gpu_memory_utilization * gpu.hbm_total_bytes)
        elif inst.memory.planned_hbm_bytes is not None:
            planned = inst.memory.planned_hbm_bytes // max(1, len(inst.gpus))
        asleep = fmt.shows_sleep(inst)
        if asleep:
            planned = None
        shares.append(Share(inst.name, actual, planned, inst.name in over_plan, asleep))
    attributed = sum(s.actual or 0 for s in shares) + foreign
    other = max(0, (gpu.hbm_used_bytes or 0) - attributed)
    return GpuUse(gpu, tuple(shares), foreign, other)


def bar(use: GpuUse, width: int) -> Text:
    """The HBM bar, `width` cells between `▕` and `▏`."""
    total = use.gpu.hbm_total_bytes
    text = Text("▕")
    if not total or width <= 0:
        text.append(fmt.UNKNOWN.center(max(width, 1)), "dim")
        text.append("▏")
        return text
    cells: list[tuple[str, str]] = []

    def fill(nbytes: int, char: str, style: str) -> None:
        n = round(nbytes / total * width)
        cells.extend([(char, style)] * n)

    for index, share in enumerate(use.shares):
        if share.actual:
            colour = INSTANCE_COLOURS[index % len(INSTANCE_COLOURS)]
            fill(share.actual, INSTANCE_CHARS[index % 2], colour)
    fill(use.foreign, *FOREIGN)
    fill(use.other, *OTHER)
    del cells[width:]
    cells.extend([FREE] * (width - len(cells)))
    planned = 0
    for share in use.shares:
        if share.planned:
            planned += share.planned
            pos = min(width - 1, round(planned / total * width) - 1)
            if pos >= 0 and cells[pos] == FREE:
                cells[pos] = (PLAN_MARK, "grey70")
    for char, style in cells:
        text.append(char, style)
    text.append("▏")
    return text


def gauges(gpu: GpuStatus, compact: bool = False) -> str:
    """`87% 64°C 512W` (`87% 64° 512W` compact), unknown parts as `-`."""
    util = fmt.UNKNOWN if gpu.util_pct is None else f"{gpu.util_pct:.0f}%"
    unit = "°" if compact else "°C"
    temp = fmt.UNKNOWN if gpu.temp_c is None else f"{gpu.temp_c:.0f}{unit}"
    power = fmt.UNKNOWN if gpu.power_w is None else f"{gpu.power_w:.0f}W"
    if compact:
        return f"{util:>4} {temp:>4} {power:>5}"
    return f"{util:>4} {temp:>5} {power:>5}"


def legend(use: GpuUse) -> Text:
    """Who holds what on this GPU: `█gpu0a 60.1/63.5 ▓gpu0b 58.0/63.5 ░foreign 2.1G`."""
    text = Text()
    for index, share in enumerate(use.shares):
        colour = INSTANCE_COLOURS[index % len(INSTANCE_COLOURS)]
        text.append(INSTANCE_CHARS[index % 2], colour)
        if share.asleep:
            text.append(f"{fmt.SLEEP_SYMBOL}{share.name} {fmt.gib(share.actual)}", fmt.SLEEP_STYLE)
            text.append("  ")
            continue
        text.append(share.name, "bold red" if share.over_plan else "")
        text.append(f" {fmt.gib(share.actual)}/{fmt.gib(share.planned)}")
        if share.over_plan:
            text.append(" ▲over plan", "bold red")
        text.append("  ")
    if use.foreign:
        text.append(FOREIGN[0], FOREIGN[1])
        text.append(f"foreign {fmt.size(use.foreign)}", "bold red")
        text.append("  ")
    return text


def health_mark(gpu: GpuStatus) -> tuple[str, str] | None:
    """`!` (a fault), `↓` (clocks held down by heat or hardware) or None (nothing to say)."""
    h = gpu.health
    if h is None:
        return None
    if h.faults():
        return FAULT_MARK
    if any(r in _SLOW_REASONS for r in h.slowdowns()):
        return SLOW_MARK
    return None


def health_note(gpu: GpuStatus) -> Text:
    """What the mark means, for the legend: `!2 uncorrectable ECC, XID 79`,
    `↓thermal 1410/1980MHz`; empty for a healthy GPU."""
    text = Text()
    h = gpu.health
    if h is None:
        return text
    faults = h.faults()
    if faults:
        text.append(FAULT_MARK[0] + ", ".join(faults), FAULT_MARK[1])
    slow = [r for r in h.slowdowns() if r in _SLOW_REASONS]
    if slow:
        if faults:
            text.append(" ")
        clock = ""
        if h.sm_clock_mhz is not None and h.sm_clock_max_mhz:
            clock = f" {h.sm_clock_mhz:.0f}/{h.sm_clock_max_mhz:.0f}MHz"
        text.append(SLOW_MARK[0] + ",".join(r.replace("_", " ") for r in slow) + clock, "yellow")
    return text


def health_details(gpu: GpuStatus) -> list[tuple[str, str]]:
    """(label, value) rows for a GPU's own view: every health figure the driver gave, `-` for
    the rest of the common ones, vendor-only rows only when present."""
    h = gpu.health
    if h is None:
        return [("health", "not reported by this driver")]
    return _ecc_rows(h) + _retirement_rows(h) + _xid_rows(h) + _clock_rows(gpu, h)


def _n(v: object) -> str:
    return fmt.UNKNOWN if v is None else str(v)


def _yes(v: bool | None) -> str:
    return fmt.UNKNOWN if v is None else ("yes" if v else "no")


def _mhz(now: float | None, top: float | None) -> str:
    return (
        f"{_n(None if now is None else round(now))}/{_n(None if top is None else round(top))} MHz"
    )


def _ecc_rows(h: GpuHealth) -> list[tuple[str, str]]:
    rows = [
        ("ECC", {True: "on", False: "off", None: fmt.UNKNOWN}[h.ecc_enabled]),
        (
            "ECC errors since boot",
            f"{_n(h.ecc_volatile_uncorrected)} uncorrectable, "
            f"{_n(h.ecc_volatile_corrected)} corrected",
        ),
    ]
    if h.ecc_aggregate_corrected is not None or h.ecc_aggregate_uncorrected is not None:
        rows.append(
            (
                "ECC errors, lifetime",
                f"{_n(h.ecc_aggregate_uncorrected)} uncorrectable, "
                f"{_n(h.ecc_aggregate_corrected)} corrected",
            )
        )
    if h.ecc_deferred is not None:
        rows.append(("ECC deferred", _n(h.ecc_deferred)))
    return rows


def _retirement_rows(h: GpuHealth) -> list[tuple[str, str]]:
    """Rows remapped (NVIDIA since Ampere) and pages retired (older NVIDIA, AMD)."""
    rows = []
    if h.rows_remapped_correctable is not None or h.row_remap_pending is not None:
        rows.append(
            (
                "rows remapped",
                f"{_n(h.rows_remapped_uncorrectable)} uncorrectable, "
                f"{_n(h.rows_remapped_correctable)} correctable; "
                f"pending {_yes(h.row_remap_pending)}, failed {_yes(h.row_remap_failed)}",
            )
        )
    if h.retired_pages is not None or h.retired_pages_pending is not None:
        unreservable = (
            f"; {h.bad_pages_unreservable} could not be retired" if h.bad_pages_unreservable else ""
        )
        rows.append(
            (
                "retired pages",
                f"{_n(h.retired_pages)}; pending {_yes(h.retired_pages_pending)}{unreservable}",
            )
        )
    return rows


def _xid_rows(h: GpuHealth) -> list[tuple[str, str]]:
    if h.xid_count is None:
        return []
    last = h.xid_recent[-1] if h.xid_recent else None
    recent = f"; last: XID {last.xid} ({last.what or 'unknown'}) at {last.at}" if last else ""
    return [("XID errors since vsup started", f"{h.xid_count}{recent}")]


def _clock_rows(gpu: GpuStatus, h: GpuHealth) -> list[tuple[str, str]]:
    """What holds the clocks down, the clocks, power against its limit, temperature."""
    reasons = h.throttle_reasons
    held = (
        fmt.UNKNOWN
        if reasons is None
        else (", ".join(r.replace("_", " ") for r in reasons) or "nothing")
    )
    power = _n(None if gpu.power_w is None else round(gpu.power_w))
    limit = _n(None if h.power_limit_w is None else round(h.power_limit_w))
    return [
        ("clocks held by", held),
        ("SM clock", _mhz(h.sm_clock_mhz, h.sm_clock_max_mhz)),
        ("memory clock", _mhz(h.mem_clock_mhz, h.mem_clock_max_mhz)),
        ("power", f"{power}/{limit} W"),
        ("temperature", fmt.UNKNOWN if gpu.temp_c is None else f"{gpu.temp_c:.0f}°C"),
    ]


def short_name(name: str | None) -> str:
    """`NVIDIA H200` -> `H200`, `AMD Instinct MI300X` -> `MI300X`: the vendor is in the header."""
    if not name:
        return "GPU"
    words = [w for w in name.split() if w.lower() not in ("nvidia", "amd", "instinct", "tesla")]
    return " ".join(words) or name


def line(use: GpuUse, bar_width: int, with_legend: bool) -> Text:
    """A GPU's whole row: index, name, bar, used/total, util, temperature, power, legend."""
    gpu = use.gpu
    name = fmt.truncate(short_name(gpu.name), 10)
    text = Text(f"{gpu.index:>2}", "bold")
    mark = health_mark(gpu)
    text.append(*(mark or (" ", "")))
    if with_legend:
        text.append(f"{name:<10} ", "dim")
    text.append_text(bar(use, bar_width))
    used = f" {fmt.gib(gpu.hbm_used_bytes)}/{fmt.gib(gpu.hbm_total_bytes)}G"
    text.append(f"{used:>13} " if with_legend else f"{used}")
    text.append(gauges(gpu, compact=not with_legend))
    if with_legend:
        text.append("  ")
        note = health_note(gpu)
        if note:
            text.append_text(note)
            text.append("  ")
        text.append_text(legend(use))
    return text
