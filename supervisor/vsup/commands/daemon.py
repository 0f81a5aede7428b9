"""`vsup daemon [--detach]`: run the daemon in the foreground (a service manager does this), or
start it in the background and return (`--detach`: what `vsup up` does before it applies)."""

from __future__ import annotations

import argparse
import json
import sys


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "daemon",
        help="run the vsup daemon (foreground; --detach: in the background, then return)",
        description="Run the daemon for VSUP_HOME in the foreground. Exits at once (status 0) "
        "when another daemon already serves this VSUP_HOME. SIGTERM stops the daemon and leaves "
        "the instances running; `vsup down` stops them. A starting daemon takes back what the "
        "last one left: the layout it ran, and the instances still running (re-adopted, same "
        "pid). --detach starts it in the background (if none runs) and returns once it answers: "
        "read-only commands (status, logs, events) never start one.",
    )
    p.add_argument(
        "--poll-interval",
        type=float,
        default=None,
        metavar="S",
        help="seconds between telemetry polls (default 1)",
    )
    p.add_argument(
        "--detach",
        action="store_true",
        help="start the daemon in the background if none runs and return once it answers: its "
        "ping answer as JSON on stdout (`vsup fleet up` starts a node's daemon over SSH this "
        "way), which daemon it is in words on stderr",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.detach:
        return detach(args)
    from vsup.control.daemon import run_daemon

    interval = 1.0 if args.poll_interval is None else args.poll_interval
    if not 0.05 <= interval <= 60:
        print("vsup daemon: --poll-interval must be between 0.05 and 60 seconds")
        return 2
    return run_daemon(poll_interval=interval)


def detach(args: argparse.Namespace) -> int:
    """Start the daemon in the background (or find the one running) and say which it is."""
    from vsup.commands.cliutil import client_for_cli, run_command
    from vsup.control.client import Client

    if args.poll_interval is not None:
        print(
            "vsup daemon: --poll-interval applies to a daemon run in the foreground, not --detach",
            file=sys.stderr,
        )
        return 2

    def body(args: argparse.Namespace) -> int:
        probe = Client()
        running = probe.alive()
        probe.close()
        with client_for_cli(start=True) as client:
            ping = client.ping()
        how = "already serves" if running else "started for"
        print(json.dumps(ping.to_json()))
        print(f"the vsup daemon (pid {ping.pid}) {how} VSUP_HOME={ping.home}", file=sys.stderr)
        return 0

    return run_command(body, args)
