"""A log widget that shows a log as a terminal would: progress bars redrawn in place.

`Log.write` splits on carriage returns, so every tqdm update of vLLM's start-up became a line
of its own. `LiveLog.feed(chunk)` passes the text through `vsup.logtext.TerminalLines`: final
lines are appended once; the lines still moving (a bar being drawn, a line without its newline)
sit at the end and are replaced by the next chunk.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.segment import Segment
from rich.style import Style
from textual.geometry import Size
from textual.strip import Strip
from textual.widgets import Log

from vsup.logtext import TerminalLines

CUT_RIGHT = "»"  # the line goes on past the right edge (scroll right to read it)
CUT_LEFT = "«"  # scrolled right: the line began before the left edge


class LiveLog(Log):
    """`feed(text)` appends a chunk of a log; `reset()` starts a new one. A line wider than
    the widget ends in `»` at its edge (and starts with `«` when scrolled right), so a cut
    line never reads as a whole one."""

    def __init__(
        self, *args: Any, keep: Callable[[str], bool] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.keep = keep  # which display lines to show (None: all)
        self._terminal = TerminalLines()
        self._live = 0  # lines at the end that the next chunk may replace

    def _render_line(self, y: int, scroll_x: int, width: int) -> Strip:
        strip = super()._render_line(y, scroll_x, width)
        # what shows: `width` less a vertical scrollbar's gutter, which crops the strip
        width = min(width, self.scrollable_content_region.width)
        if y >= len(self._lines) or width < 2:
            return strip
        full = self._render_line_strip(y, self.rich_style).cell_length
        style = self.rich_style + Style(reverse=True)
        if full > scroll_x + width:
            strip = Strip.join([strip.crop(0, width - 1), Strip([Segment(CUT_RIGHT, style)])])
        if scroll_x > 0 and full > 0:
            strip = Strip.join([Strip([Segment(CUT_LEFT, style)]), strip.crop(1, width)])
        return strip.apply_offsets(scroll_x, y)

    def reset(self) -> None:
        self._terminal = TerminalLines()
        self._live = 0
        self.clear()

    def feed(self, text: str) -> None:
        """Append a chunk of the log (any size, cut anywhere)."""
        done = self._terminal.feed(text)
        live = self._terminal.pending()
        if self.keep is not None:
            done = [line for line in done if self.keep(line)]
            live = [line for line in live if self.keep(line)]
        if not done and not live and not self._live:
            return
        self._drop_live()
        # Log.write_lines drops empty strings (it splits each one into lines): keep blank lines.
        self.write_lines([line or " " for line in done + live])
        self._live = len(live)

    def note(self, line: str) -> None:
        """End the current stream (what was still moving stays as it is) and add `line`, e.g.
        a marker between two runs."""
        done = self._terminal.flush()
        if self.keep is not None:
            done = [d for d in done if self.keep(d)]
        self._terminal = TerminalLines()
        self._drop_live()
        self.write_lines([d or " " for d in done] + [line])

    def _drop_live(self) -> None:
        if not self._live:
            return
        # Log keeps its lines in `_lines` (Textual 8) and offers no call to remove the last ones;
        # drop them there and forget their cached renders, as `Log.clear` does for all lines.
        start = max(0, len(self._lines) - self._live)
        for y in range(start, len(self._lines)):
            self._render_line_cache.discard(y)
        del self._lines[start:]
        self.virtual_size = Size(self._width, len(self._lines))
        self._live = 0
        self.refresh()

    def rewrite(self, text: str) -> None:
        """Show `text` from the start (e.g. with a different filter)."""
        self.reset()
        self.feed(text)
