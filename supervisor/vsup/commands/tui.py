"""`vsup` / `vsup tui [--readonly]`: attach the dashboard to this node's daemon.

Starts the daemon when none runs (the dashboard starts, stops and edits instances), except
with `--readonly` or `--screenshot`: watching never starts one, it says that none runs for
this VSUP_HOME (exit status 4). `q` detaches: the daemon and every instance keep running, and
`vsup` attaches again from any SSH session (the detach message says `VSUP_HOME=... vsup` when
the home is not the default one, which a plain `vsup` would not find).
"""

from __future__ import annotations

import argparse
import sys


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "tui",
        help="attach the dashboard (q detaches; instances keep running)",
        description="The live dashboard: instances, HBM, KV cache, preemptions, backend, logs. "
        "Keys are remappable in ~/.config/vsup/tui.toml [keymap] or VSUP_KEYMAP.",
    )
    parser.add_argument(
        "--readonly",
        action="store_true",
        help="watch only: keys that start, stop, edit or save are disabled",
    )
    parser.add_argument(
        "--refresh",
        type=float,
        default=1.0,
        metavar="S",
        help="seconds between refreshes (default 1, the daemon's own rate)",
    )
    parser.add_argument(
        "--screenshot",
        metavar="FILE.svg",
        help="render the dashboard headless, save it as SVG and exit",
    )
    parser.add_argument(
        "--size",
        default="160x45",
        metavar="COLSxROWS",
        help="terminal size for --screenshot (default 160x45)",
    )
    parser.add_argument(
        "--select", metavar="NAME", help="instance shown in the detail pane of --screenshot"
    )
    parser.set_defaults(func=run)


def _size(text: str) -> tuple[int, int] | None:
    cols, _, rows = text.lower().partition("x")
    if cols.isdigit() and rows.isdigit() and int(cols) >= 40 and int(rows) >= 12:
        return int(cols), int(rows)
    return None


def run(args: argparse.Namespace) -> int:
    from vsup.control.client import AsyncClient
    from vsup.tui.app import DashboardApp
    from vsup.tui.keymap import load_keymap

    try:
        keymap = load_keymap()
    except ValueError as exc:
        print(f"vsup tui: {exc}", file=sys.stderr)
        return 2
    if args.refresh <= 0:
        print("vsup tui: --refresh must be a positive number of seconds", file=sys.stderr)
        return 2
    screenshot = getattr(args, "screenshot", None)  # `vsup up` passes only readonly, refresh
    code = _connect(start=not (args.readonly or screenshot))
    if code is not None:
        return code
    if screenshot:
        return _screenshot(args, screenshot)
    from vsup.paths import attach_command

    app = DashboardApp(
        AsyncClient(),
        readonly=args.readonly,
        keymap=keymap,
        refresh_s=args.refresh,
        attach_command=attach_command(),
    )
    app.run()
    return app.return_code or 0


def _connect(start: bool) -> int | None:
    """A daemon answers (the dashboard that acts starts one): None; else why not, said on
    stderr, as the exit status."""
    from vsup.commands.exits import NO_DAEMON
    from vsup.control.client import NoDaemon, connect
    from vsup.control.errors import DaemonUnavailable

    try:
        connect(start=start).close()
    except NoDaemon as exc:
        print(f"vsup tui: {exc}", file=sys.stderr)
        return NO_DAEMON
    except DaemonUnavailable as exc:
        print(f"vsup tui: {exc}", file=sys.stderr)
        return 1
    return None


def _screenshot(args: argparse.Namespace, screenshot: str) -> int:
    """`--screenshot FILE`: the live dashboard saved as SVG; prints the file."""
    import asyncio

    from vsup.tui.shot import screenshot_live

    size = _size(args.size)
    if size is None:
        print(f"vsup tui: --size {args.size!r}: write COLSxROWS, at least 40x12", file=sys.stderr)
        return 2
    try:
        path = asyncio.run(screenshot_live(screenshot, size, select=args.select))
    except (TimeoutError, ValueError) as exc:
        print(f"vsup tui: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0
