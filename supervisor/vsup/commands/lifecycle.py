"""`vsup start|stop|restart NAME.. [--all]` and `vsup drain NAME`: lifecycle actions.

`@router` names the layout's vllm-router (start, stop, restart; it has no drain). Plain
`router` means it too when no instance has that name. `--all` is every instance, not the
router.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from vsup.states import State

if TYPE_CHECKING:
    from vsup.control.client import Client
    from vsup.snapshot import RouterStatus

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
        p.add_argument(
            "names", nargs="*", metavar="NAME", help="instance names; @router for the router"
        )
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


def resolve_targets(client: Client, names: list[str]) -> list[str]:
    """`names` with a plain `router` read as `@router` when no instance has that name."""
    from vsup.control.client import ROUTER

    if "router" not in names:
        return names
    doc = client.status()
    if any(i.name == "router" for i in doc.instances):
        return names
    if doc.router is None:
        from vsup.commands.cliutil import CommandFailed

        raise CommandFailed(
            "vsup: no instance is named 'router' and the running layout has no [router]", 2
        )
    return [ROUTER if n == "router" else n for n in names]


def run(args: argparse.Namespace) -> int:
    from vsup.commands.cliutil import CommandFailed, client_for_cli, run_command
    from vsup.control.client import ROUTER, check_target

    def body(args: argparse.Namespace) -> int:
        if not args.names and not args.all:
            raise CommandFailed(f"vsup {args.action}: name one or more instances, or --all", 2)
        if args.names and args.all:
            raise CommandFailed(f"vsup {args.action}: give names or --all, not both", 2)
        for name in args.names:
            check_target(name)  # before a daemon is started or asked
        if args.action == "drain" and args.names[0] == ROUTER:
            raise CommandFailed(
                "vsup drain: the router has no requests of its own to drain; "
                "`vsup restart @router` or `vsup stop @router`",
                2,
            )
        with client_for_cli() as client:
            args.names = resolve_targets(client, list(args.names))
            progress_note(args)
            answer = client.action(args.action, args.names, all=args.all)
            waiting = getattr(args, "wait", False)
            for name in answer.done:
                if args.action in ASKED and not waiting:
                    # The daemon took the request; the outcome (ready or failed) comes later.
                    print(f"{name}: {ASKED[args.action]} (not waited for; --wait waits for ready)")
                elif args.action in PAST:
                    print(f"{name}: {PAST[args.action]}")
            for err in answer.errors:
                print(f"vsup {args.action}: {err}", file=sys.stderr)
            if answer.errors:
                return 1
            if getattr(args, "wait", False) and answer.done:
                return wait_and_report(client, list(answer.done), args.timeout)
        return 0

    return run_command(body, args)


def progress_note(args: argparse.Namespace) -> None:
    if sys.stderr.isatty() and args.action in ("stop", "drain", "restart"):
        who = "every instance" if args.all else ", ".join(args.names)
        print(f"{args.action}: {who} ...", file=sys.stderr)


def wait_and_report(client: Client, names: list[str], timeout: float) -> int:
    """Wait for `names` to be ready; print the outcome; 0 when all are ready."""
    from vsup.control.client import ROUTER
    from vsup.progress import Progress, wait_ready

    ok = True
    if ROUTER in names:
        ok = wait_router(client, timeout)
        names = [n for n in names if n != ROUTER]
        if not names:
            return 0 if ok else 1
    ready, doc = wait_ready(client, names, timeout, Progress())
    ok = ok and ready
    by_name = {i.name: i for i in doc.instances}
    for name in names:
        inst = by_name.get(name)
        if inst is None:
            print(f"{name}: gone from the layout", file=sys.stderr)
            continue
        if inst.lifecycle.state == State.READY:
            print(f"{name}: ready")
        else:
            le = inst.lifecycle.last_exit
            why = f" (last exit: {le.reason})" if le is not None and le.reason else ""
            print(f"{name}: {inst.lifecycle.state}{why}", file=sys.stderr)
            for advice in doc.advice:
                # what to do about it (the daemon's advice: edit the layout, free a port...)
                if advice.instance == name and inst.lifecycle.state == State.FAILED:
                    print(f"  {advice.message}", file=sys.stderr)
    if not ok and all(by_name[n].lifecycle.state != State.FAILED for n in names if n in by_name):
        print(f"vsup: not ready after {timeout:.0f} s", file=sys.stderr)
    return 0 if ok else 1


def wait_router(client: Client, timeout: float, interval: float = 0.2) -> bool:
    """Wait for the router to serve (`ready`); print the outcome; True when it does."""
    import time

    deadline = time.monotonic() + timeout
    router: RouterStatus | None = None
    while time.monotonic() < deadline:
        router = client.status().router
        if router is not None and router.state in (State.READY, State.FAILED, State.STOPPED):
            break
        time.sleep(interval)
    state = router.state if router is not None else "gone"
    if state == State.READY:
        print("@router: ready")
        return True
    why = None
    if router is not None:
        why = router.failed_why or (router.last_exit.reason if router.last_exit else None)
    print(f"@router: {state}" + (f" ({why})" if why else ""), file=sys.stderr)
    return False
