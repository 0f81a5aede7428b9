"""The instances table as data: columns, the cells of one row, sort orders, and the diff
between two renderings (Dolphie's pattern: touch only the cells whose text changed).

Pure (no Textual): the widget in `widgets/instances.py` applies a `TableDiff`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vsup import pullview, sleepview
from vsup.snapshot import Advice, InstanceStatus
from vsup.states import State
from vsup.tui import fmt

# A cell is its text and a Rich style; comparing these tuples is the whole diff.
Cell = tuple[str, str]
Row = tuple[Cell, ...]


@dataclass(frozen=True)
class Column:
    key: str
    label: str
    width: int
    right: bool = False  # numbers align right
    priority: int = 0  # lower stays longer when the terminal is narrow
    gpu_only: bool = False  # dropped on a CPU node, where it is always unknown
    parallel_only: bool = False  # shown only when an instance runs DP or PP ranks
    load_only: bool = False  # shown only when an instance reports requests in flight (/load)


COLUMNS: tuple[Column, ...] = (
    Column("name", "NAME", 14, priority=0),
    Column("gpus", "GPU", 4, priority=11),
    Column("parallel", "SHAPE", 10, priority=11, parallel_only=True),
    Column("port", "PORT", 5, right=True, priority=12),
    Column("state", "STATE", 15, priority=1),  # `◐ 12m03s of 20m`
    Column("uptime", "UP", 6, right=True, priority=7),
    Column("restarts", "RST", 3, right=True, priority=8),
    Column("hbm", "HBM", 11, right=True, priority=6, gpu_only=True),
    Column("kv", "KV", 4, right=True, priority=2),
    Column("kv_cap", "KV TOK", 6, right=True, priority=9),
    Column("preempt", "PREEMPT", 7, right=True, priority=10),
    Column("preempt_rate", "PRE/M", 5, right=True, priority=3),
    Column("run_wait", "RUN/WAIT", 8, right=True, priority=5),
    # requests in flight at the API server (/load): more than RUN/WAIT shows is the sign of
    # requests waiting at a frozen engine
    Column("in_flight", "LOAD", 4, right=True, priority=9, load_only=True),
    Column("tok_s", "TOK/S", 6, right=True, priority=4),
    Column("backend", "BACKEND", 16, priority=13),
    Column("model", "MODEL", 12, priority=14),  # takes what is left
)
PADDING = 2  # DataTable's cell padding, one cell each side
MODEL_MIN = 12


def columns_for(
    width: int, has_gpus: bool, has_parallel: bool = False, has_load: bool = False
) -> tuple[Column, ...]:
    """The columns that fit `width` cells, most important first, shown in table order;
    the model column takes the remaining width. `has_parallel`: some instance runs data- or
    pipeline-parallel ranks (`has_parallel_shape`), which adds the SHAPE column; `has_load`:
    some instance reports the API server's requests in flight (`has_load_figures`): LOAD."""
    candidates = [
        c
        for c in COLUMNS
        if (has_gpus or not c.gpu_only)
        and (has_parallel or not c.parallel_only)
        and (has_load or not c.load_only)
    ]
    keep: set[str] = set()
    used = 0
    for col in sorted(candidates, key=lambda c: c.priority):
        need = col.width + PADDING
        if used + need > width:
            break
        keep.add(col.key)
        used += need
    out = []
    for col in candidates:
        if col.key not in keep:
            continue
        if col.key == "model":
            col = Column(
                col.key,
                col.label,
                max(MODEL_MIN, width - used + col.width),
                col.right,
                col.priority,
            )
        out.append(col)
    return tuple(out)


def has_load_figures(instances: Iterable[InstanceStatus]) -> bool:
    """Whether any instance reports vLLM's /load (load tracking): the LOAD column then shows."""
    return any(i.telemetry.requests_in_flight is not None for i in instances)


def has_parallel_shape(instances: Iterable[InstanceStatus]) -> bool:
    """Whether any instance runs DP or PP ranks (the SHAPE column then shows every shape)."""
    return any(
        i.parallel is not None and (i.parallel.dp > 1 or i.parallel.pp > 1) for i in instances
    )


def _kv_style(usage: float | None) -> str:
    if usage is None:
        return "dim"
    if usage >= 0.95:
        return "bold red"
    if usage >= 0.80:
        return "yellow"
    return ""


def over_plan_names(advice: Iterable[Advice]) -> frozenset[str]:
    """The instances the daemon's advice says hold more HBM than planned. The dashboard shows
    that verdict rather than comparing figures itself: vLLM keeps some memory outside its
    planned share by design, and only the advice knows how much (control/advice.py)."""
    return frozenset(a.instance for a in advice if a.kind == "hbm_over_plan" and a.instance)


