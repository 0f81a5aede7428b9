"""`vsup up LAYOUT [--detach] [--wait] [--timeout S] [--yes] [--dry-run] [--all-at-once]
[--no-pull]`.

Compiles the layout here first, on this node's GPUs as the telemetry probe finds them (exit 2
with every error; nothing of the daemon is imported or started for a layout that does not
validate), prints the plan (what starts, restarts - in rolling waves or at once - and stops,
and per instance what changes, old -> new), applies the layout through the daemon (starting
one if needed), optionally waits until the rollout has ended and every instance is ready,
then opens the dashboard unless `--detach`.

Hub models not complete in the node's cache are pulled first, by the daemon (docs/pull.md):
the plan says so, the apply waits for the pulls (`--wait`, or a terminal without `--detach`,
show their progress here), then every instance starts from the local snapshot offline. A pull
that fails leaves its instances stopped with the reason (exit 1). `--no-pull` (or the layout's
`pull = false`) leaves models not in the cache to vLLM, as without vsup.

A plan that stops or restarts an instance that is serving, or the serving router (a `[router]`
change restarts it: its endpoint is down for a second or more, docs/router.md), needs consent:
on a terminal vsup asks; without one it refuses (exit 3, `EXIT_NOT_CONFIRMED`) and changes
nothing, unless `--yes`. This is what keeps a half-written or empty layout from silently
stopping the instances it leaves out. `--dry-run` prints the plan and changes nothing.

Exit status (`exits.py`): 0 done; 1 an instance failed, the rollout failed (or its canary was
rolled back) or --wait timed out; 2 the layout is not valid; 3 not confirmed (no terminal and
no --yes, or the answer was no).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from vsup.answers import ApplyAnswer, ApplyPlan, PullTarget
from vsup.commands.exits import BAD_INPUT, FAILED, INTERRUPTED, NOT_CONFIRMED, OK
from vsup.snapshot import PullStatus, RolloutStatus, StatusSnapshot
from vsup.states import SERVING, CanaryState, PullState, RolloutState, State

if TYPE_CHECKING:
    from vsup.control.client import Client

# `vsup up` refused because the plan stops or restarts serving instances and nobody confirmed.
EXIT_NOT_CONFIRMED = NOT_CONFIRMED
ROUTER = "@router"  # the router's name in the plan's consent and in the verbs
ROUTER_DOWN = ("restart", "stop")  # router plans that take its endpoint down
# How long a router restart leaves its endpoint down, measured with vllm-router 0.1.17 and two
# workers (python -m benchmarks.router_restart; docs/router.md, "What a router change costs").
ROUTER_GAP = "about 1-3 s"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "up",
        help="apply a layout: start new instances, restart changed ones, stop removed ones",
        description="Validate LAYOUT, start the daemon if none runs, apply the layout (start "
        "what is new, restart what changed, stop what was removed), then open the dashboard.",
    )
    p.add_argument("layout", metavar="LAYOUT", help="the layout TOML file")
    add_apply_options(p)
    p.set_defaults(func=run)


def add_apply_options(p: argparse.ArgumentParser) -> None:
    """The options of an apply: `vsup up`'s, and `vsup rollback`'s (the same rules)."""
    p.add_argument("--detach", "-d", action="store_true", help="do not open the dashboard")
    p.add_argument(
        "--wait",
        action="store_true",
        help="wait until every instance is ready (exit 1 if one fails or time runs out)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=1200.0,
        metavar="S",
        help="how long --wait waits (default 1200 s)",
    )
    p.add_argument(
        "--yes",
        "-y",
        action="store_true",
        help="do not ask before stopping or restarting serving instances (needed without a "
        "terminal when the plan does so; else exit 3)",
    )
    p.add_argument(
        "--dry-run", action="store_true", help="print the plan and change nothing (exit 0)"
    )
    p.add_argument(
        "--no-pull",
        action="store_true",
        help="do not pull hub models first: models complete in the cache still start from it, "
        "the others are left to vLLM (docs/pull.md)",
    )
    p.add_argument(
        "--all-at-once",
        action="store_true",
        help="restart every changed instance together instead of in rolling waves "
        "([layout] max_unavailable at a time, each drained and ready before the next)",
    )


def run(args: argparse.Namespace) -> int:
    from vsup.commands.cliutil import run_command

    return run_command(_up, args)


def _up(args: argparse.Namespace) -> int:
    from vsup.commands.cliutil import CommandFailed, client_for_cli, compile_here, print_diagnostics

    path = Path(args.layout).expanduser().absolute()
    compiled, diagnostics = compile_here(path)
    warnings = [d for d in diagnostics if not d.is_error]
    print_diagnostics(warnings)
    if compiled is None:
        print_diagnostics([d for d in diagnostics if d.is_error])
        raise CommandFailed(f"vsup up: {path} is not valid; nothing was changed", BAD_INPUT)
    with client_for_cli() as client:
        code, more = apply_and_follow(client, compiled.text, str(path), args)
    if not more or args.detach:
        return code
    return open_dashboard() or code


def apply_and_follow(
    client: Client,
    toml: str,
    path: str | None,
    args: argparse.Namespace,
    prog: str = "vsup up",
    warn: bool = False,
    rollback_of: int | None = None,
) -> tuple[int, bool]:
    """Apply `toml` as `vsup up` does (the plan, consent, pulls, rollout, `--wait`): its exit
    status, and whether the dashboard may open next (not after a `--dry-run` or failed
    pulls). `vsup rollback` applies a kept layout through it, with `warn` (the layout's
    warnings, from the daemon's dry run: `vsup up` printed them when it compiled the file)
    and `rollback_of` (the kept layout's seq: the journal's apply event says it is a
    rollback). Refusals raise CommandFailed."""
    answer = _plan_and_apply(client, toml, path, args, prog, warn, rollback_of)
    if answer is None:
        return OK, False
    plan = answer.plan or ApplyPlan()
    if plan.pull:
        # the daemon applies the layout once its pulls are done (control/pulls.py)
        code = follow_pulls(client, plan.pull, args)
        if code != 0:
            return code, False  # no dashboard: the pull's failure is the news
    return _after_apply(client, plan, args), True


def _plan_and_apply(
    client: Client,
    toml: str,
    path: str | None,
    args: argparse.Namespace,
    prog: str = "vsup up",
    warn: bool = False,
    rollback_of: int | None = None,
) -> ApplyAnswer | None:
    """The daemon's plan printed (and consent asked for; `warn`: the dry run's warnings too),
    then the apply's answer (`rollback_of` sent with it); None for a `--dry-run`. Refused
    layouts raise CommandFailed."""
    from vsup.commands.cliutil import CommandFailed, print_diagnostics
    from vsup.termtext import printable

    pull = not getattr(args, "no_pull", False)
    dry = client.apply(toml, path, dry_run=True, all_at_once=args.all_at_once, **_pull_kw(pull))
    if dry.errors:
        # The daemon checks against this node (GPU count) and what runs now.
        print_diagnostics(list(dry.errors))
        what = printable(path) if path else "the layout"
        raise CommandFailed(f"{prog}: {what} is not valid on this node; nothing changed", BAD_INPUT)
    if warn:
        print_diagnostics(list(dry.warnings))
    plan = dry.plan or ApplyPlan()
    serving = serving_names(client.status())
    print_plan(plan, serving)
    if args.dry_run:
        return None
    interrupts = interrupted(plan, serving)
    if interrupts and not args.yes:
        confirm(interrupts, prog)
    answer = _apply(client, toml, path, args.all_at_once, pull, rollback_of)
    if answer.errors:
        print_diagnostics(list(answer.errors))
        raise CommandFailed(f"{prog}: the daemon refused the layout", BAD_INPUT)
    print_diagnostics([w for w in answer.warnings if w not in dry.warnings])
    return answer


def _after_apply(client: Client, plan: ApplyPlan, args: argparse.Namespace) -> int:
    """Follow what the apply set going: its rolling restart, and with `--wait` the instances
    and the router until they serve."""
    from vsup.commands.lifecycle import wait_and_report

    code = 0
    if plan.rolling:
        print(
            f"rolling restart of {len(plan.rolling)} serving instance(s) under way"
            + ("" if args.wait else " (`vsup status` shows its progress)")
        )
    if args.wait:
        if plan.rolling:
            code = follow_rollout(client, args.timeout)
        names = [*plan.start, *plan.restart, *plan.update, *plan.unchanged]
        if code == 0:
            code = wait_and_report(client, names, args.timeout)
        if code == 0 and plan.router not in (None, "stop"):
            code = wait_router(client, args.timeout)
    return code


def _apply(
    client: Client,
    toml: str,
    path: str | None,
    all_at_once: bool,
    pull: bool,
    rollback_of: int | None,
) -> ApplyAnswer:
    """The apply itself. A daemon older than `rollback_of` refuses the key (a 400 naming it):
    the layout is applied without it (its journal then says a plain apply)."""
    from vsup.control.errors import ControlError

    if rollback_of is None:
        return client.apply(toml, path, all_at_once=all_at_once, **_pull_kw(pull))
    try:
        return client.apply(
            toml, path, all_at_once=all_at_once, rollback_of=rollback_of, **_pull_kw(pull)
        )
    except ControlError as exc:
        if exc.status != 400 or "'rollback_of'" not in str(exc):
            raise
    return client.apply(toml, path, all_at_once=all_at_once, **_pull_kw(pull))


def _pull_kw(pull: bool) -> dict[str, bool]:
    """`Client.apply`'s pull keyword, only when it is not the default (older test clients)."""
    return {} if pull else {"pull": False}


