"""`vsup save FILE [--parents]`: write the running layout as TOML (atomically; never an invalid
one; only a regular file: FIFOs, devices and directories are refused, a symlink's target is
replaced and the link kept; a missing directory is created only with --parents). Over an
existing layout file, its comments and formatting are kept (what cannot be kept is said on
stderr). The file is the layout applied; instances that still run an older spec (a rollout
not finished) are named in a warning on stderr."""

from __future__ import annotations

import argparse
import sys


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "save",
        help="write the running layout as TOML",
        description="Write the layout the daemon runs to FILE (temp file + rename). A layout "
        "that does not validate is never written. FILE must be a regular file or a new name "
        "(FIFOs, devices and directories are refused); when FILE is a symlink, its target is "
        "replaced and the link stays.",
    )
    p.add_argument("file", metavar="FILE", help="where to write the layout")
    p.add_argument(
        "--parents", action="store_true", help="create FILE's missing parent directories"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from vsup.commands.cliutil import client_for_cli, print_diagnostics, run_command
    from vsup.control.errors import ControlError

    def body(args: argparse.Namespace) -> int:
        with client_for_cli(start=False) as client:  # no daemon: no running layout to save
            try:
                answer = client.save(args.file, parents=args.parents)
            except ControlError as exc:
                print(f"vsup save: {exc.message}", file=sys.stderr)
                print_diagnostics(exc.body.get("errors", []))
                return 2 if exc.status in (400, 422) else 1
        written = answer.written or answer.path
        via = f" (through the symlink {answer.path})" if written != answer.path else ""
        kept = " (its comments and formatting kept)" if answer.kept_format else ""
        print(f"saved the running layout to {written}{via}{kept}")
        if answer.format_lost:
            print(f"vsup save: warning: {answer.format_lost}", file=sys.stderr)
        outdated = answer.outdated
        if outdated:
            from vsup.termtext import printable

            names = printable(", ".join(outdated))
            print(
                f"vsup save: warning: {names} still run(s) an older spec than this layout (a "
                f"rolling apply did not finish); `vsup up {printable(written)}` restarts them "
                "with it",
                file=sys.stderr,
            )
        return 0

    return run_command(body, args)
