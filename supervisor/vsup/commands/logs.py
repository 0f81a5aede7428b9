"""`vsup logs NAME [-f] [--previous]`: an instance's log, this run or the one before."""

from __future__ import annotations

import argparse
import sys
import time


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "logs",
        help="print an instance's log (this run, or --previous)",
        description="Print the log of the instance's current run, or of the run before it "
        "(--previous: what a crashed run said before it died).",
    )
    p.add_argument("name", metavar="NAME", help="instance name")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing what is appended")
    p.add_argument("--previous", action="store_true", help="the run before the current one")
    p.add_argument(
        "--tail",
        type=int,
        default=None,
        metavar="BYTES",
        help="start this many bytes before the end (at a line start)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from vsup.control.client import check_name
    from vsup.control.cliutil import client_for_cli, run_command

    def body(args: argparse.Namespace) -> int:
        check_name(args.name)  # before a daemon is started or asked
        with client_for_cli() as client:
            try:
                follow(client, args.name, args.previous, args.follow, args.tail)
            except BrokenPipeError:
                # `vsup logs x | head` closed the pipe: not an error.
                sys.stderr.close()
        return 0

    return run_command(body, args)


def follow(
    client, name: str, previous: bool, keep: bool, tail: int | None, interval: float = 0.5, out=None
) -> None:
    """Print the log from the start (or the last `tail` bytes); with `keep`, follow it and
    switch to the next run's log when the instance restarts."""
    out = out or sys.stdout
    if tail is not None:
        chunk = client.logs(name, previous=previous, tail=tail)
    else:
        chunk = client.logs(name, previous=previous, offset=0)
    run = chunk["run"]
    while True:
        out.write(chunk["text"])
        out.flush()
        if not chunk["eof"]:
            chunk = client.logs(name, previous=previous, offset=chunk["offset"])
            continue
        if not keep or previous:
            return
        time.sleep(interval)
        nxt = client.logs(name, offset=chunk["offset"])
        if nxt["run"] != run:
            # The instance restarted: finish nothing more of the old file, start the new one.
            out.write(f"--- {name}: run {nxt['run']} ---\n")
            run = nxt["run"]
            nxt = client.logs(name, offset=0)
        chunk = nxt
