"""`vsup start|stop|restart NAME.. [--all]` and `vsup drain NAME`: lifecycle actions."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from vsup.states import State

if TYPE_CHECKING:
    from vsup.control.client import Client

# What start and restart can truthfully say without --wait: the daemon only began them.
ASKED = {"start": "start requested", "restart": "restart requested"}
# stop and drain answer once nothing of the instance runs: their outcome is known.
PAST = {"stop": "stopped", "drain": "drained and stopped"}


def register(sub: argparse._SubParsersAction) -> None:
    for action, text in (
        ("start", "start stopped or failed instances"),
        ("stop", "stop instances (SIGTERM to the process group, SIGKILL after the grace period)"),
        ("restart", "stop then start instances (also clears a failed instance)"),
    ):
        p = sub.add_parser(action, help=text, description=text[0].upper() + text[1:] + ".")
        p.add_argument("names", nargs="*", metavar="NAME", help="instance names")
        p.add_argument("--all", action="store_true", help="every instance of the layout")
        if action in ("start", "restart"):
            p.add_argument("--wait", action="store_true", help="wait until they are ready")
            p.add_argument(
                "--timeout",
                type=float,
                default=900.0,
                metavar="S",
                help="give up waiting after S seconds (default 900)",
            )
        p.set_defaults(func=run, action=action)
    p = sub.add_parser(
        "drain",
        help="wait for running requests to finish (bounded), then stop the instance",
        description="Wait until the instance has no running request (up to its drain_timeout_s; "
        "stop routing to it first), then stop it.",
    )
    p.add_argument("names", nargs=1, metavar="NAME", help="instance name")
    p.set_defaults(func=run, action="drain", all=False)


def run(args: argparse.Namespace) -> int:
    from vsup.commands.cliutil import CommandFailed, client_for_cli, run_command
    from vsup.control.client import check_name

    def body(args: argparse.Namespace) -> int:
        if not args.names and not args.all:
            raise CommandFailed(f"vsup {args.action}: name one or more instances, or --all", 2)
        if args.names and args.all:
            raise CommandFailed(f"vsup {args.action}: give names or --all, not both", 2)
        for name in args.names:
            check_name(name)  # before a daemon is started or asked
        with client_for_cli() as client:
            progress_note(args)
            answer = client.action(args.action, args.names, all=args.all)
            waiting = getattr(args, "wait", False)
            for name in answer.get("done", ()):
                if args.action in ASKED and not waiting:
                    # The daemon took the request; the outcome (ready or failed) comes later.
                    print(f"{name}: {ASKED[args.action]} (not waited for; --wait waits for ready)")
                elif args.action in PAST:
                    print(f"{name}: {PAST[args.action]}")
            errors = answer.get("errors", ())
            for err in errors:
                text = err.get("error", err) if isinstance(err, dict) else err
                who = f"{err.get('name')}: " if isinstance(err, dict) and err.get("name") else ""
                print(f"vsup {args.action}: {who}{text}", file=sys.stderr)
            if errors:
                return 1
            if getattr(args, "wait", False) and answer.get("done"):
                return wait_and_report(client, list(answer["done"]), args.timeout)
        return 0

    return run_command(body, args)


def progress_note(args: argparse.Namespace) -> None:
    if sys.stderr.isatty() and args.action in ("stop", "drain", "restart"):
        who = "every instance" if args.all else ", ".join(args.names)
        print(f"{args.action}: {who} ...", file=sys.stderr)


def wait_and_report(client: Client, names: list[str], timeout: float) -> int:
    """Wait for `names` to be ready; print the outcome; 0 when all are ready."""
    from vsup.commands.progress import Progress, wait_ready

    ok, doc = wait_ready(client, names, timeout, Progress())
    by_name = {i["name"]: i for i in doc.get("instances", ())}
    for name in names:
        inst = by_name.get(name)
        if inst is None:
            print(f"{name}: gone from the layout", file=sys.stderr)
            continue
        if inst["state"] == State.READY:
            print(f"{name}: ready")
        else:
            le = inst.get("last_exit") or {}
            why = f" (last exit: {le['reason']})" if le.get("reason") else ""
            print(f"{name}: {inst['state']}{why}", file=sys.stderr)
    if not ok and all(by_name.get(n, {}).get("state") != State.FAILED for n in names):
        print(f"vsup: not ready after {timeout:.0f} s", file=sys.stderr)
    return 0 if ok else 1
