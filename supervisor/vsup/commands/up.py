"""`vsup up LAYOUT [--detach] [--wait] [--timeout S]`: apply a layout, then watch it.

Validates first (exit 2 with every error), says which instances will start, restart and stop,
applies the layout through the daemon (starting one if needed), optionally waits until every
instance is ready, then opens the dashboard unless `--detach`.
"""

from __future__ import annotations

import argparse
import sys


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "up",
        help="apply a layout: start new instances, restart changed ones, stop removed ones",
        description="Validate LAYOUT, start the daemon if none runs, apply the layout (start "
        "what is new, restart what changed, stop what was removed), then open the dashboard.",
    )
    p.add_argument("layout", metavar="LAYOUT", help="the layout TOML file")
    p.add_argument("--detach", "-d", action="store_true", help="do not open the dashboard")
    p.add_argument(
        "--wait",
        action="store_true",
        help="wait until every instance is ready (exit 1 if one fails or time runs out)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=1200.0,
        metavar="S",
        help="how long --wait waits (default 1200 s)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from vsup.control.cliutil import run_command

    return run_command(_up, args)


def _up(args: argparse.Namespace) -> int:
    from pathlib import Path

    from vsup.commands.lifecycle import wait_and_report
    from vsup.control.cliutil import CommandFailed, client_for_cli, print_diagnostics

    path = Path(args.layout).expanduser().absolute()
    from vsup.layout.files import UnreadableFile, read_text

    try:
        # The layout loader's reader: a regular UTF-8 file of at most 1 MiB (not /dev/zero).
        toml = read_text(path)
    except UnreadableFile as exc:
        raise CommandFailed(f"vsup up: {exc}", 2) from None
    errors, warnings = validate_locally(path)
    print_diagnostics(warnings)
    if errors:
        print_diagnostics(errors)
        raise CommandFailed(f"vsup up: {path} is not valid; nothing was changed", 2)

    with client_for_cli() as client:
        dry = client.apply(toml, str(path), dry_run=True)
        if dry.get("errors"):
            # The daemon checks against this node (GPU count) and what runs now.
            print_diagnostics(dry["errors"])
            raise CommandFailed(f"vsup up: {path} is not valid on this node; nothing changed", 2)
        print_plan(dry["plan"])
        answer = client.apply(toml, str(path))
        if answer.get("errors"):
            print_diagnostics(answer["errors"])
            raise CommandFailed("vsup up: the daemon refused the layout", 2)
        plan = answer["plan"]
        for w in answer.get("warnings", ()):
            if w not in dry.get("warnings", ()) and w not in warnings:
                print_diagnostics([w])
        code = 0
        if args.wait:
            keys = ("start", "restart", "update", "unchanged")
            names = [n for k in keys for n in plan.get(k, ())]
            code = wait_and_report(client, names, args.timeout)
    if args.detach:
        return code
    return open_dashboard() or code


def validate_locally(path) -> tuple[list, list]:
    """(errors, warnings) of the layout file, checked here before the daemon sees it."""
    from vsup.control.daemon import layout_diagnostics

    diags = layout_diagnostics(path)
    errors = [d for d in diags if getattr(d, "is_error", False)]
    warnings = [d for d in diags if not getattr(d, "is_error", False)]
    return errors, warnings


def print_plan(plan: dict) -> None:
    """Say what applying will do, before it is done."""
    words = (
        ("start", "start"),
        ("restart", "restart (changed)"),
        ("stop", "stop (removed)"),
        ("update", "update without restart"),
        ("unchanged", "unchanged"),
    )
    if not any(plan.get(k) for k, _ in words):
        print("the layout has no instances")
        return
    for key, label in words:
        if plan.get(key):
            print(f"{label}: {', '.join(plan[key])}")


def open_dashboard() -> int:
    """Attach the dashboard (the TUI is imported only now: it is the heaviest import)."""
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        print(
            "vsup: not a terminal, so no dashboard; the instances keep running "
            "(`vsup status`, or `vsup up --detach` to say so)",
            file=sys.stderr,
        )
        return 0
    try:
        from vsup.commands import tui
    except ImportError:
        print(
            "vsup: the dashboard is not part of this build; the instances keep running "
            "(`vsup status` shows them)",
            file=sys.stderr,
        )
        return 0
    return int(tui.run(argparse.Namespace(readonly=False, refresh=1.0)) or 0)
