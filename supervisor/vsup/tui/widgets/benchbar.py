"""The bench line: shown while a `vsup bench` runs, because the layout under test replaced the
running one and an on-call engineer must not take that for an incident."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widgets import Static

from vsup.snapshot import BenchProgress
from vsup.tui import fmt

PHASE_WORDS = {
    "applying": "applying the layout",
    "waiting_ready": "waiting until its instances are ready",
    "warming": "starting vLLM's bench clients",
    "running": "running",
    "collecting": "collecting the figures",
    "restoring": "restoring the original layout",
}
BAR_CELLS = 20


def bench_text(bench: BenchProgress) -> Text:
    """`◆ bench 2/3 'two-per-gpu': running 412/1000 requests ████▏    1m12s · ...`."""
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append(f"◆ {bench.tool}", "bold")
    if bench.index is not None and bench.count is not None:
        text.append(f" {bench.index}/{bench.count}", "bold")
    if bench.layout and bench.phase != "restoring":
        text.append(f" '{bench.layout}'", "bold")
    text.append(": " + PHASE_WORDS.get(bench.phase, bench.phase))
    if bench.phase == "restoring" and bench.layout:
        text.append(f" '{bench.layout}'")
    done, total = bench.requests_done, bench.requests_total
    if bench.phase in ("running", "collecting") and total:
        text.append(f" {done or 0}/{total} requests ")
        text.append_text(_bar((done or 0) / total))
    text.append(f" {fmt.duration(bench.elapsed_s)}")
    if bench.eta_s is not None and bench.phase != "restoring":
        text.append(f" · ~{fmt.duration(bench.eta_s)} left", "bold")
    text.append(
        f" · vsup {bench.tool} (pid {bench.pid}) replaced the running layout; it restores it "
        "at the end",
        "dim",
    )
    return text


def _bar(fraction: float) -> Text:
    fraction = min(1.0, max(0.0, fraction))
    eighths = round(fraction * BAR_CELLS * 8)
    full, part = divmod(eighths, 8)
    cells = "█" * full + ("▏▎▍▌▋▊▉"[part - 1] if part else "")
    return Text(cells.ljust(BAR_CELLS), "green")


class BenchBar(Static):
    """One line under the header while a bench runs; hidden otherwise."""

    DEFAULT_CSS = """
    BenchBar { height: 1; background: $warning 30%; padding: 0 1; display: none; }
    BenchBar.-shown { display: block; }
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__("", **kwargs)
        self._shown: str | None = None

    def show(self, bench: BenchProgress | None) -> bool:
        """Show `bench` (None hides the line). True when the line appeared or went."""
        was = self.has_class("-shown")
        if bench is None:
            self._shown = None
            self.remove_class("-shown")
            return was
        text = bench_text(bench)
        if text.plain != self._shown:
            self._shown = text.plain
            self.update(text)
        self.add_class("-shown")
        return not was