def hbm_cell(inst: InstanceStatus, over: bool = False) -> Cell:
    """`60.1/63.5G` (actual/planned); `▲` and red when `over` (the advice says it holds more
    than planned); `~` when the figure is per device rather than per process."""
    if fmt.shows_sleep(inst):
        # what a sleeper keeps (its CUDA context and non-torch memory), against no plan:
        # its planned share is free for the awake member of its swap group
        kept = fmt.sleep_kept_bytes(inst)
        return (f"{fmt.SLEEP_SYMBOL}{fmt.size(kept)}" if kept is not None else fmt.UNKNOWN, "dim")
    if inst.memory.hbm_bytes is None:
        return (fmt.UNKNOWN, "dim")
    approx = "~" if inst.memory.hbm_source == "device" else ""
    planned = inst.memory.planned_hbm_bytes
    if planned:
        text = f"{approx}{fmt.gib(inst.memory.hbm_bytes)}/{fmt.gib(planned)}G"
        return (("▲" if over else "") + text, "bold red" if over else "")
    return (f"{approx}{fmt.size(inst.memory.hbm_bytes)}", "")


def _state_cell(inst: InstanceStatus, width: int) -> Cell:
    stall = inst.active_stall
    if stall is not None:
        return (fmt.stalled_label(stall.for_s), "bold red")
    sleep = fmt.sleep_label(inst)
    if sleep is not None:
        return (fmt.truncate(sleep, width), fmt.sleep_style(inst))
    if inst.pull is not None and inst.lifecycle.state == State.STOPPED:
        # a new instance waiting for its weights, or kept from starting by a failed pull
        mark = pullview.state_mark(inst.pull)
        if mark == "pull failed":
            return ("✖ pull failed", "bold red")
        if mark:
            return (f"⇣ {mark}", "bold cyan")
    wait_text = fmt.wait_cell(inst)
    if wait_text is not None:
        return (fmt.truncate(wait_text, width), fmt.state_style(inst.lifecycle.state))
    label = fmt.state_label(inst.lifecycle.state, inst.lifecycle.backoff_remaining_s)
    if inst.lifecycle.outdated:
        # a rollout not yet at it, or one a killed daemon left half-done
        return (fmt.truncate(f"{label} old", width), "yellow")
    return (label, fmt.state_style(inst.lifecycle.state))


def _parallel_cell(inst: InstanceStatus, width: int) -> Cell:
    label = inst.parallel.label if inst.parallel is not None else fmt.UNKNOWN
    dead = any(r.alive is False for r in inst.ranks)
    return (fmt.truncate(label, width), "bold red" if dead else "")


def _preempt_rate_cell(inst: InstanceStatus) -> Cell:
    rate = inst.telemetry.preemptions_per_min
    style = "dim" if rate is None else ("bold red" if rate > 0 else "")
    return (fmt.count(rate), style)


def _run_wait_cell(inst: InstanceStatus) -> Cell:
    waiting = inst.telemetry.requests_waiting or 0
    return (
        fmt.running_waiting(inst.telemetry.requests_running, inst.telemetry.requests_waiting),
        "yellow" if waiting > 0 else "",
    )


def _in_flight_cell(inst: InstanceStatus) -> Cell:
    n = inst.telemetry.requests_in_flight
    if n is None:
        return (fmt.UNKNOWN, "dim")
    shown = (inst.telemetry.requests_running or 0) + (inst.telemetry.requests_waiting or 0)
    return (fmt.count(n), "yellow" if n > shown else "")


def _backend_cell(inst: InstanceStatus, width: int) -> Cell:
    style = "" if inst.telemetry.backend_source == "log" else "italic"
    return (
        fmt.truncate(
            fmt.safe(fmt.backend(inst.telemetry.backend, inst.telemetry.backend_source)), width
        ),
        style,
    )


# column key -> its cell from (instance, width, over plan): one entry per column of COLUMNS
_CELLS: dict[str, Callable[[InstanceStatus, int, bool], Cell]] = {
    "name": lambda i, w, o: (fmt.truncate(fmt.safe(i.name), w), "bold"),
    "gpus": lambda i, w, o: (fmt.gpus(i.gpus), ""),
    "parallel": lambda i, w, o: _parallel_cell(i, w),
    "port": lambda i, w, o: (str(i.port) if i.port is not None else fmt.UNKNOWN, ""),
    "state": lambda i, w, o: _state_cell(i, w),
    "uptime": lambda i, w, o: (fmt.duration(i.lifecycle.uptime_s), ""),
    "restarts": lambda i, w, o: (
        str(i.lifecycle.restarts),
        "yellow" if i.lifecycle.restarts else "",
    ),
    "hbm": lambda i, w, o: hbm_cell(i, o),
    "kv": lambda i, w, o: (
        fmt.percent(i.telemetry.kv_cache_usage),
        _kv_style(i.telemetry.kv_cache_usage),
    ),
    "kv_cap": lambda i, w, o: (fmt.count(i.telemetry.kv_capacity_tokens), ""),
    "preempt": lambda i, w, o: (fmt.count(i.telemetry.preemptions_total), ""),
    "preempt_rate": lambda i, w, o: _preempt_rate_cell(i),
    "run_wait": lambda i, w, o: _run_wait_cell(i),
    "in_flight": lambda i, w, o: _in_flight_cell(i),
    "tok_s": lambda i, w, o: (fmt.count(i.telemetry.generation_tokens_per_s), ""),
    "backend": lambda i, w, o: _backend_cell(i, w),
    "model": lambda i, w, o: (fmt.model_name(fmt.model_label(i), w), ""),
}


