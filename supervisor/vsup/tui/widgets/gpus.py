"""The GPU panel: one HBM bar per GPU (two per line in a narrow terminal)."""

from __future__ import annotations

from collections.abc import Sequence, Set
from typing import Any

from rich.text import Text
from textual.widgets import Static

from vsup.snapshot import GpuStatus, InstanceStatus, StatusSnapshot
from vsup.tui import gpubar, rows


def gpu_lines(
    gpus: Sequence[GpuStatus],
    instances: Sequence[InstanceStatus],
    width: int,
    narrow: bool,
    over_plan: Set[str] = frozenset(),
) -> Text:
    """The panel's text for a content `width`; `over_plan` as in gpubar.gpu_use."""
    if not gpus:
        cpu = sum(1 for i in instances if not i.gpus)
        return Text.assemble(
            ("no GPUs (CPU node)", "bold"),
            (f" · {cpu} instance{'s' if cpu != 1 else ''} on CPU", "dim"),
        )
    uses = [gpubar.gpu_use(g, instances, over_plan) for g in gpus]
    lines: list[Text] = []
    if narrow:
        # two GPUs per line: index, bar, used/total, gauges
        col = max(20, (width - 1) // 2)
        # the bar takes what the numbers leave of the half line
        rest = max(len(gpubar.line(u, 0, with_legend=False).plain) for u in uses)
        bar_w = max(4, col - rest - 1)
        for i in range(0, len(uses), 2):
            row = Text()
            for j, use in enumerate(uses[i : i + 2]):
                cell = gpubar.line(use, bar_w, with_legend=False)
                cell.truncate(col, pad=True)
                if j:
                    row.append(" ")
                row.append_text(cell)
            lines.append(row)
    else:
        bar_w = max(10, min(48, width // 4))
        for use in uses:
            cell = gpubar.line(use, bar_w, with_legend=True)
            cell.truncate(width)
            lines.append(cell)
    return Text("\n").join(lines)


class GpuPanel(Static):
    """HBM split by instance, foreign memory, utilisation, temperature and power per GPU."""

    DEFAULT_CSS = """
    GpuPanel { height: 1; padding: 0 1; }
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__("", **kwargs)
        self._key: tuple | None = None
        self._snapshot: StatusSnapshot | None = None
        self.narrow = False

    def show(self, snapshot: StatusSnapshot, narrow: bool) -> None:
        self._snapshot = snapshot
        self.narrow = narrow
        self._render_now()

    def on_resize(self) -> None:
        self._render_now()

    def _render_now(self) -> None:
        snap = self._snapshot
        if snap is None:
            return
        width = self.content_size.width or (self.app.size.width - 2)
        over = rows.over_plan_names(snap.advice)
        # What the bars depend on; an unchanged key means no repaint.
        key = (
            snap.gpus,
            tuple(
                (
                    i.name,
                    i.gpus,
                    i.memory.hbm_bytes,
                    i.memory.hbm_source,
                    i.memory.planned_hbm_bytes,
                    i.memory.gpu_memory_utilization,
                )
                for i in snap.instances
            ),
            over,
            width,
            self.narrow,
        )
        if key == self._key:
            return
        self._key = key
        text = gpu_lines(snap.gpus, snap.instances, width, self.narrow, over)
        # An explicit height: the panel's line count is known, no measuring needed.
        height = text.plain.count("\n") + 1
        if self.styles.height is None or self.styles.height.value != height:
            self.styles.height = height
        self.update(text)
