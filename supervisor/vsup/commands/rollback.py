"""`vsup rollback [SEQ] [--list] [up's options]`: apply the previous layout again, without its file.

The daemon keeps the texts of the last applied layouts (control/layouthistory.py). `vsup
rollback` goes back to the newest one whose text differs from the running layout's (so a second
`vsup rollback` returns to where the first one started), or to the one SEQ names (`--list` shows
them, newest first). It says which layout that is (its name, when it was applied, the file it
came from), then applies the kept text exactly as `vsup up FILE` would (`up.apply_and_follow`):
the same plan, the same consent (`--yes`, else a question on a terminal, else exit 3 and
nothing changed), a rolling restart, `--wait`/`--timeout`/`--detach`/`--dry-run` and exit
statuses. The file it came from is not read: it may have changed or be gone; its path only
places the layout's relative paths, as when it was applied. The apply carries the kept
layout's seq (`rollback_of`): the journal's apply event, and `vsup events`, say it is a
rollback ("rollback to layout #41 (applied 2026-12-06 01:02)").

Needs a running daemon (exit 4 without one: it holds the kept layouts and the running one);
exit 1 when there is no layout to go back to.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from vsup.commands.exits import FAILED, OK

if TYPE_CHECKING:
    from vsup.control.layouthistory import KeptLayout


def register(sub: argparse._SubParsersAction) -> None:
    from vsup.commands.up import add_apply_options

    p = sub.add_parser(
        "rollback",
        help="apply the previous layout again (rolling, with vsup up's consent rules)",
        description="Apply again the last layout applied before the running one (or the kept "
        "layout SEQ names), from the text the daemon kept: the plan and consent of `vsup up`.",
    )
    p.add_argument(
        "seq",
        nargs="?",
        type=int,
        metavar="SEQ",
        help="the kept layout to apply (its seq in `vsup rollback --list`); default: the "
        "newest one that differs from the running layout",
    )
    p.add_argument(
        "--list", action="store_true", help="list the kept layouts, newest first, and exit"
    )
    add_apply_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from vsup.commands.cliutil import run_command

    return run_command(_rollback, args)


def _rollback(args: argparse.Namespace) -> int:
    from vsup.commands.cliutil import CommandFailed, client_for_cli
    from vsup.commands.up import apply_and_follow, open_dashboard
    from vsup.control.layouthistory import KeptLayout, NoLayout, choose

    with client_for_cli(start=False) as client:
        doc = client.json.layouts()
        kept = [k for k in map(KeptLayout.from_json, doc.get("layouts") or []) if k is not None]
        running = doc.get("running")
        running = running if isinstance(running, str) else None
        if args.list:
            print_kept(kept, running)
            return OK
        try:
            target = choose(kept, running, args.seq)
        except NoLayout as exc:
            raise CommandFailed(f"vsup rollback: {exc}", FAILED) from None
        print(describe(target))
        code, more = apply_and_follow(
            client,
            target.toml,
            target.path,
            args,
            "vsup rollback",
            warn=True,
            rollback_of=target.seq,
        )
    if not more or args.detach:
        return code
    return open_dashboard() or code


def describe(k: KeptLayout) -> str:
    """'rolling back to layout prod (seq 41, applied 2026-12-06T01:02:03Z from /etc/a.toml)'."""
    from vsup.termtext import printable

    name = printable(k.name) if k.name else "(unnamed)"
    where = f" from {printable(k.path)}" if k.path else " (applied without a file)"
    when = f", applied {printable(k.t)}" if k.t else ""
    return f"rolling back to layout {name} (seq {k.seq}{when}{where})"


def print_kept(kept: list[KeptLayout], running: str | None) -> None:
    """The kept layouts, newest first; the running one and the default target marked."""
    from vsup.control.layouthistory import NoLayout, choose
    from vsup.termtext import printable

    if not kept:
        print("no layout was applied on this node yet", file=sys.stderr)
        return
    try:
        default: int | None = choose(kept, running).seq
    except NoLayout:
        default = None
    print(f"{'SEQ':>6}  {'APPLIED':<20}  {'NAME':<16}  FROM")
    for k in sorted(kept, key=lambda k: k.seq, reverse=True):
        mark = " (running)" if k.toml == running else ""
        mark += " <- vsup rollback" if k.seq == default else ""
        name = printable(k.name) if k.name else "(unnamed)"
        path = printable(k.path) if k.path else "-"
        print(f"{k.seq:>6}  {printable(k.t or '?'):<20}  {name:<16}  {path}{mark}")
