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
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TextIO

from vsup.states import ExitReason, RolloutState

if TYPE_CHECKING:
    from vsup.control.client import Client

DEFAULT_SINCE = "24h"
PAGE = 1000  # events per request
# How far back the first look for `--since` reaches (in events); each miss reaches 4x further.
FIRST_STEP = 2000
FOLLOW_INTERVAL_S = 1.0
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|min|h|d|w)?\s*$")
_UNIT_S = {"s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
# Kinds whose words another event of the same moment already says.
_QUIET = frozenset({"state"})
_PULLS = ("pull_start", "pull_progress", "pull_done", "pull_failed")


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


def event_time(event: dict[str, Any]) -> float | None:
    """An event's `t` (ISO 8601 UTC) as wall-clock seconds."""
    t = event.get("t")
    if not isinstance(t, str):
        return None
    try:
        when = datetime.fromisoformat(t.replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


def subject(event: dict[str, Any]) -> str:
    """Whose event it is: the instance, `@router`, or `vsup` (the daemon, the operator)."""
    if isinstance(event.get("instance"), str):
        return event["instance"]
    if event.get("router") is not None:  # the router's events carry its port
        return "@router"
    return "vsup"


def concerns(event: dict[str, Any], name: str) -> bool:
    """Whether `--instance name` shows `event` (an operator's action naming it, a pull of its
    model included)."""
    if subject(event) == name:
        return True
    kind = event.get("kind")
    names = event.get("instances") if kind in _PULLS else event.get("names")
    return kind in ("action", *_PULLS) and isinstance(names, list) and name in names


def _s(value: Any) -> str:
    try:
        return f"{float(value):.1f} s"
    except (TypeError, ValueError):
        return "? s"


def _last_line(text: Any, limit: int = 160) -> str:
    if not isinstance(text, str) or not text.strip():
        return ""
    return text.strip().splitlines()[-1].strip()[:limit]


def _run(e: dict[str, Any]) -> str:
    """`run 3`; empty when the event has no run (a start refused before any process)."""
    return f"run {e['run']}" if e.get("run") is not None else ""


def _how_exited(e: dict[str, Any]) -> str:
    if e.get("signal"):
        return f"killed by {e['signal']}"
    if e.get("code") is not None:
        return f"exit code {e['code']}"
    if e.get("pid") is None:
        return "no process was started"
    return "status unknown (not vsup's child)"


def _plan_words(plan: Any) -> str:
    if not isinstance(plan, dict):
        return ""
    parts = [
        f"{what} {', '.join(plan[what])}"
        for what in ("start", "restart", "stop", "update")
        if plan.get(what)
    ]
    if plan.get("router") not in (None, "unchanged"):
        parts.append(f"router {plan['router']}")
    return "; ".join(parts) or "nothing to change"


Event = dict[str, Any]
Words = Callable[[Event, dict[str, str]], "str | None"]
# kind -> its words (None: left out of the text); each kind says itself in one small function
_WORDS: dict[str, Words] = {}


def _says(*kinds: str) -> Callable[[Words], Words]:
    def register(fn: Words) -> Words:
        for kind in kinds:
            _WORDS[kind] = fn
        return fn

    return register


def describe(event: Event, urls: dict[str, str] | None = None) -> str | None:
    """What the event says, in words; None for one that is left out of the text."""
    kind = event.get("kind")
    if kind in _QUIET:
        return None
    words = _WORDS.get(str(kind))
    if words is not None:
        return words(event, urls or {})
    keys = {k: v for k, v in event.items() if k not in ("seq", "t", "kind", "instance", "router")}
    return f"{kind}" + (f" {json.dumps(keys, default=str)[:200]}" if keys else "")


@_says("daemon_start")
def _daemon_start(e: Event, urls: dict[str, str]) -> str:
    return f"vsup daemon started (pid {e.get('pid')}, version {e.get('version')})"


@_says("daemon_stop")
def _daemon_stop(e: Event, urls: dict[str, str]) -> str:
    left = e.get("left_running") or []
    running = f"; left running: {', '.join(left)}" if left else ""
    return f"vsup daemon stopped (pid {e.get('pid')}){running}"


@_says("spawn")
def _spawn(e: Event, urls: dict[str, str]) -> str:
    return f"started run {e.get('run')} (pid {e.get('pid')})"


@_says("ready")
def _ready(e: Event, urls: dict[str, str]) -> str:
    return f"ready after {_s(e.get('startup_s'))} (run {e.get('run')}, pid {e.get('pid')})"


@_says("unhealthy")
def _unhealthy(e: Event, urls: dict[str, str]) -> str:
    status = f"HTTP {e['status']}" if e.get("status") is not None else "no answer"
    err = f", {e['error']}" if e.get("error") else ""
    rank = f", data-parallel rank {e['rank']} died" if e.get("rank") is not None else ""
    return f"unhealthy: /health failed {e.get('failures')} time(s) ({status}{err}{rank})"


@_says("exit")
def _exit(e: Event, urls: dict[str, str]) -> str:
    reason = e.get("reason") or "unknown"
    if reason == ExitReason.STOPPED:
        return f"stopped ({', '.join(x for x in (_run(e), _how_exited(e)) if x)})"
    how = ", ".join(x for x in (_how_exited(e), _run(e)) if x)
    said = _last_line(e.get("log_excerpt"))
    rank = f", data-parallel rank {e['rank']} died first" if e.get("rank") is not None else ""
    return f"exited: {reason} ({how}{rank})" + (f": {said}" if said else "")


@_says("restart_scheduled")
def _restart_scheduled(e: Event, urls: dict[str, str]) -> str:
    delay = float(e.get("delay_s") or 0)
    when = "at once" if delay <= 0 else f"in {delay:.0f} s"
    why = f"; {e['why']}" if e.get("why") else ""
    return f"restart {when} after {e.get('reason')} (failure {e.get('failures')}){why}"


@_says("failed")
def _failed(e: Event, urls: dict[str, str]) -> str:
    return f"FAILED ({e.get('reason')}, {e.get('failures')} failure(s)): {e.get('why')}"


@_says("memory_wait")
def _memory_wait(e: Event, urls: dict[str, str]) -> str:
    if e.get("done"):
        return f"GPU memory free after waiting {_s(e.get('waited_s'))}"
    return f"waits for GPU memory: {e.get('message')}"


@_says("sweep")
def _sweep(e: Event, urls: dict[str, str]) -> str:
    pids = ", ".join(str(p) for p in e.get("pids") or ())
    how = " with SIGKILL" if e.get("kill") else ""
    return f"ended what was left of run {e.get('run')}{how}: pids {pids}"


@_says("drain")
def _drain(e: Event, urls: dict[str, str]) -> str:
    if e.get("drained") is True:
        first = e.get("requests")
        had = f" ({int(first)} in flight at its start)" if first else ""
        return f"drained in {_s(e.get('waited_s'))}{had}"
    if e.get("drained") is False:
        return f"drain timed out after {_s(e.get('waited_s'))} with requests still running"
    return f"drain: running requests unknown after {_s(e.get('waited_s'))}"


@_says("stop")
def _stop(e: Event, urls: dict[str, str]) -> str | None:
    if e.get("kill"):
        return (
            f"stop: SIGKILL after the grace ({_s(e.get('waited_s'))} in all): it did not "
            "end on SIGTERM"
        )
    return None  # the exit event says it stopped


@_says("gpu_release")
def _gpu_release(e: Event, urls: dict[str, str]) -> str:
    gpus = ",".join(str(g) for g in e.get("gpus") or ())
    state = {True: "released", False: "NOT released", None: "unknown"}[e.get("released")]
    return f"GPU {gpus} memory {state} after {_s(e.get('waited_s'))}"


@_says("adopt")
def _adopt(e: Event, urls: dict[str, str]) -> str:
    if e.get("adopted"):
        return f"re-adopted run {e.get('run')} (pid {e.get('pid')}) from the last daemon"
    return f"not re-adopted (run {e.get('run')}): {e.get('why')}"


@_says("stalled")
def _stalled(e: Event, urls: dict[str, str]) -> str:
    from vsup.control.stalls import work_words

    ranks = e.get("ranks")
    work = work_words(
        e.get("evidence"),
        e.get("requests_running"),
        e.get("requests_waiting"),
        e.get("requests_in_flight"),
        tuple(ranks) if isinstance(ranks, list) else (),
    )
    return f"STALLED: {work}, no token for {_s(e.get('stalled_for_s'))}" + (
        "; restart.on_stall restarts it" if e.get("on_stall") else ""
    )


@_says("sleep")
def _sleep(e: Event, urls: dict[str, str]) -> str:
    held = e.get("held_after")
    kept = f", {held / 2**30:.1f} GiB still held" if isinstance(held, int) else ""
    trouble = f"; {e['error']}" if e.get("error") else ""
    return f"asleep (level {e.get('level')}) in {_s(e.get('took_s'))}{kept}: {e.get('why')}" + (
        trouble
    )


@_says("wake")
def _wake(e: Event, urls: dict[str, str]) -> str:
    cold = " (cold start: it was not running)" if e.get("cold") else ""
    return f"awake in {_s(e.get('took_s'))}{cold}: {e.get('why')}"


@_says("sleep_failed", "wake_failed")
def _sleep_failed(e: Event, urls: dict[str, str]) -> str:
    what = "sleep" if e.get("kind") == "sleep_failed" else "wake"
    return f"{what} FAILED ({e.get('why')}): {e.get('error')}"


@_says("group_wait")
def _group_wait(e: Event, urls: dict[str, str]) -> str:
    if e.get("done"):
        return f"its swap group let it start after {_s(e.get('waited_s'))}"
    return f"start waits for its swap group: {e.get('message')}"


@_says("router_workers")
def _router_workers(e: Event, urls: dict[str, str]) -> str:
    parts = []
    if e.get("add"):
        parts.append("added " + ", ".join(urls.get(u, u) for u in e["add"]))
    if e.get("remove"):
        parts.append("removed " + ", ".join(urls.get(u, u) for u in e["remove"]))
    why = f" ({e['why']})" if e.get("why") else ""
    return "workers: " + ("; ".join(parts) or "unchanged") + why


def _users(e: Event) -> str:
    users = ", ".join(str(u) for u in e.get("users") or ())
    return f"local users connected to its port: {users or 'none seen'}"


@_says("router_foreign_worker")
def _router_foreign(e: Event, urls: dict[str, str]) -> str:
    url = str(e.get("url"))
    return f"SOMEONE ELSE added worker {url}; removed it (removal {e.get('removals')}, {_users(e)})"


@_says("router_worker_removed")
def _router_removed(e: Event, urls: dict[str, str]) -> str:
    url = str(e.get("url"))
    name = urls.get(url, url)
    return (
        f"SOMEONE ELSE removed worker {name}; put it back (restore {e.get('restores')}, "
        f"{_users(e)})"
    )


# the one-liners: kind -> its words from the event's fields
_LINES: dict[str, Callable[[Event], str]] = {
    "removed": lambda e: "removed from the layout",
    "stop_incomplete": lambda e: f"processes outlived SIGKILL: {e.get('message')}",
    "stuck_gone": lambda e: "the processes that outlived SIGKILL are gone",
    "stall_restart": lambda e: f"restarting a stalled engine: {e.get('why')}",
    "stall_cleared": lambda e: f"no longer stalled ({e.get('why') or 'progress'})",
    "swap": lambda e: f"swapped in for {e.get('slept')} in {_s(e.get('took_s'))}",
    "rank_exit": lambda e: (
        f"data-parallel rank {e.get('rank')} (pid {e.get('pid')}) ended: {e.get('message')}"
    ),
    "problem": lambda e: f"problem ({e.get('problem')}): {e.get('message')}",
    "socket_rebound": lambda e: f"control socket bound again ({e.get('was') or 'it was gone'})",
    "error": lambda e: f"vsup error: {e.get('message')}",
}


def _one_line(line: Callable[[Event], str]) -> Words:
    return lambda e, urls: line(e)


_WORDS.update({kind: _one_line(line) for kind, line in _LINES.items()})


@_says(*_PULLS)
def _pull(e: Event, urls: dict[str, str] | None = None) -> str:
    """A hub model's pull (control/pulls.py) in the words `vsup status` uses (pullview)."""
    from vsup import pullview

    who = ", ".join(e.get("instances") or ())
    what = pullview.label(e) + (f" for {who}" if who else "")
    kind = e.get("kind")
    if kind == "pull_start":
        commit = f" (commit {str(e['commit'])[:12]})" if e.get("commit") else ""
        return (
            f"pull of {what} started: {e.get('files')} file(s), "
            f"{pullview.human_bytes(e.get('bytes_to_fetch'))} to fetch of "
            f"{pullview.human_bytes(e.get('bytes_total'))}{commit}"
        )
    if kind == "pull_progress":
        pct = pullview.percent(e)
        rate = f", {pullview.human_bytes(e['rate_bps'])}/s" if e.get("rate_bps") else ""
        return (
            f"pull of {what}: {pullview.human_bytes(e.get('bytes_done'))}/"
            f"{pullview.human_bytes(e.get('bytes_total'))}" + (f" ({pct})" if pct else "") + rate
        )
    if kind == "pull_done":
        return (
            f"pulled {what}: {pullview.human_bytes(e.get('fetched_bytes'))} fetched in "
            f"{pullview.duration(e.get('elapsed_s'))}, snapshot {e.get('snapshot')}"
        )
    return f"pull of {what} FAILED ({e.get('reason')}): {e.get('message')}"


@_says("action")
def _action(e: Event, urls: dict[str, str] | None = None) -> str | None:
    action = e.get("action")
    if e.get("by") == "operator":
        names = ", ".join(e.get("names") or ()) or "every instance"
        return f"operator: {action} {names}"
    if action == "apply":
        where = f" ({e['path']})" if e.get("path") else ""
        return f"operator: apply layout {e.get('layout') or '(unnamed)'}{where}: " + _plan_words(
            e.get("plan")
        )
    if action == "save":
        return f"operator: saved the running layout to {e.get('written') or e.get('path')}"
    if action == "shutdown":
        how = "stop every instance" if e.get("stop_instances", True) else "leave instances running"
        return f"operator: shut the daemon down ({how})"
    if e.get("automatic"):
        return "started again by vsup (it had exited while no daemon watched)"
    return None  # the engine's echo of an operator's action or an apply, said above


@_says("rollout")
def _rollout(e: Event, urls: dict[str, str] | None = None) -> str:
    state = e.get("state")
    head = (
        f"rollout {state}: wave {e.get('wave')}/{e.get('waves')}, "
        f"{e.get('done')}/{e.get('total')} done"
    )
    if state == RolloutState.RUNNING and e.get("current"):
        head += f", restarting {', '.join(e['current'])}"
    if e.get("failure"):
        head += f": {e['failure']}"
    return head


def local_time(event: dict[str, Any]) -> str:
    """The event's time as a person reads it here: `2026-12-01 21:13:55`, local."""
    t = event_time(event)
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t is not None else "?"


def render(event: dict[str, Any], width: int, urls: dict[str, str] | None = None) -> str | None:
    """The event's line: local time, whose, what; None when it is left out. What came from a
    layout, a log or a server (a name, an exit's last log line, a message) is made safe for a
    terminal (termtext.printable): an escape sequence in it is shown, never sent."""
    from vsup.termtext import printable

    words = describe(event, urls)
    if words is None:
        return None
    return f"{local_time(event)}  {printable(subject(event).ljust(width))}  {printable(words)}"


def first_seq(client: Client, since_wall: float | None) -> int:
    """The seq to read from so that every event at or after `since_wall` is included: found by
    looking back further and further from the newest (the journal is in time order)."""
    if since_wall is None:
        return 0
    newest = client.events(since=2**62, limit=1)["next"]
    step = FIRST_STEP
    while True:
        start = max(0, newest - step)
        page = client.events(since=start, limit=1)["events"]
        t = event_time(page[0]) if page else None
        if start == 0 or (t is not None and t < since_wall):
            return start
        step *= 4


def worker_names(client: Client) -> dict[str, str]:
    """Router worker URL -> instance name, from the status (events hold URLs)."""
    router = client.json.status().get("router") or {}
    return {w["url"]: w["name"] for w in router.get("workers") or () if w.get("url")}


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
            for event in answer["events"]:
                t = event_time(event)
                if since_wall is not None and (t is None or t < since_wall):
                    continue
                if instance is not None and not concerns(event, instance):
                    continue
                line = json.dumps(event, default=str) if as_json else render(event, width, urls)
                if line is not None:
                    out.write(line + "\n")
                    printed += 1
            nxt = answer["next"]
            if len(answer["events"]) < PAGE:
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
