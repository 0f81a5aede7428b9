"""`vsup events [--since 1h] [-f] [--instance NAME] [--json]`: the journal as a person reads it.

One line per event: local time, whose it is (an instance, `@router`, or `vsup` for the daemon
and the operator), and what happened in words with its reasons ("exited: killed by SIGKILL;
restart at once (failure 1)"). Transitions that other events already say (`state`, the
per-instance echo of an operator's action) are left out of the text; `--json` writes every
event as the journal holds it, one JSON object a line. The journal is read through the
daemon (`GET /v1/events`); like every read-only command this one never starts a daemon.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TextIO

from vsup.journalevents import ActionEvent, PullEvent, as_event
from vsup.journalevents import JournalEvent as Event

if TYPE_CHECKING:
    from vsup.control.client import Client

DEFAULT_SINCE = "24h"
PAGE = 1000  # events per request
# How far back the first look for `--since` reaches (in events); each miss reaches 4x further.
FIRST_STEP = 2000
FOLLOW_INTERVAL_S = 1.0
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|min|h|d|w)?\s*$")
_UNIT_S = {"s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "events",
        help="what happened: the journal, one line per event, in local time",
        description="The daemon's journal as a person reads it: starts, readiness, exits and "
        "their reasons, restarts, failures, drains, adoptions, the router, operator actions. "
        f"Default: the last {DEFAULT_SINCE}. Never starts a daemon (exit status 4 when none "
        "runs for this VSUP_HOME).",
    )
    p.add_argument(
        "--since",
        default=DEFAULT_SINCE,
        metavar="WHEN",
        help="how far back: 90s, 30m, 1h, 2d, a local time (2026-12-01 08:00, ISO), or 'all' "
        f"(default {DEFAULT_SINCE})",
    )
    p.add_argument("-f", "--follow", action="store_true", help="keep printing new events")
    p.add_argument(
        "--instance",
        metavar="NAME",
        help="only this instance's events (and operator actions naming it); @router: the router's",
    )
    p.add_argument(
        "--json", action="store_true", help="the events as the journal holds them, one a line"
    )
    p.set_defaults(func=run)


def parse_since(text: str, now: float | None = None) -> float | None:
    """Wall-clock seconds from `--since` (None: from the journal's start); ValueError when it
    is neither a duration, a time nor `all`."""
    now = time.time() if now is None else now
    if text.strip().lower() in ("all", "0"):
        return None
    m = _DURATION.match(text)
    if m:
        return now - float(m.group(1)) * _UNIT_S[m.group(2) or "s"]
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(
            f"--since {text!r}: write a duration (90s, 30m, 1h, 2d), a time "
            "(2026-12-01 08:00, local unless it has a zone) or 'all'"
        ) from None
    return when.timestamp()  # a naive time is local, as a person means it


def event_time(event: Event | Mapping[str, Any]) -> float | None:
    """An event's `t` (ISO 8601 UTC) as wall-clock seconds."""
    t = as_event(event).t
    if t is None:
        return None
    try:
        when = datetime.fromisoformat(t.replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


def subject(event: Event | Mapping[str, Any]) -> str:
    """Whose event it is: the instance, `@router`, or `vsup` (the daemon, the operator)."""
    ev = as_event(event)
    if ev.instance is not None:
        return ev.instance
    if ev.router is not None:  # the router's events carry its port
        return "@router"
    return "vsup"


def concerns(event: Event | Mapping[str, Any], name: str) -> bool:
    """Whether `--instance name` shows `event` (an operator's action naming it, a pull of its
    model included)."""
    ev = as_event(event)
    if subject(ev) == name:
        return True
    if isinstance(ev, PullEvent):
        names = ev.instances
    elif isinstance(ev, ActionEvent):
        names = ev.names
    else:
        return False
    return isinstance(names, list) and name in names


def describe(event: Event | Mapping[str, Any], urls: Mapping[str, str] | None = None) -> str | None:
    """What the event says, in words (its type's `describe`); None for one that is left out of
    the text."""
    return as_event(event).describe(urls)


def local_time(event: Event | Mapping[str, Any]) -> str:
    """The event's time as a person reads it here: `2026-12-01 21:13:55`, local."""
    t = event_time(event)
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t is not None else "?"


def render(
    event: Event | Mapping[str, Any], width: int, urls: Mapping[str, str] | None = None
) -> str | None:
    """The event's line: local time, whose, what; None when it is left out. What came from a
    layout, a log or a server (a name, an exit's last log line, a message) is made safe for a
    terminal (termtext.printable; `describe` makes its words safe): an escape sequence in it is
    shown, never sent."""
    from vsup.termtext import printable

    ev = as_event(event)
    words = ev.describe(urls)
    if words is None:
        return None
    return f"{local_time(ev)}  {printable(subject(ev).ljust(width))}  {words}"


def first_seq(client: Client, since_wall: float | None) -> int:
    """The seq to read from so that every event at or after `since_wall` is included: found by
    looking back further and further from the newest (the journal is in time order)."""
    if since_wall is None:
        return 0
    newest = client.events(since=2**62, limit=1).next
    step = FIRST_STEP
    while True:
        start = max(0, newest - step)
        page = client.events(since=start, limit=1).events
        t = event_time(page[0]) if page else None
        if start == 0 or (t is not None and t < since_wall):
            return start
        step *= 4


def worker_names(client: Client) -> dict[str, str]:
    """Router worker URL -> instance name, from the status (events hold URLs)."""
    router = client.json.status().get("router") or {}
    names = {w["url"]: w["name"] for w in router.get("workers") or () if w.get("url")}
    # wake on request: a holder stands in for a sleeping model (docs/sleep.md)
    names.update(
        {h["url"]: f"hold {h['model']}" for h in router.get("holders") or () if h.get("url")}
    )
    return names


def show(
    client: Client,
    since_wall: float | None,
    instance: str | None,
    as_json: bool,
    follow: bool,
    out: TextIO | None = None,
    interval: float = FOLLOW_INTERVAL_S,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Print the events; with `follow`, keep printing new ones until interrupted. Returns how
    many were printed."""
    out = out or sys.stdout
    urls = worker_names(client)
    width = max([8, len(instance or "")] + [len(n) for n in urls.values()])
    printed = 0
    seq = first_seq(client, since_wall)
    while True:
        nxt = seq
        while True:
            answer = client.events(since=nxt, limit=PAGE)
            for event in answer.events:
                t = event_time(event)
                if since_wall is not None and (t is None or t < since_wall):
                    continue
                if instance is not None and not concerns(event, instance):
                    continue
                line = (
                    json.dumps(event.to_json(), default=str)
                    if as_json
                    else render(event, width, urls)
                )
                if line is not None:
                    out.write(line + "\n")
                    printed += 1
            nxt = answer.next
            if len(answer.events) < PAGE:
                break
        out.flush()
        if not follow:
            return printed
        seq = nxt
        since_wall = None  # everything new counts from now on
        sleep(interval)


def run(args: argparse.Namespace) -> int:
    from vsup.commands.cliutil import CommandFailed, client_for_cli, run_command
    from vsup.control.client import check_target

    def body(args: argparse.Namespace) -> int:
        try:
            since_wall = parse_since(args.since)
        except ValueError as exc:
            raise CommandFailed(f"vsup events: {exc}", 2) from None
        instance = args.instance
        if instance is not None:
            check_target(instance)
        with client_for_cli(start=False) as client:
            if instance == "router":
                from vsup.commands.lifecycle import resolve_targets

                instance = resolve_targets(client, [instance])[0]
            try:
                show(client, since_wall, instance, args.json, args.follow)
            except BrokenPipeError:
                sys.stderr.close()
        return 0

    return run_command(body, args)
