"""`vsup logs NAME [-f] [--previous] [--raw]`: an instance's log, this run or the one before.

Shown as a terminal would show it (vsup.logtext): a progress bar at its last state, not one line
per redraw. Following on a terminal, the bar being drawn is redrawn in place at the bottom;
into a pipe, only finished lines are written. `--raw` writes the bytes as logged.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from typing import TYPE_CHECKING, TextIO

from vsup.logtext import TerminalLines

if TYPE_CHECKING:
    from vsup.control.client import Client

# Cursor to the start of the line and erase it; and one line up.
_ERASE_LINE = "\r\x1b[K"
_UP = "\x1b[A"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "logs",
        help="print an instance's log (this run, or --previous)",
        description="Print the log of the instance's current run, or of the run before it "
        "(--previous: what a crashed run said before it died).",
    )
    p.add_argument("name", metavar="NAME", help="instance name")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing what is appended")
    p.add_argument("--previous", action="store_true", help="the run before the current one")
    p.add_argument(
        "--raw",
        action="store_true",
        help="write the log as logged (every progress-bar redraw, escape codes)",
    )
    p.add_argument(
        "--tail",
        type=int,
        default=None,
        metavar="BYTES",
        help="start this many bytes before the end (at a line start)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from vsup.commands.cliutil import client_for_cli, run_command
    from vsup.control.client import check_name

    def body(args: argparse.Namespace) -> int:
        check_name(args.name)  # before a daemon is started or asked
        with client_for_cli() as client:
            try:
                follow(client, args.name, args.previous, args.follow, args.tail, raw=args.raw)
            except BrokenPipeError:
                # `vsup logs x | head` closed the pipe: not an error.
                sys.stderr.close()
        return 0

    return run_command(body, args)


class _Screen:
    """Writes display lines; on a terminal the still-moving ones are redrawn in place."""

    def __init__(self, out: TextIO, raw: bool, live: bool) -> None:
        self.out = out
        self.raw = raw
        self.live = live  # redraw pending lines in place (following, on a terminal)
        self.lines = TerminalLines()
        self._shown = 0  # pending lines on screen, the last one without its newline
        self._pending: list[str] = []

    def write(self, text: str) -> None:
        if self.raw:
            self.out.write(text)
            return
        done = self.lines.feed(text)
        pending = self.lines.pending() if self.live else []
        if not done and pending == self._pending:
            return  # nothing new to draw
        self._erase()
        self._pending = pending
        self.out.write("".join(line + "\n" for line in done))
        if pending:
            # A line wider than the terminal would wrap and the erase would miss its first
            # part: a moving line is shown cut to the width (its final state is written whole).
            width = max(20, shutil.get_terminal_size().columns - 1)
            self.out.write("\n".join(line[:width] for line in pending))
            self._shown = len(pending)

    def end(self, marker: str | None = None) -> None:
        """The stream ended (or its run did): show what was pending as it stands."""
        if not self.raw:
            self._erase()
            self.out.write("".join(line + "\n" for line in self.lines.flush()))
            self.lines = TerminalLines()
        if marker is not None:
            self.out.write(marker)

    def _erase(self) -> None:
        self._pending = []
        if self._shown:
            self.out.write(_ERASE_LINE + (_UP + _ERASE_LINE) * (self._shown - 1))
            self._shown = 0


def follow(
    client: Client,
    name: str,
    previous: bool,
    keep: bool,
    tail: int | None,
    interval: float = 0.5,
    out: TextIO | None = None,
    raw: bool = False,
) -> None:
    """Print the log from the start (or the last `tail` bytes); with `keep`, follow it and
    switch to the next run's log when the instance restarts. `raw`: the bytes as logged, else
    as a terminal shows them (vsup.logtext)."""
    out = out or sys.stdout
    isatty = getattr(out, "isatty", None)
    screen = _Screen(out, raw, live=keep and not previous and bool(isatty and isatty()))
    if tail is not None:
        chunk = client.logs(name, previous=previous, tail=tail)
    else:
        chunk = client.logs(name, previous=previous, offset=0)
    run = chunk["run"]
    while True:
        screen.write(chunk["text"])
        out.flush()
        if not chunk["eof"]:
            chunk = client.logs(name, previous=previous, offset=chunk["offset"])
            continue
        if not keep or previous:
            screen.end()
            out.flush()
            return
        time.sleep(interval)
        nxt = client.logs(name, offset=chunk["offset"])
        if nxt["run"] != run:
            # The instance restarted: finish nothing more of the old file, start the new one.
            screen.end(f"--- {name}: run {nxt['run']} ---\n")
            run = nxt["run"]
            nxt = client.logs(name, offset=0)
        chunk = nxt