def _cell(inst: InstanceStatus, key: str, width: int, over: bool) -> Cell:
    return _CELLS[key](inst, width, over)  # KeyError for a column without a cell


def row_cells(inst: InstanceStatus, columns: Sequence[Column], over_plan: bool = False) -> Row:
    """The cells of one instance's row, in column order; `over_plan`: the advice flags its
    HBM."""
    return tuple(_cell(inst, c.key, c.width, over_plan) for c in columns)


# Problems first when sorting by state: what on-call looks for.
_STATE_RANK = {
    s: i
    for i, s in enumerate(
        ("failed", "unhealthy", "backoff", "starting", "stopping", "stopped", "asleep", "ready")
    )
}


def _sort_state(i: InstanceStatus) -> str:
    """The state a row sorts by: a stall ranks as unhealthy, a sleeper after the stopped
    ones (it serves nothing, by choice)."""
    if i.active_stall is not None:
        return "unhealthy"
    if fmt.shows_sleep(i):
        return "asleep"
    return i.lifecycle.state


def _num(value: float | None) -> float:
    return float("-inf") if value is None else float(value)


# sort name -> (label, key function, descending by default)
SORTS: dict[str, tuple[str, Callable[[InstanceStatus], Any], bool]] = {
    "name": ("name", lambda i: i.name, False),
    "state": (
        "state (problems first)",
        lambda i: (_STATE_RANK.get(_sort_state(i), -1), i.name),
        False,
    ),
    "kv": ("KV cache use", lambda i: _num(i.telemetry.kv_cache_usage), True),
    "preempt_rate": (
        "preemptions per minute",
        lambda i: _num(i.telemetry.preemptions_per_min),
        True,
    ),
    "tok_s": ("generation tok/s", lambda i: _num(i.telemetry.generation_tokens_per_s), True),
    "hbm": ("HBM", lambda i: _num(i.memory.hbm_bytes), True),
    "restarts": ("restarts", lambda i: i.lifecycle.restarts, True),
    "gpus": ("GPU", lambda i: (i.gpus or (10**6,), i.name), False),
}
SORT_ORDER = tuple(SORTS)


def sorted_names(
    instances: Iterable[InstanceStatus], sort: str, reverse: bool = False
) -> list[str]:
    """Instance names in display order; ties break by name so the order is stable."""
    _, key, descending = SORTS[sort]
    items = sorted(instances, key=lambda i: i.name)
    items.sort(key=key, reverse=descending != reverse)
    return [i.name for i in items]


def matches(inst: InstanceStatus, text: str) -> bool:
    """The `/` filter: a case-insensitive substring of name, model, state, backend or port."""
    if not text:
        return True
    needle = text.lower()
    state = f"{inst.lifecycle.state} stalled" if inst.active_stall else str(inst.lifecycle.state)
    if inst.sleep is not None:
        state += f" {sleepview.state_word(inst.sleep, ellipsis='')} sleep"
    hay = (
        inst.name,
        inst.model or "",
        inst.served_model_name or "",
        state,
        inst.telemetry.backend or "",
        str(inst.port or ""),
    )
    return any(needle in h.lower() for h in hay)


@dataclass
class TableDiff:
    """What to do to the table to go from one rendering to the next."""

    removed: list[str] = field(default_factory=list)
    added: list[tuple[str, Row]] = field(default_factory=list)
    changed: list[tuple[str, int, Cell]] = field(default_factory=list)  # name, column index, cell
    order: list[str] | None = None  # the new row order, only when it differs

    @property
    def empty(self) -> bool:
        return not (self.removed or self.added or self.changed or self.order is not None)


def diff_rows(
    old: Mapping[str, Row],
    old_order: Sequence[str],
    new: Mapping[str, Row],
    new_order: Sequence[str],
) -> TableDiff:
    """The changes from `old` (rows by name, shown in `old_order`) to `new`."""
    diff = TableDiff()
    diff.removed = [name for name in old_order if name not in new]
    for name in new_order:
        row = new[name]
        before = old.get(name)
        if before is None:
            diff.added.append((name, row))
            continue
        if before != row:
            for index, (a, b) in enumerate(zip(before, row, strict=False)):
                if a != b:
                    diff.changed.append((name, index, b))
    kept = [n for n in old_order if n in new]
    if diff.added or kept != list(new_order):
        # Added rows land at the end; a sort puts them (and anything that moved) in place.
        appended = kept + [n for n, _ in diff.added]
        if appended != list(new_order):
            diff.order = list(new_order)
    return diff
