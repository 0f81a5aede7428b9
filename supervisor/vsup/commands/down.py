"""`vsup down [--yes]`: stop every instance, then the daemon; no process is left.

On a terminal it says what it will stop and asks first (`--yes` skips the question); without
one (scripts, CI) it goes ahead, saying what it does."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from vsup.states import IDLE, State

if TYPE_CHECKING:
    from vsup.control.client import Client
    from vsup.snapshot import StatusSnapshot


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "down",
        help="stop all instances, then the daemon",
        description="Stop every instance (SIGTERM to each process group, SIGKILL after the "
        "grace period), then the daemon. Instances a killed daemon left running are re-adopted "
        "first, so they are stopped too.",
    )
    p.add_argument("--yes", "-y", action="store_true", help="do not ask on a terminal")
    p.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        metavar="S",
        help="give up waiting for the daemon to exit after S seconds (default 300)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from vsup.commands.cliutil import run_command

    return run_command(_down, args)


def _down(args: argparse.Namespace) -> int:
    from vsup import paths
    from vsup.commands.cliutil import client_for_cli
    from vsup.control.client import Client
    from vsup.control.liveness import recorded_live_instances
    from vsup.control.lock import daemon_lock_holder

    home = paths.vsup_home()
    probe = Client(home)
    running = probe.alive() is not None
    probe.close()
    if not running and daemon_lock_holder(home) is None and not recorded_live_instances(home):
        print("vsup: nothing is running")
        return 0
    # A daemon that is not answering but holds the lock is still starting: connect waits.
    with client_for_cli() as client:
        daemon_pid = client.ping().pid
        what = _what_stops(client.status(), daemon_pid, home)
        if not args.yes and sys.stdin.isatty():
            print(f"vsup down stops {what}.", file=sys.stderr)
            if not confirm("Stop them? [y/N] "):
                print("vsup down: nothing was stopped", file=sys.stderr)
                return 1
        else:
            print(f"stopping {what}", flush=True)
        stopping = client.shutdown(stop_instances=True).stopping
        _watch_stopping(client, home, args.timeout)
    # The socket closes before the process ends; the lock is released only at exit.
    deadline = time.monotonic() + 30
    while daemon_lock_holder(home) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    _wait_gone(daemon_pid, deadline)
    leftover = recorded_live_instances(home)
    if leftover:
        print(f"vsup down: still running: {', '.join(leftover)}", file=sys.stderr)
        return 1
    if stopping:
        print(
            f"stopped {len(stopping)} instance{'s' if len(stopping) != 1 else ''}: "
            f"{', '.join(stopping)}"
        )
    print("the vsup daemon has exited")
    return 0


def _what_stops(doc: StatusSnapshot, daemon_pid: int, home: Path) -> str:
    """`2 instances (a, b), then the vsup daemon (pid 42) of HOME`."""
    live = [i.name for i in doc.instances if i.lifecycle.state != State.STOPPED]
    return (
        f"{len(live)} instance{'s' if len(live) != 1 else ''} ({', '.join(live)}), then "
        if live
        else "no instance is running; "
    ) + f"the vsup daemon (pid {daemon_pid}) of {home}"


def _watch_stopping(client: Client, home: Path, timeout: float) -> None:
    """Show what is still stopping until the daemon stops answering (CommandFailed after
    `timeout` seconds)."""
    from vsup.commands.cliutil import CommandFailed
    from vsup.control.errors import DaemonUnavailable
    from vsup.progress import Progress, fmt_duration

    progress = Progress()
    t0 = time.monotonic()
    while True:
        try:
            doc = client.status()
        except DaemonUnavailable:
            break
        left = [i.name for i in doc.instances if i.lifecycle.state not in IDLE]
        progress.update(
            f"[{fmt_duration(time.monotonic() - t0)}] stopping: "
            + (", ".join(left) if left else "the daemon")
        )
        if time.monotonic() - t0 > timeout:
            progress.clear()
            raise CommandFailed(
                f"vsup down: the daemon is still running after "
                f"{timeout:.0f} s (see {home / 'daemon.log'})"
            )
        time.sleep(0.2)
    progress.clear()


def confirm(prompt: str) -> bool:
    """Ask on the terminal; True only for an explicit yes (end of input is a no)."""
    print(prompt, end="", file=sys.stderr, flush=True)
    try:
        reply = sys.stdin.readline()
    except (OSError, KeyboardInterrupt):
        return False
    return reply.strip().lower() in ("y", "yes")


def _wait_gone(pid: int, deadline: float) -> None:
    """Wait (until `deadline`, monotonic) for process `pid` to end; a zombie counts as ended."""
    import psutil

    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        time.sleep(0.05)