def follow_pulls(
    client: Client,
    pulls: Sequence[PullTarget],
    args: argparse.Namespace,
    interval: float = 0.5,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Show the daemon's pulls until they end (a bar on a terminal, lines on a pipe): 0 when
    all are done, 1 when one failed or --timeout passed. `--detach` without `--wait` only says
    that they run. Ctrl-C stops watching; the pulls go on in the daemon."""
    if args.detach and not args.wait:
        print(
            f"pulling {', '.join(p.label for p in pulls)} in the daemon; the instances start "
            "when it is done (`vsup status` shows the progress)"
        )
        return OK
    try:
        mine = _watch_pulls(client, {p.model for p in pulls}, args.timeout, interval, clock, sleep)
    except KeyboardInterrupt:
        print(
            "\nvsup up: stopped watching; the pull goes on in the daemon and the instances start "
            "when it is done (`vsup status`, the dashboard)",
            file=sys.stderr,
        )
        return INTERRUPTED
    if mine is None:
        print(f"vsup up: the pull did not end within {args.timeout:.0f} s", file=sys.stderr)
        return FAILED
    code = OK
    for p in mine:
        if p.state == PullState.DONE:
            print(f"pulled {p.model} ({p.snapshot})")
            _until_applied(client, p.instances, clock, sleep)
        else:
            why = p.message or p.reason or p.state
            print(
                f"vsup up: the pull of {p.model} failed ({p.reason}): {why}; "
                f"{', '.join(p.instances)} not started (`vsup up` again retries it)",
                file=sys.stderr,
            )
            code = FAILED
    return code


def _watch_pulls(
    client: Client,
    models: set[str],
    timeout: float,
    interval: float,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
) -> list[PullStatus] | None:
    """The pulls of `models` shown until none is pulling: how they ended (None when `timeout`
    passed first)."""
    import dataclasses

    from vsup.commands.pull import PullDisplay

    displays: dict[str, PullDisplay] = {}
    deadline = clock() + timeout
    try:
        while True:
            mine = [p for p in client.status().pulls if p.model in models]
            for p in mine:
                label = p.model + f" for {', '.join(p.instances)}"
                display = displays.setdefault(p.model, PullDisplay(label))
                display.update(dataclasses.asdict(p))
            if mine and all(p.state != PullState.PULLING for p in mine):
                return mine
            if clock() >= deadline:
                return None
            sleep(interval)
    finally:
        for d in displays.values():
            d.stop()


def _until_applied(
    client: Client,
    names: Iterable[str],
    clock: Callable[[], float],
    sleep: Callable[[float], None],
    limit_s: float = 10.0,
) -> None:
    """After a pull: until the daemon has applied the layout (its instances left `stopped`),
    so that what `--wait` reads next is the apply's, not the state before it."""
    end = clock() + limit_s
    while clock() < end:
        states = {i.name: i.lifecycle.state for i in client.status().instances}
        if all(states.get(n) != State.STOPPED for n in names):
            return
        sleep(0.2)


def wait_router(client: Client, timeout: float) -> int:
    """`--wait` with a router: until it serves every ready member (1 when it does not in
    `timeout` seconds)."""
    from vsup.routerview import router_line

    deadline = time.monotonic() + timeout
    while True:
        router = client.status().router
        if router is None:
            return 0
        members = [w for w in router.workers if w.wanted]
        if router.state == State.READY and all(w.in_router for w in members):
            print(router_line(router))
            return 0
        if router.state == State.FAILED or time.monotonic() > deadline:
            print(f"vsup up: the router does not serve: {router_line(router)}", file=sys.stderr)
            return 1
        time.sleep(0.2)


def serving_names(status: StatusSnapshot) -> set[str]:
    """Names of the instances that answer requests now (`@router` for a serving router)."""
    names = {i.name for i in status.instances if i.lifecycle.state in SERVING}
    if status.router is not None and status.router.state in SERVING:
        names.add(ROUTER)
    return names


def interrupted(plan: ApplyPlan, serving: set[str]) -> list[str]:
    """The serving instances the plan stops or restarts, in plan order; then `@router` when
    it stops or restarts a serving router (every request through it fails meanwhile)."""
    names = [n for n in (*plan.stop, *plan.restart) if n in serving]
    if plan.router in ROUTER_DOWN and ROUTER in serving:
        names.append(ROUTER)
    return names


def confirm(names: list[str], prog: str = "vsup up") -> None:
    """Ask on a terminal; refuse without one. Returns only when the operator said yes."""
    from vsup.commands.cliutil import CommandFailed

    what = ", ".join(n if n != ROUTER else f"{ROUTER} (the router)" for n in names)
    if not sys.stdin.isatty():
        raise CommandFailed(
            f"{prog}: this stops or restarts serving instances ({what}) and there is no "
            "terminal to confirm it; nothing was changed. Check the plan above, then run again "
            "with --yes",
            EXIT_NOT_CONFIRMED,
        )
    try:
        answer = input(f"stop or restart serving instances {what}? [y/N] ")
    except EOFError:
        answer = ""
    if answer.strip().lower() not in ("y", "yes"):
        raise CommandFailed(f"{prog}: not confirmed; nothing was changed", EXIT_NOT_CONFIRMED)


def describe_rollout(r: RolloutStatus) -> str:
    """'rollout wave 2/3: restarting b1 (1/3 done)'."""
    head = f"rollout wave {r.wave}/{r.waves}"
    if r.state == RolloutState.RUNNING:
        if r.canary_state == CanaryState.WATCHING:
            doing = f"watching canary {', '.join(r.canary)} for {r.canary_s:g} s"
        else:
            doing = f"restarting {', '.join(r.current)}" if r.current else "waiting"
        return f"{head}: {doing} ({r.done}/{r.total} done)"
    if r.state == RolloutState.FAILED:
        return f"rollout failed: {r.failure}"
    if r.state == RolloutState.ROLLED_BACK:
        return f"rollout rolled back: {r.failure}"
    return f"rollout {r.state} ({r.done}/{r.total} restarted)"


def follow_rollout(
    client: Client,
    timeout: float,
    interval: float = 0.2,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Print the rollout's progress (a line per change) until it ends; 1 if it failed or
    time ran out, else 0."""
    deadline = clock() + timeout
    shown = None
    while True:
        r = client.status().rollout
        if r is None:
            return 0
        line = describe_rollout(r)
        if line != shown:
            print(line, flush=True)
            shown = line
        if r.state != RolloutState.RUNNING:
            return 1 if r.state in (RolloutState.FAILED, RolloutState.ROLLED_BACK) else 0
        if clock() >= deadline:
            print(f"vsup up: the rollout did not end within {timeout:.0f} s", file=sys.stderr)
            return 1
        sleep(interval)


def print_plan(plan: ApplyPlan, serving: set[str] | None = None) -> None:
    """Say what applying will do, before it is done (serving instances marked)."""
    serving = serving or set()

    def names(found: Iterable[str]) -> str:
        return ", ".join(n + (" (serving)" if n in serving else "") for n in found)

    if plan.empty:
        print("the layout has no instances")
    for p in plan.pull:
        print(
            f"pull first: {p.label} into {p.cache_dir} "
            f"(for {', '.join(p.instances)}; nothing starts until it is there)"
        )
    if plan.start:
        print(f"start: {names(plan.start)}")
    waves = [n for n in plan.restart if n in plan.rolling]
    at_once = [n for n in plan.restart if n not in plan.rolling]
    if waves:
        print(f"restart (changed, rolling): {', '.join(waves)}")
    if at_once:
        print(f"restart (changed, at once): {names(at_once)}")
    if plan.stop:
        print(f"stop (removed): {names(plan.stop)}")
    if plan.update:
        print(f"update without restart: {', '.join(plan.update)}")
    if plan.unchanged:
        print(f"unchanged: {', '.join(plan.unchanged)}")
    line = router_plan_line(plan.router, ROUTER in serving)
    if line:
        print(line)
    for line in change_lines(plan):
        print(line)


def router_plan_line(router: str | None, serving: bool) -> str | None:
    """What the plan does to the router, in words (None: nothing to say)."""
    mark = " (serving)" if serving else ""
    if router == "restart":
        from vsup.layout.routerspec import ROUTER_STOP_GRACE_S

        return (
            f"router: restart (its settings changed){mark}:"
            f" its endpoint is down until the new router serves, {ROUTER_GAP}, longer while the "
            f"old one finishes the requests it is running (at most {ROUTER_STOP_GRACE_S:g} s, then "
            "they are cut); "
            "requests sent to it meanwhile fail (refused, or 503 until its workers are back). "
            "A change of its members alone needs no restart"
        )
    if router == "stop":
        return (
            f"router: stop (the layout has no [router]){mark}"
            ": every request to its endpoint fails from then on"
        )
    if router not in (None, "unchanged"):
        return f"router: {router}"
    return None


def change_lines(plan: ApplyPlan) -> list[str]:
    """`  a: args.max-model-len: 4096 -> 8192` for each key that changes, per instance that
    restarts, updates or starts with a new spec (the daemon masks secrets)."""
    from vsup.layout.changes import SpecChange

    out: list[str] = []
    for name, changes in plan.changes.items():
        if not out:
            out.append("changes:")
        for c in changes:
            out.append(f"  {name}: {SpecChange(str(c.key), c.old, c.new).format()}")
    return out


def open_dashboard() -> int:
    """Attach the dashboard (the TUI is imported only now: it is the heaviest import)."""
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        print(
            "vsup: not a terminal, so no dashboard; the instances keep running "
            "(`vsup status`, or `vsup up --detach` to say so)",
            file=sys.stderr,
        )
        return 0
    try:
        from vsup.commands import tui
    except ImportError:
        print(
            "vsup: the dashboard is not part of this build; the instances keep running "
            "(`vsup status` shows them)",
            file=sys.stderr,
        )
        return 0
    return int(tui.run(argparse.Namespace(readonly=False, refresh=1.0)) or 0)
