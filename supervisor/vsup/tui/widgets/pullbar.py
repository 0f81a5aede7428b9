"""The pull line: shown while the daemon pulls a hub model before its instances start, or
when a pull failed and kept them from starting (docs/pull.md) - the reason those instances
are `stopped`, said where the eye lands."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widgets import Static

from vsup import pullview
from vsup.snapshot import PullStatus
from vsup.states import PullState
from vsup.tui.widgets.benchbar import _bar


def pull_text(pulls: tuple[PullStatus, ...]) -> Text | None:
    """`⇣ pulling org/name for a, b: 12.1 GiB/28.0 GiB (43%) ████▏  85.0 MiB/s · ETA 3m12s`, or
    `✖ pull of org/name failed (unauthorized): ...`; None when no pull runs or failed."""
    shown = [p for p in pulls if p.state in (PullState.PULLING, PullState.FAILED)]
    if not shown:
        return None
    p = sorted(shown, key=lambda p: p.state != PullState.FAILED)[0]  # a failure first
    text = Text(no_wrap=True, overflow="ellipsis")
    who = ", ".join(p.instances)
    if p.state == PullState.FAILED:
        text.append("✖ pull of ", "bold")
        text.append(pullview.label(p), "bold")
        text.append(f" failed ({p.reason}): ", "bold")
        text.append(p.message or "")
        text.append(f" · {who} not started; `vsup up` again retries", "dim")
    else:
        text.append("⇣ pulling ", "bold")
        text.append(pullview.label(p), "bold")
        text.append(f" for {who}: ")
        if p.bytes_total:
            text.append(
                f"{pullview.human_bytes(p.bytes_done)}/{pullview.human_bytes(p.bytes_total)}"
            )
            text.append(f" ({pullview.percent(p)}) ")
            text.append_text(_bar(p.fraction or 0.0))
            if p.rate_bps:
                text.append(f" {pullview.human_bytes(p.rate_bps)}/s")
                if p.eta_s is not None:
                    text.append(f" · ETA {pullview.duration(p.eta_s)}")
            if p.files_total:
                text.append(f" · {p.files_done or 0}/{p.files_total} files")
        else:
            text.append("asking the hub which files to fetch")
        text.append(" · the instances start from the local copy when it is done", "dim")
    if len(shown) > 1:
        text.append(f" (+{len(shown) - 1} more: `vsup status`)", "dim")
    return text


class PullBar(Static):
    """One line under the header while a pull runs or after one failed; hidden otherwise."""

    DEFAULT_CSS = """
    PullBar { height: 1; background: $accent 30%; padding: 0 1; display: none; }
    PullBar.-shown { display: block; }
    PullBar.-failed { background: $error 40%; }
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__("", **kwargs)
        self._shown: str | None = None

    def show(self, pulls: tuple[PullStatus, ...]) -> bool:
        """Show the pulls (none running or failed hides the line). True when the line appeared
        or went."""
        was = self.has_class("-shown")
        text = pull_text(pulls)
        if text is None:
            self._shown = None
            self.remove_class("-shown")
            return was
        if text.plain != self._shown:
            self._shown = text.plain
            self.update(text)
        self.set_class(any(p.state == PullState.FAILED for p in pulls), "-failed")
        self.add_class("-shown")
        return not was
