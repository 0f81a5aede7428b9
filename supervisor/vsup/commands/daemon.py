"""`vsup daemon`: run the daemon in the foreground (clients start it detached by themselves)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "daemon",
        help="run the vsup daemon in the foreground (internal; any command starts it)",
        description="Run the daemon for VSUP_HOME in the foreground. Exits at once (status 0) "
        "when another daemon already serves this VSUP_HOME. SIGTERM stops the daemon and leaves "
        "the instances running; `vsup down` stops them.",
    )
    p.add_argument(
        "--poll-interval",
        type=float,
        default=1.0,
        metavar="S",
        help="seconds between telemetry polls (default 1)",
    )
    p.add_argument(
        "--detach",
        action="store_true",
        help="start the daemon in the background if none runs, print its ping answer as JSON "
        "and exit (`vsup fleet up` starts a node's daemon over SSH this way)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from vsup.control.daemon import run_daemon

    if not 0.05 <= args.poll_interval <= 60:
        print("vsup daemon: --poll-interval must be between 0.05 and 60 seconds")
        return 2
    if args.detach:
        import json
        import sys

        from vsup.control.client import connect
        from vsup.control.errors import DaemonUnavailable

        try:
            with connect(start=True) as client:
                ping = client.ping()
        except DaemonUnavailable as exc:
            print(f"vsup daemon: {exc}", file=sys.stderr)
            return 1
        print(json.dumps(ping))
        return 0
    return run_daemon(poll_interval=args.poll_interval)
