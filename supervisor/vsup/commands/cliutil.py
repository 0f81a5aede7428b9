"""Helpers the control-plane CLI commands share: connecting, ending with an exit status, and
printing refusals. The exit statuses and the map from errors to them are `exits.py`'s."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from vsup.commands.exits import NO_DAEMON, CommandFailed, known_error
from vsup.control.client import Client, NoDaemon, connect
from vsup.control.errors import DaemonUnavailable
from vsup.progress import Progress, fmt_duration

if TYPE_CHECKING:
    from vsup.layout.compiled import CompiledLayout
    from vsup.layout.diagnostics import Diagnostic

__all__ = ["CommandFailed", "client_for_cli", "compile_here", "print_diagnostics", "run_command"]


def client_for_cli(start: bool = True) -> Client:
    """A client of the daemon, starting one (with progress on a terminal) if none runs and
    `start`; read-only commands pass `start=False` and end with NoDaemon's message and exit
    status (`exits.NO_DAEMON`) when no daemon runs for this VSUP_HOME."""
    progress = Progress()
    doing = "starting" if start else "waiting for"
    try:
        return connect(
            start=start,
            on_wait=lambda t: progress.update(f"{doing} the vsup daemon ... {fmt_duration(t)}"),
        )
    except NoDaemon as exc:
        raise CommandFailed(f"vsup: {exc}", NO_DAEMON) from None
    except DaemonUnavailable as exc:
        raise CommandFailed(f"vsup: {exc}") from None
    finally:
        progress.clear()


def run_command(func: Callable[[argparse.Namespace], int | None], args: argparse.Namespace) -> int:
    """Run `func(args)`; an error vsup reports (a refusal, no daemon, `CommandFailed`) becomes
    its line on stderr and its exit status (`exits.known_error`). Anything else propagates to
    `cli.main`, which reports it as an internal error."""
    try:
        return int(func(args) or 0)
    except Exception as exc:
        known = known_error(exc)
        if known is None:
            raise
        code, message = known
        if message:
            print(message, file=sys.stderr)
        return code


def print_diagnostics(items: list[Any], stream: TextIO | None = None) -> None:
    """Print validation errors/warnings (dicts from the API or layout Diagnostics)."""
    stream = stream or sys.stderr
    for item in items:
        if isinstance(item, dict):
            text = item.get("text") or item.get("message") or str(item)
        else:
            text = str(item)
        print(text, file=stream)


def compile_here(path: Path) -> tuple[CompiledLayout | None, list[Diagnostic]]:
    """The layout file compiled in this process, before the daemon sees it: read once (a
    regular UTF-8 file of at most 1 MiB, not /dev/zero), checked against this node's GPUs
    (the telemetry probe). No module of the daemon is imported."""
    from vsup.layout.compiled import compile_file
    from vsup.telemetry.gpu import node_facts

    return compile_file(path, node_facts())
