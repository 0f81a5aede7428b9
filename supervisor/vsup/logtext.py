"""A log as a terminal would show it: progress bars at their last state, not one line per update.

vLLM's start-up draws tqdm bars that redraw in place. Seen in a real CUDA vLLM 0.26 log
(tests/fixtures/vllm-0.26-cuda/startup.log):
- `Capturing CUDA graphs (PIECEWISE):  10%|█ | 5/51 [...]\\rCapturing ...  20%|██ ...` - every
  update starts with a carriage return, all on one line that ends when the bar closes;
- `\\rLoading safetensors checkpoint shards:   0% Completed | 0/1 [...]\\n` - vLLM's weight
  loader puts a newline in tqdm's `bar_format`, so each state is a line of its own;
- worker output carries a `(EngineCore pid=N) ` prefix (in colour on a terminal) that the first
  carriage return overwrites, and vLLM's banner lines end in `\\r\\n`.

`TerminalLines` turns such text into display lines: within a line each `\\r` segment overwrites
the start of what was there (as a terminal does), ANSI escapes (colours, cursor moves, window
titles) go, any other control character (a BEL, a stray ESC) is shown as an escape (`\\x07`,
vsup.termtext.printable) so that a log can never drive the terminal that shows it, and
consecutive states of one bar (same description and total, progress not going back) keep only
the last. It works on a stream (`feed` chunks as they arrive; lines that a later chunk may still
change are `pending`), so a follower shows a bar moving in place. `collapse(text)` does a whole
text at once. Pure text, no I/O: the dashboard and `vsup logs` both use it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from vsup.termtext import printable

# OSC sequences (a window title: ESC ] 0;TEXT BEL, or ending in ESC \\), CSI sequences
# (colours, cursor moves, erase) and the two-character escapes.
_ANSI = re.compile(r"\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")
# tqdm's default `{desc}: {percentage:3.0f}%|{bar}| {n}/{total} [...]` and vLLM's
# `{desc}: {percentage:3.0f}% Completed | {n}/{total} [...]`.
_BAR = re.compile(
    r"^(?P<desc>.*?):\s*(?P<pct>\d{1,3})%(?:\s*Completed\s*)?\|"
    r".*?\b(?P<n>\d+(?:\.\d+)?)(?P<unit>[kMGT]?)/(?P<total>\d+(?:\.\d+)?[kMGT]?)\s*\["
)
MAX_HELD = 16  # bar lines held back at once (several bars drawn below each other)


def render_line(raw: str) -> str:
    """One line (no newline) as a terminal shows it: `\\r` segments overwrite from column 0,
    escapes removed."""
    if "\x1b" in raw:
        raw = _ANSI.sub("", raw)
    if "\r" not in raw:
        return raw
    shown = ""
    for segment in raw.split("\r"):
        if segment:
            shown = segment + shown[len(segment) :]
    return shown.rstrip()


def _shown(raw: str) -> str:
    """A display line: as a terminal shows it, and safe to print (no control characters)."""
    return printable(render_line(raw), newlines=True)


@dataclass(frozen=True)
class BarState:
    """What identifies a progress bar line, and how far it got."""

    desc: str
    total: str
    n: float


def bar_state(line: str) -> BarState | None:
    """The bar a display line draws, or None when it is no tqdm bar."""
    if "%" not in line or "/" not in line:
        return None
    m = _BAR.search(line)
    if m is None:
        return None
    scale = {"": 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}[m.group("unit")]
    return BarState(m.group("desc").strip(), m.group("total"), float(m.group("n")) * scale)


class TerminalLines:
    """Incremental: `feed(chunk)` returns the display lines that are final; `pending()` the
    ones a later chunk may still change (a line whose newline has not come, the last states of
    bars); `flush()` ends the stream and returns what was pending."""

    def __init__(self) -> None:
        self._partial = ""
        self._held: list[tuple[BarState, str]] = []

    def feed(self, text: str) -> list[str]:
        if not text:
            return []
        parts = (self._partial + text).split("\n")
        self._partial = parts.pop()
        out: list[str] = []
        for raw in parts:
            out += self._add(_shown(raw))
        return out

    def pending(self) -> list[str]:
        """Lines shown for now: held bar states, then the line still being written."""
        lines = [line for _, line in self._held]
        if self._partial:
            partial = _shown(self._partial)
            state = bar_state(partial)
            held = self._match(state) if state is not None else None
            if held is not None:
                lines[held] = partial  # the bar being redrawn, in its place
            else:
                lines.append(partial)
        return lines

    def flush(self) -> list[str]:
        out = [line for _, line in self._held]
        self._held = []
        if self._partial:
            out += self._add(_shown(self._partial))
            out += [line for _, line in self._held]
            self._held, self._partial = [], ""
        return out

    def _match(self, state: BarState) -> int | None:
        # The latest bar of that name: an earlier one that finished stays as it ended.
        for i in range(len(self._held) - 1, -1, -1):
            held = self._held[i][0]
            if held.desc == state.desc and held.total == state.total:
                return i if state.n >= held.n else None
        return None

    def _add(self, line: str) -> list[str]:
        state = bar_state(line)
        if state is None:
            out = [held for _, held in self._held] + [line]
            self._held = []
            return out
        i = self._match(state)
        if i is not None:
            self._held[i] = (state, line)
            return []
        self._held.append((state, line))
        if len(self._held) > MAX_HELD:
            return [self._held.pop(0)[1]]
        return []


def collapse(text: str) -> str:
    """A whole log text as a terminal would leave it on screen (see the module doc)."""
    if "\r" not in text and "\x1b" not in text and "%" not in text:
        return printable(text, newlines=True)  # nothing to redraw: the common case
    lines = TerminalLines()
    out = lines.feed(text) + lines.flush()
    return "\n".join(out) + ("\n" if text.endswith("\n") and out else "")
