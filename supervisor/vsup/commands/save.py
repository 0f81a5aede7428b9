"""`vsup save FILE`: write the running layout as TOML (atomically; never an invalid one)."""

from __future__ import annotations

import argparse
import sys


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "save",
        help="write the running layout as TOML",
        description="Write the layout the daemon runs to FILE (temp file + rename). A layout "
        "that does not validate is never written.",
    )
    p.add_argument("file", metavar="FILE", help="where to write the layout")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from vsup.control.cliutil import client_for_cli, print_diagnostics, run_command
    from vsup.control.errors import ControlError

    def body(args: argparse.Namespace) -> int:
        with client_for_cli() as client:
            try:
                answer = client.save(args.file)
            except ControlError as exc:
                print(f"vsup save: {exc.message}", file=sys.stderr)
                print_diagnostics(exc.body.get("errors", []))
                return 2 if exc.status == 422 else 1
        print(f"saved the running layout to {answer['path']}")
        return 0

    return run_command(body, args)
