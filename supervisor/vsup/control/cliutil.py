"""Helpers the control-plane CLI commands share: connecting, and printing refusals."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any, TextIO

from vsup.control.client import Client, NoDaemon, connect
from vsup.control.errors import ControlError, DaemonUnavailable
from vsup.control.progress import Progress, fmt_duration


class CommandFailed(Exception):
    """Ends a command with a message on stderr and an exit status."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def client_for_cli(start: bool = True) -> Client:
    """A client of the daemon, starting one (with progress on a terminal) if none runs and
    `start`; read-only commands pass `start=False` and end with NoDaemon's message and exit
    status (3) when no daemon runs for this VSUP_HOME."""
    progress = Progress()
    doing = "starting" if start else "waiting for"
    try:
        return connect(
            start=start,
            on_wait=lambda t: progress.update(f"{doing} the vsup daemon ... {fmt_duration(t)}"),
        )
    except NoDaemon as exc:
        raise CommandFailed(f"vsup: {exc}", NoDaemon.EXIT_CODE) from None
    except DaemonUnavailable as exc:
        raise CommandFailed(f"vsup: {exc}") from None
    finally:
        progress.clear()


def run_command(func: Callable[[argparse.Namespace], int | None], args: argparse.Namespace) -> int:
    """Run `func(args)`, turning refusals and a missing daemon into a message and a status."""
    try:
        return int(func(args) or 0)
    except CommandFailed as exc:
        if str(exc):
            print(str(exc), file=sys.stderr)
        return exc.code
    except ControlError as exc:
        print(f"vsup: {exc.message}", file=sys.stderr)
        return 2 if exc.status in (400, 404, 422) else 1
    except DaemonUnavailable as exc:
        print(f"vsup: {exc}", file=sys.stderr)
        return 1


def print_diagnostics(items: list[Any], stream: TextIO | None = None) -> None:
    """Print validation errors/warnings (dicts from the API or layout Diagnostics)."""
    stream = stream or sys.stderr
    for item in items:
        if isinstance(item, dict):
            text = item.get("text") or item.get("message") or str(item)
        else:
            text = str(item)
        print(text, file=stream)
