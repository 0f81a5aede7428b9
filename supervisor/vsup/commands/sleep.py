"""`vsup sleep NAME [--level N]`, `vsup wake NAME`, `vsup swap A B`: vLLM's sleep mode
(docs/sleep.md).

A sleeping instance keeps its process and gives its GPU memory back; it leaves the router first
and gets no request until it is awake again. `swap A B` puts A to sleep (its memory seen
released where the GPU telemetry sees it), then wakes B; if B does not come up, A is woken
again. Each waits for the outcome and prints how long it took. Naming the instance is the
consent, as for `vsup stop`. No daemon is started: with none running there is nothing to
sleep or wake.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from vsup.answers import SleepResult
from vsup.journalevents import phase_words


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sleep",
        help="put an instance to sleep (vLLM's sleep mode): it keeps its process, frees its GPU",
        description="Take the instance out of the router, let its running requests end, then "
        "put it to sleep: level 1 keeps its weights in host RAM (a wake takes seconds), level 2 "
        "drops them (a wake reloads them from disk). The instance needs a sleep table in the "
        "layout (docs/sleep.md).",
    )
    p.add_argument("name", metavar="NAME", help="instance name")
    p.add_argument(
        "--level",
        type=int,
        choices=(1, 2),
        help="1 or 2 (default: the layout's sleep.level)",
    )
    p.set_defaults(func=run, action="sleep")
    p = sub.add_parser(
        "wake",
        help="wake a sleeping instance (in a swap group the awake member sleeps first)",
        description="Wake the instance; it rejoins the router once it answers a request. In a "
        "swap group the member that is awake is put to sleep first.",
    )
    p.add_argument("name", metavar="NAME", help="instance name")
    p.set_defaults(func=run, action="wake", level=None)
    p = sub.add_parser(
        "swap",
        help="put A to sleep, then wake B (A wakes again if B does not)",
        description="Put A to sleep (its GPU memory seen released), then wake B. If B does "
        "not wake, A is woken again.",
    )
    p.add_argument("sleeper", metavar="A", help="the instance to put to sleep")
    p.add_argument("waker", metavar="B", help="the instance to wake")
    p.set_defaults(func=run, action="swap", level=None)


def run(args: argparse.Namespace) -> int:
    from vsup.commands.cliutil import client_for_cli, run_command
    from vsup.control.client import check_name

    def body(args: argparse.Namespace) -> int:
        names = [args.sleeper, args.waker] if args.action == "swap" else [args.name]
        for name in names:
            check_name(name)  # before the daemon is asked
        with client_for_cli(start=False) as client:
            answer = client.action(args.action, names, level=args.level)
        for err in answer.errors:
            print(f"vsup {args.action}: {err.name}: {err.error}", file=sys.stderr)
        if answer.errors:
            return 1
        print(describe(args.action, answer.result or SleepResult()))
        return 0

    return run_command(body, args)


def describe(action: str, result: SleepResult) -> str:
    """One line per outcome: `a: asleep (level 1) in 1.4 s, 1.7 GiB still held`. A wake in a
    swap group says first which member went to sleep for it."""
    if action == "wake" and result.group_slept:
        group = [
            describe("sleep", s) + " (its swap group's other member)" for s in result.group_slept
        ]
        return "\n".join([*group, describe("wake", dataclasses.replace(result, group_slept=()))])
    if action == "swap":
        slept, woke = result.slept or SleepResult(), result.woke or SleepResult()
        steps = phase_words(result.phases)
        took = f"swap took {result.took_s} s" + (f" ({steps})" if steps else "")
        return "\n".join([describe("sleep", slept), describe("wake", woke), took])
    name = result.instance or "?"
    if result.already:
        return f"{name}: already {'asleep' if action == 'sleep' else 'awake'}"
    if action == "sleep":
        held = result.held_bytes
        kept = f", {held / 2**30:.1f} GiB still held" if held is not None else ""
        return f"{name}: asleep (level {result.level}) in {result.took_s} s{kept}"
    how = " (it was not running: a cold start)" if result.cold else ""
    return f"{name}: awake in {result.took_s} s{how}"
