"""`vsup rollout promote|abort`: end a canary's watch early (docs/canary.md).

`promote` lets the rollout go on at once as if the gate had passed the canary; `abort` rolls
the canary back to its old spec (drained, like a failed gate) and ends the rollout
`rolled_back`. Exit 0 when the watch was ended, 1 when no canary is being watched."""

from __future__ import annotations

import argparse
import sys


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "rollout",
        help="end a canary's watch: promote or abort",
        description="End the watch of a rolling apply's canary now (docs/canary.md): promote "
        "goes on with the other waves, abort puts the canary back on its old spec.",
    )
    p.add_argument("action", choices=("promote", "abort"), help="what the watch ends with")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from vsup.commands.cliutil import client_for_cli, run_command
    from vsup.control.errors import ControlError
    from vsup.termtext import printable

    def body(args: argparse.Namespace) -> int:
        with client_for_cli(start=False) as client:
            try:
                client.json.rollout(args.action)
            except ControlError as exc:
                print(f"vsup rollout: {printable(exc.message)}", file=sys.stderr)
                return 1
        if args.action == "promote":
            print("canary promoted: the rollout goes on (`vsup status` follows it)")
        else:
            print("canary aborted: it goes back to its old spec (`vsup status` follows it)")
        return 0

    return run_command(body, args)
