"""The `vsup` command line (the contract is in DESIGN.md, "Command line").

Each command lives in its own module under `supervisor/vsup/commands/` with two functions:
`register(subparsers)` adds its parser (cheap: no heavy imports at module level) and
`run(args) -> int` does the work. Exit codes: 0 success, 1 "not all ready" (status) or a
failed operation, 2 bad input (usage, invalid layout).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from vsup import __version__

# command name -> module; order is the order of `vsup --help`.
COMMAND_MODULES = (
    "vsup.commands.plan",
    "vsup.commands.validate",
    "vsup.commands.up",
    "vsup.commands.tui",
    "vsup.commands.status",
    "vsup.commands.lifecycle",
    "vsup.commands.logs",
    "vsup.commands.save",
    "vsup.commands.probe",
    "vsup.commands.down",
    "vsup.commands.bench",
    "vsup.commands.daemon",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vsup",
        description="vLLM node supervisor: launch, watch and restart many vLLM servers.",
    )
    parser.add_argument("--version", action="version", version=f"vsup {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                continue  # a command not written yet
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if not argv or argv[0] in ("--readonly",):
        # bare `vsup` attaches the dashboard
        argv = ["tui", *argv]
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `vsup status | head`: the reader left; say nothing more, as a pipe tool should.
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
