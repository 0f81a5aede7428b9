"""`vsup logs [NAME] [-f] [--previous] [--raw] [-n N]`: an instance's or the router's log,
this run or the one before; without NAME, every instance's and the router's, each line prefixed
with whose it is.

Shown as a terminal would show it (vsup.logtext): a progress bar at its last state, not one line
per redraw. Following one log on a terminal, the bar being drawn is redrawn in place at the
bottom; into a pipe (or following several), only finished lines are written. `--raw` writes the
bytes as logged. `-n N` / `--tail N` starts N lines before the end, as `tail -n` does.
`@router` names the layout's vllm-router (plain `router` too, when no instance has that name).
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, TextIO

from vsup.logtext import TerminalLines

if TYPE_CHECKING:
    from vsup.answers import LogChunk
    from vsup.control.client import Client

# Cursor to the start of the line and erase it; and one line up.
_ERASE_LINE = "\r\x1b[K"
_UP = "\x1b[A"
# Bytes asked for per line wanted when looking for the last N lines (grown until enough).
_BYTES_PER_LINE = 256
MAX_TAIL_BYTES = 1024 * 1024  # one answer of the logs route at most
# Lines of each log `vsup logs` without a name prints before following (as `tail`).
DEFAULT_ALL_LINES = 10
# How often following every log asks which instances there are (one may be added).
RESCAN_S = 5.0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "logs",
        help="print an instance's or the router's log; without NAME, every one, prefixed",
        description="Print the log of the instance's current run, or of the run before it "
        "(--previous: what a crashed run said before it died). @router is the router's log. "
        "Without NAME: the last lines of every instance's and the router's log, each line "
        "prefixed with its name (-f keeps following all of them).",
    )
    p.add_argument(
        "name",
        nargs="?",
        metavar="NAME",
        help="instance name, or @router; none: every instance and the router",
    )
    p.add_argument("-f", "--follow", action="store_true", help="keep printing what is appended")
    p.add_argument("--previous", action="store_true", help="the run before the current one")
    p.add_argument(
        "--raw",
        action="store_true",
        help="write the log as logged (every progress-bar redraw, escape codes)",
    )
    p.add_argument(
        "-n",
        "--tail",
        type=int,
        default=None,
        metavar="N",
        help="start N lines before the end (default: the whole run's log; without NAME, "
        f"{DEFAULT_ALL_LINES} of each)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from vsup.commands.cliutil import CommandFailed, client_for_cli, run_command
    from vsup.control.client import check_target

    def body(args: argparse.Namespace) -> int:
        if args.tail is not None and args.tail < 0:
            raise CommandFailed("vsup logs: -n/--tail takes a number of lines, 0 or more", 2)
        if args.name is not None:
            check_target(args.name)  # before the daemon is asked
        elif args.previous:
            raise CommandFailed("vsup logs: --previous needs an instance name (or @router)", 2)
        with client_for_cli(start=False) as client:
            try:
                if args.name is None:
                    follow_all(client, args.follow, args.tail, raw=args.raw)
                else:
                    name = resolve_name(client, args.name)
                    follow(client, name, args.previous, args.follow, args.tail, raw=args.raw)
            except BrokenPipeError:
                # `vsup logs x | head` closed the pipe: not an error.
                sys.stderr.close()
        return 0

    return run_command(body, args)


def resolve_name(client: Client, name: str) -> str:
    """A plain `router` means the router when no instance has that name."""
    if name != "router":
        return name
    from vsup.commands.lifecycle import resolve_targets

    return resolve_targets(client, [name])[0]


def tail_chunk(client: Client, name: str, previous: bool, lines: int) -> LogChunk:
    """The log's answer starting `lines` lines before its end (as `tail -n`): the tail in bytes
    grows until it holds that many lines or reaches the file's start."""
    want = max(1, lines) * _BYTES_PER_LINE
    while True:
        chunk = client.logs(name, previous=previous, tail=min(want, MAX_TAIL_BYTES))
        text = chunk.text
        have = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
        if have >= lines or not chunk.start or want >= MAX_TAIL_BYTES:
            break
        want *= 4
    if lines == 0:
        skip = len(text)
    else:
        kept = text.splitlines(keepends=True)[-lines:]
        skip = len(text) - len("".join(kept))
    dropped = text[:skip].encode("utf-8", errors="replace")
    return dataclasses.replace(chunk, start=(chunk.start or 0) + len(dropped), text=text[skip:])


class _Writer(Protocol):
    def write(self, text: str, /) -> object: ...

    def flush(self) -> object: ...


class _Screen:
    """Writes display lines; on a terminal the still-moving ones are redrawn in place."""

    def __init__(self, out: _Writer, raw: bool, live: bool) -> None:
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
    """Print the log from the start (or its last `tail` lines); with `keep`, follow it and
    switch to the next run's log when the instance restarts. `raw`: the bytes as logged, else
    as a terminal shows them (vsup.logtext)."""
    out = out or sys.stdout
    isatty = getattr(out, "isatty", None)
    screen = _Screen(out, raw, live=keep and not previous and bool(isatty and isatty()))
    if tail is not None:
        chunk = tail_chunk(client, name, previous, tail)
    else:
        chunk = client.logs(name, previous=previous, offset=0)
    run = chunk.run
    while True:
        screen.write(chunk.text)
        out.flush()
        if not chunk.eof:
            chunk = client.logs(name, previous=previous, offset=chunk.offset)
            continue
        if not keep or previous:
            screen.end()
            out.flush()
            return
        time.sleep(interval)
        nxt = client.logs(name, offset=chunk.offset)
        if nxt.run != run:
            # The instance restarted: finish nothing more of the old file, start the new one.
            screen.end(f"--- {name}: run {nxt.run} ---\n")
            run = nxt.run
            nxt = client.logs(name, offset=0)
        chunk = nxt


class _Prefixed:
    """A text stream that starts every line it is given with `prefix`."""

    def __init__(self, out: TextIO, prefix: str) -> None:
        self.out = out
        self.prefix = prefix
        self._at_start = True

    def write(self, text: str) -> None:
        for part in text.splitlines(keepends=True):
            if self._at_start:
                self.out.write(self.prefix)
            self.out.write(part)
            self._at_start = part.endswith("\n")

    def flush(self) -> None:
        self.out.flush()


@dataclass
class _Source:
    """One log being followed among several."""

    name: str
    prefixed: _Prefixed
    screen: _Screen
    run: int | None = None
    offset: int | None = None  # None: not read yet (no log so far)
    gone: bool = False


@dataclass
class _Sources:
    """Every instance's and the router's log, as the status says they are now."""

    out: TextIO
    raw: bool
    by_name: dict[str, _Source] = field(default_factory=dict)

    def refresh(self, names: list[str]) -> None:
        for name in names:
            if name not in self.by_name:
                prefixed = _Prefixed(self.out, "")
                self.by_name[name] = _Source(name, prefixed, _Screen(prefixed, self.raw, False))
        width = max((len(n) for n in names), default=0)
        for name, src in self.by_name.items():
            src.gone = name not in names
            src.prefixed.prefix = f"{name.ljust(width)} | "


def log_names(client: Client) -> list[str]:
    """Whose logs there are: every instance, then the router when the layout has one."""
    from vsup.control.client import ROUTER

    doc = client.status()
    names = [i.name for i in doc.instances]
    return names + ([ROUTER] if doc.router is not None else [])


def follow_all(
    client: Client,
    keep: bool,
    tail: int | None,
    interval: float = 0.5,
    out: TextIO | None = None,
    raw: bool = False,
    rescan_s: float = RESCAN_S,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """The last `tail` lines (default DEFAULT_ALL_LINES) of every instance's and the router's
    log, each line prefixed with its name; with `keep`, follow them all (a restarted instance's
    next run, an instance the layout gains) until interrupted."""
    out = out or sys.stdout
    lines = DEFAULT_ALL_LINES if tail is None else tail
    sources = _Sources(out, raw)
    sources.refresh(log_names(client))
    last_scan = clock()
    first = True
    while True:
        for src in list(sources.by_name.values()):
            if not src.gone:
                _read_source(client, src, lines if first else None)
        first = False
        out.flush()
        if not keep:
            for src in sources.by_name.values():
                src.screen.end()
            out.flush()
            return
        time.sleep(interval)
        if clock() - last_scan >= rescan_s:
            sources.refresh(log_names(client))
            last_scan = clock()


def _read_source(client: Client, src: _Source, lines: int | None) -> None:
    """Write what `src`'s log gained since it was last read: its last `lines` lines on the
    first read (None: all of it), the next run's from its start after a restart. A log not
    there (yet) is skipped: it is looked at again next time."""
    from vsup.control.errors import ControlError

    try:
        if src.offset is None:
            chunk = (
                tail_chunk(client, src.name, False, lines)
                if lines is not None
                else client.logs(src.name, offset=0)
            )
        else:
            chunk = client.logs(src.name, offset=src.offset)
            if chunk.run != src.run:
                src.screen.end(f"--- run {chunk.run} ---\n")
                chunk = client.logs(src.name, offset=0)
    except ControlError as exc:
        if exc.status == 404:
            return  # no log yet (or gone from the layout): looked at again later
        raise
    src.run = chunk.run
    src.screen.write(chunk.text)
    while not chunk.eof:
        chunk = client.logs(src.name, offset=chunk.offset)
        src.screen.write(chunk.text)
    src.offset = chunk.offset
