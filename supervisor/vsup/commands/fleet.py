"""`vsup fleet [status|validate|up|rollback|events|prometheus-targets]`: every node from one
terminal.

Bare `vsup fleet` opens the fleet dashboard. The fleet file is `--fleet FILE`, else
`$VSUP_FLEET`, else `~/.config/vsup/fleet.toml` (docs/fleet.md). Nodes are reached over the
operator's own OpenSSH (`vsup.fleet.transport`). Exit status: 0 done (status: every node
reachable and every instance ready), 1 a node is down / not ready / failed, 2 bad input (the
fleet file, the layout, unknown nodes), 3 not confirmed (`fleet up` and `fleet rollback`, as
`vsup up`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections import Counter
from typing import TYPE_CHECKING, Any

from vsup.answers import ApplyPlan
from vsup.commands import exits
from vsup.states import NodeOutcome, RolloutState
from vsup.termtext import printable

if TYPE_CHECKING:
    from pathlib import Path

    from vsup.fleet.model import Fleet
    from vsup.fleet.view import NodeView


def _fleet_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--fleet",
        metavar="FILE",
        default=argparse.SUPPRESS,
        help="the fleet file (default $VSUP_FLEET, else ~/.config/vsup/fleet.toml)",
    )


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "fleet",
        help="every node of a fleet over SSH: dashboard, status, rollouts (docs/fleet.md)",
        description="The nodes of a fleet file, over the SSH you already use. Without a "
        "subcommand: the fleet dashboard (Enter opens a node's own dashboard).",
    )
    _fleet_arg(p)
    p.add_argument("--readonly", action="store_true", help="dashboard: watch only")
    p.add_argument(
        "--refresh", type=float, default=2.0, metavar="S", help="dashboard: seconds between polls"
    )
    p.set_defaults(func=run, fleet_command=None)
    fsub = p.add_subparsers(dest="fleet_command", metavar="SUBCOMMAND")

    for add in (
        _add_status,
        _add_validate,
        _add_up,
        _add_rollback,
        _add_down,
        _add_events,
        _add_targets,
    ):
        add(fsub).set_defaults(func=run)


def _add_status(fsub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """`vsup fleet status`'s arguments."""
    s = fsub.add_parser("status", help="one line per node (exit 1 if a node is down or not ready)")
    _fleet_arg(s)
    s.add_argument("--json", action="store_true", help='{"nodes": [{"name", "reachable", ...}]}')
    s.add_argument("--nodes", metavar="A,B", help="only these nodes")
    s.add_argument("--group", metavar="G", help="only this group's nodes")
    return s


def _add_validate(fsub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """`vsup fleet validate`'s arguments."""
    v = fsub.add_parser(
        "validate",
        help="check the fleet file, and a layout's servers across nodes (exit 2 with every error)",
    )
    _fleet_arg(v)
    v.add_argument(
        "layout",
        metavar="LAYOUT",
        nargs="?",
        help="also check this layout against the fleet and show each node's part of every "
        "instance with a span (docs/fleet.md)",
    )
    v.add_argument(
        "--check-nodes",
        action="store_true",
        help="also ask every node of each server across nodes which vLLM it runs (over SSH, "
        "read-only, as `fleet up` does) and check that it is the same; without it validate "
        "reads files only",
    )
    v.add_argument("--json", action="store_true", help="the fleet as JSON")
    return v


def _rolling_args(p: argparse.ArgumentParser, layout: str) -> None:
    """The options of a change rolled over nodes one at a time (`fleet up`, `fleet rollback`)."""
    p.add_argument("--nodes", metavar="A,B", help="these nodes, in this order")
    p.add_argument("--group", metavar="G", help="this group's nodes, in the fleet file's order")
    p.add_argument(
        "--yes", "-y", action="store_true", help="do not ask before interrupting serving instances"
    )
    p.add_argument("--dry-run", action="store_true", help="print each node's plan, change nothing")
    p.add_argument(
        "--timeout",
        type=float,
        default=1200.0,
        metavar="S",
        help=f"how long each node may take to serve {layout} (default 1200 s)",
    )


def _add_up(fsub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """`vsup fleet up LAYOUT`'s arguments."""
    u = fsub.add_parser(
        "up", help="apply a layout on nodes one at a time; stop at the first that fails"
    )
    _fleet_arg(u)
    u.add_argument("layout", metavar="LAYOUT", help="the layout TOML file")
    _rolling_args(u, "the layout")
    return u


def _add_rollback(fsub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """`vsup fleet rollback`'s arguments."""
    r = fsub.add_parser(
        "rollback",
        help="apply each node's previous layout again (`vsup rollback` on each), one node at a "
        "time; stop at the first that fails",
    )
    _fleet_arg(r)
    _rolling_args(r, "its layout")
    return r


def _add_down(fsub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """`vsup fleet down`'s arguments."""
    d = fsub.add_parser(
        "down", help="stop every instance and the daemon on nodes (each node's own `vsup down`)"
    )
    _fleet_arg(d)
    d.add_argument("--nodes", metavar="A,B", help="only these nodes")
    d.add_argument("--group", metavar="G", help="only this group's nodes")
    d.add_argument("--yes", "-y", action="store_true", help="do not ask on a terminal")
    d.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        metavar="S",
        help="how long each node may take to stop (default 300 s)",
    )
    return d


def _add_events(fsub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """`vsup fleet events`'s arguments."""
    e = fsub.add_parser("events", help="the nodes' journals merged by time")
    _fleet_arg(e)
    e.add_argument("-f", "--follow", action="store_true", help="keep following")
    e.add_argument(
        "-n", "--lines", type=int, default=10, metavar="N", help="last N events per node first"
    )
    e.add_argument("--json", action="store_true", help="one JSON event per line, with `node`")
    e.add_argument("--nodes", metavar="A,B", help="only these nodes")
    e.add_argument("--group", metavar="G", help="only this group's nodes")
    return e


def _add_targets(fsub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """`vsup fleet prometheus-targets`'s arguments."""
    t = fsub.add_parser(
        "prometheus-targets", help="Prometheus file_sd/http_sd targets of the nodes' exporters"
    )
    _fleet_arg(t)
    t.add_argument("-o", "--output", metavar="FILE", help="write FILE atomically (file_sd)")
    return t


def run(args: argparse.Namespace) -> int:
    from vsup.fleet.model import default_fleet_path, load_fleet

    path = getattr(args, "fleet", None) or default_fleet_path()
    fleet = load_fleet(path)
    for w in fleet.warnings:
        print(w.format(), file=sys.stderr)
    if not fleet.ok:
        for d in fleet.errors:
            print(d.format(), file=sys.stderr)
        print(f"vsup fleet: {fleet.path} is not valid", file=sys.stderr)
        return exits.BAD_INPUT
    command = args.fleet_command
    if command == "validate":
        return _validate(fleet, args)
    if command is None:
        return _dashboard(fleet, args)
    try:
        nodes = fleet.select(_names(getattr(args, "nodes", None)), getattr(args, "group", None))
    except KeyError as exc:
        print(f"vsup fleet: {exc.args[0]}", file=sys.stderr)
        return exits.BAD_INPUT
    if getattr(args, "nodes", None) and getattr(args, "group", None):
        print("vsup fleet: --nodes or --group, not both", file=sys.stderr)
        return exits.BAD_INPUT
    try:
        if command == "status":
            return asyncio.run(_status(fleet, nodes, args))
        if command == "up":
            return asyncio.run(_up(fleet, nodes, args))
        if command == "rollback":
            return asyncio.run(_rollback(fleet, nodes, args))
        if command == "down":
            return asyncio.run(_down(fleet, nodes, args))
        if command == "events":
            return asyncio.run(_events(fleet, nodes, args))
        if command == "prometheus-targets":
            return asyncio.run(_targets(fleet, nodes, args))
    except KeyboardInterrupt:
        return exits.INTERRUPTED
    raise AssertionError(command)


def _names(text: str | None) -> list[str]:
    return [n.strip() for n in (text or "").split(",") if n.strip()]


def _validate(fleet: Fleet, args: argparse.Namespace) -> int:
    from vsup.fleet.model import describe

    checked = _spans(fleet, args.layout) if getattr(args, "layout", None) else None
    if getattr(args, "check_nodes", False) and checked is None:
        print("vsup fleet validate: --check-nodes checks a layout: name one", file=sys.stderr)
        return exits.BAD_INPUT
    asked = None
    if getattr(args, "check_nodes", False) and checked is not None and checked[1]:
        try:
            asked = asyncio.run(_versions(fleet, checked[1]))
        except KeyboardInterrupt:
            return exits.INTERRUPTED
    if args.json:
        doc = describe(fleet)
        if checked is not None:
            doc["layout"] = _spans_json(*checked)
            if asked is not None:
                versions, check = asked
                doc["layout"]["vllm"] = {
                    "versions": versions,
                    "errors": list(check.bad),
                    "unreachable": list(check.unreachable),
                }
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        groups = ", ".join(f"{g} ({len(m)})" for g, m in fleet.groups.items()) or "none"
        print(f"{fleet.path}: {len(fleet.nodes)} node(s), groups: {groups}")
        if checked is not None:
            _print_spans(*checked)
        if asked is not None:
            _print_versions(*asked)
        elif checked is not None and checked[1]:
            print(
                "vLLM versions not checked (validate reads files only): --check-nodes asks "
                "each node, as `vsup fleet up` does"
            )
    if checked is not None and any(d.is_error for d in checked[2]):
        return exits.BAD_INPUT
    if asked is not None and not asked[1].ok:
        return exits.BAD_INPUT if asked[1].bad else exits.FAILED
    return exits.OK


async def _versions(fleet: Fleet, units: list[Any]) -> tuple[dict[str, str | None], Any]:
    """Every node of the layout's spans asked which vLLM it runs (`same_vllm`'s question):
    each node's version (None: none known or not asked) and the check of every span."""
    from vsup.fleet.query import FleetClient
    from vsup.fleet.units import vllm_versions

    names = {n for u in units for n in u.span.nodes}
    members = [n for n in fleet.nodes if n.name in names]
    async with FleetClient(fleet) as fc:
        answers = await fc.paths_all(members)
    versions: dict[str, str | None] = {}
    for n in members:
        answer = answers.get(n.name)
        version = answer.get("vllm_version") if isinstance(answer, dict) else None
        versions[n.name] = printable(version) if isinstance(version, str) and version else None
    return versions, vllm_versions([(u.name, u.span.nodes) for u in units], answers)


def _print_versions(versions: dict[str, str | None], check: Any) -> None:
    """The vLLM each span node runs (stdout) and what keeps a unit from starting (stderr)."""
    said = ", ".join(f"{n} {v or '?'}" for n, v in versions.items())
    print(f"vLLM on the nodes of its servers across nodes: {said}")
    for line in (*check.bad, *check.unreachable):
        print(f"vsup fleet validate: {line}", file=sys.stderr)


def _spans(fleet: Fleet, layout_path: str) -> tuple[str, list[Any], list[Any]]:
    """A layout checked for the fleet: (its file, the instances that span nodes, its
    diagnostics: as on any node, a model by relative path, each span node the fleet lacks)."""
    from pathlib import Path

    from vsup.layout.compiled import declared_spans, span_units
    from vsup.layout.model import load_layout
    from vsup.layout.span import fleet_problems

    layout = load_layout(Path(layout_path).expanduser().absolute())
    units, diagnostics = span_units(layout)
    said_of = {(d.instance, d.key) for d in diagnostics}
    relative = [
        d
        for d in ([] if layout.load_errors else relative_models(layout))
        if (d.instance, d.key) not in said_of  # a span's own rule said it
    ]
    problems = fleet_problems(
        declared_spans(layout),
        [n.name for n in fleet.nodes],
        str(fleet.path),
        layout.file,
        lambda i, node: layout.line("instance", i, "span", "ranks", node),
    )
    said = diagnostics + relative + problems
    ok = not any(d.is_error for d in said)
    return layout.file or layout_path, units if ok else [], said


def _spans_json(file: str, units: list[Any], said: list[Any]) -> dict[str, Any]:
    """`fleet validate LAYOUT --json`'s `layout`: its diagnostics and each span's members."""
    return {
        "file": file,
        "errors": [d.to_json() for d in said if d.is_error],
        "warnings": [d.to_json() for d in said if not d.is_error],
        "spans": [
            {
                "instance": u.name,
                "size": u.span.size,
                "head": u.span.head,
                "address": u.span.address,
                "rpc_port": u.span.rpc_port,
                # "data": ranks across nodes; "model": one TP/PP group (--nnodes, master_port)
                "across": u.span.across,
                "master_port": u.span.master_port if u.span.across == "model" else None,
                "members": [
                    {
                        "node": m.node,
                        "head": m.head,
                        "start_rank": m.start_rank,
                        "ranks": m.ranks,
                        "gpus": list(m.spec.gpus),
                        "argv": m.argv(),
                    }
                    for m in u.members()
                ],
            }
            for u in units
        ],
    }


def _print_spans(file: str, units: list[Any], said: list[Any]) -> None:
    """The layout's diagnostics on stderr; each span's nodes, their ranks and command lines."""
    import shlex

    from vsup.layout.span import MODEL, model_sizes

    for d in said:
        print(d.format(), file=sys.stderr)
    if any(d.is_error for d in said):
        print(f"vsup fleet validate: {printable(file)} is not valid", file=sys.stderr)
        return
    if not units:
        print(f"{printable(file)}: no instance spans nodes")
    for u in units:
        span = u.span
        if span.across == MODEL:
            sizes = model_sizes(u.spec.args, len(u.spec.gpus), len(span.ranks))
            group = (
                f"tensor parallel {sizes[0]} x pipeline parallel {sizes[1]}"
                if sizes is not None
                else "one tensor/pipeline parallel group"
            )
            what = f"{group} (--nnodes {len(span.ranks)}), head"
            port = span.master_port
        else:
            what = f"{span.size} data-parallel ranks, head"
            port = span.rpc_port
        print(
            f"{printable(file)}: instance {printable(u.name)}: one server over "
            f"{len(span.ranks)} nodes, {what} "
            f"{printable(span.head)} at {printable(span.address)}:{port}"
        )
        for m in u.members():
            line = printable(shlex.join(m.argv()))
            print(f"  {printable(m.node)} ({m.describe()}): {line}")


# -- status ----------------------------------------------------------------------------------


async def _status(fleet: Fleet, nodes: list, args: argparse.Namespace) -> int:
    from vsup.fleet.query import FleetClient, now_iso
    from vsup.fleet.units import MemberState

    async with FleetClient(fleet) as fc:
        views = await fc.status_all(nodes)
        units = fc.units
    if args.json:
        doc = {
            "fleet": fleet.name,
            "file": str(fleet.path),
            "at": now_iso(),
            "nodes": [v.to_json() for v in views],
            "units": [u.to_json() for u in units],
        }
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render_status(fleet, views))
        sys.stdout.write(render_units(units))
    ok = all(v.reachable and v.daemon and v.ready == v.total for v in views)
    ok = ok and all(u.state == MemberState.READY for u in units)
    return exits.OK if ok else exits.FAILED


def _cell(value: Any, fmt: str = "{}") -> str:
    return "-" if value is None else fmt.format(value)


def state_word(v: NodeView) -> str:
    if not v.reachable:
        return "DOWN"
    if not v.daemon:
        return "NO DAEMON"
    if v.rollout and v.rollout.startswith("running"):
        return "ROLLING"
    return "up" if v.ready == v.total else "DEGRADED"


STATUS_HEADER = (
    "NODE",
    "STATE",
    "GPUS",
    "READY",
    "ALERTS",
    "ROUTER",
    "TOK/S",
    "LAYOUT",
    "VSUP",
    "VLLM",
)


def render_status(fleet: Fleet, views: list[NodeView]) -> str:
    """The readable table: a header, one row per node, then why each down node is down."""
    reachable = sum(1 for v in views if v.reachable and v.daemon)
    ready = sum(v.ready or 0 for v in views)
    total = sum(v.total or 0 for v in views)
    head = f"fleet {fleet.name or fleet.path}: {reachable}/{len(views)} nodes answer, "
    head += f"{ready}/{total} instances ready"
    rows = [STATUS_HEADER, *(status_row(v) for v in views)]
    widths = [max(len(r[c]) for r in rows) for c in range(len(STATUS_HEADER))]
    lines = [head]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    for v in views:
        lines += status_notes(v)
    return "\n".join(lines) + "\n"


def status_row(v: NodeView) -> tuple[str, ...]:
    """A node's cells under STATUS_HEADER."""
    gpus = "-" if v.gpus is None else (f"{v.gpus}" + (f" {v.gpu_name}" if v.gpu_name else ""))
    if v.gpus == 0:
        gpus = "cpu"
    alerts = "-"
    if v.worst is not None:
        alerts = f"{v.alerts} {v.worst.severity}: {v.worst.kind}"
    router = "-" if not v.router else f"{v.router} {v.router_state or ''}".strip()
    return (
        v.name,
        state_word(v),
        gpus,
        "-" if v.total is None else f"{v.ready}/{v.total}",
        alerts,
        router,
        _cell(v.tokens_per_s, "{:.1f}"),
        v.layout or "-",
        v.vsup_version or "-",
        v.vllm_version or "-",
    )


UNIT_HEADER = ("SERVER", "STATE", "MEMBERS")


def render_units(units: list[Any]) -> str:
    """The servers across nodes, one row each (its state, then each member's node, ranks and
    state), then the advice of each that is not ready; nothing when there is none."""
    if not units:
        return ""
    rows = [UNIT_HEADER]
    for u in units:
        members = "; ".join(
            f"{m.node} ({'head, ' if m.head else ''}{m.where.split(' ', 1)[1]}) {m.state}"
            for m in u.members
        )
        rows.append((printable(u.instance), u.text, printable(members)))
    widths = [max(len(r[c]) for r in rows) for c in range(len(UNIT_HEADER))]
    lines = ["", "servers across nodes:"]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines += [f"{printable(u.instance)}: {u.advice}" for u in units if u.advice]
    return "\n".join(lines) + "\n"


def status_notes(v: NodeView) -> list[str]:
    """The lines under the table about a node: why it is down, its worst alert, its rollout."""
    lines = []
    if not (v.reachable and v.daemon):
        seen = f", last answer {v.last_seen}" if v.last_seen else ", never answered"
        what = "unreachable" if not v.reachable else "no daemon"
        lines.append(f"{v.name}: {what} since {v.since}{seen}: {v.error}")
    elif v.worst is not None and v.worst.severity in ("critical", "error"):
        who = f" ({v.worst.instance})" if v.worst.instance else ""
        lines.append(f"{v.name}: {v.worst.severity}{who}: {v.worst.message}")
    if v.rollout and v.rollout != RolloutState.DONE:
        lines.append(f"{v.name}: rollout {v.rollout}")
    return lines


# -- up --------------------------------------------------------------------------------------


async def _up(fleet: Fleet, nodes: list, args: argparse.Namespace) -> int:
    from pathlib import Path

    from vsup.fleet.query import FleetClient
    from vsup.fleet.rollout import plan_all, roll

    path = Path(args.layout).expanduser().absolute()
    read = _fleet_layout(path)
    if isinstance(read, int):
        return read
    toml, layout = read
    if not nodes:
        print("vsup fleet up: no nodes chosen", file=sys.stderr)
        return exits.BAD_INPUT
    together, spanning = span_nodes(layout, fleet, nodes)
    if spanning:
        for d in spanning:
            print(d.format(), file=sys.stderr)
        print(
            f"vsup fleet up: {path}'s server across nodes cannot start; nothing was changed",
            file=sys.stderr,
        )
        return exits.BAD_INPUT
    # a span's part depends on the node: each gets the layout with its own name
    texts = {n.name: with_node(toml, n.name) for n in nodes} if together else None
    async with FleetClient(fleet) as fc:
        if together:
            code = await same_vllm(fc, layout, [n for n in nodes if n.name in together])
            if code is not None:
                return code
        plans = await plan_all(fc, nodes, toml, texts)
        refused = _refusals(plans)
        if refused is not None:
            return refused
        for p in plans:
            runs = p.layout or "no layout"
            print(f"{p.node.name} (runs {runs}): {plan_line(p.plan or ApplyPlan(), p.serving)}")
        if args.dry_run:
            return exits.OK
        interrupts = {p.node.name: p.interrupts for p in plans if p.interrupts}
        if interrupts and not args.yes:
            code = confirm(interrupts)
            if code:
                return code
        order = " -> ".join(p.node.name for p in plans)
        print(f"rolling {layout.name or path.name} over {order}, one node at a time", flush=True)
        if together:
            print(f"a server across nodes starts on {', '.join(sorted(together))} at once")
        outcomes = await roll(
            fc,
            plans,
            toml,
            layout.name,
            args.timeout,
            lambda s: print(s, flush=True),
            together=together,
        )
    return _summary(outcomes)


async def _rollback(fleet: Fleet, nodes: list, args: argparse.Namespace) -> int:
    """Each node's own previous layout (`vsup rollback`'s choice on that node), planned on
    every node first (a node that cannot go back changes nothing anywhere), then applied node
    by node as `vsup fleet up` does."""
    from vsup.fleet.query import FleetClient
    from vsup.fleet.rollout import plan_rollbacks, roll

    if not nodes:
        print("vsup fleet rollback: no nodes chosen", file=sys.stderr)
        return exits.BAD_INPUT
    async with FleetClient(fleet) as fc:
        plans = await plan_rollbacks(fc, nodes, previous_layout)
        refused = _refusals(plans, "vsup fleet rollback", "go back", "go back")
        if refused is not None:
            return refused
        for p in plans:
            runs = p.layout or "no layout"
            back = rollback_words(p.target) if p.target is not None else "?"
            line = plan_line(p.plan or ApplyPlan(), p.serving)
            print(f"{p.node.name} (runs {runs}): back to {back}: {line}")
        if args.dry_run:
            return exits.OK
        interrupts = {p.node.name: p.interrupts for p in plans if p.interrupts}
        if interrupts and not args.yes:
            code = confirm(interrupts, "vsup fleet rollback")
            if code:
                return code
        order = " -> ".join(p.node.name for p in plans)
        print(f"rolling back {order}, one node at a time", flush=True)
        outcomes = await roll(fc, plans, "", None, args.timeout, lambda s: print(s, flush=True))
    return _summary(outcomes)


def previous_layout(doc: dict[str, Any]) -> Any:
    """The kept layout `vsup rollback` would apply on a node (its `GET /v1/layouts`); a
    ValueError saying why when there is none."""
    from vsup.control.layouthistory import KeptLayout, choose
    from vsup.fleet.rollout import Rollback

    kept = [k for k in map(KeptLayout.from_json, doc.get("layouts") or []) if k is not None]
    running = doc.get("running")
    k = choose(kept, running if isinstance(running, str) else None)  # NoLayout: a ValueError
    return Rollback(seq=k.seq, toml=k.toml, name=k.name, path=k.path, t=k.t)


def rollback_words(r: Any) -> str:
    """'layout alpha (seq 41, applied 2026-12-06T01:02:03Z from /etc/a.toml)'."""
    name = printable(r.name) if r.name else "(unnamed)"
    where = f" from {printable(r.path)}" if r.path else ""
    when = f", applied {printable(r.t)}" if r.t else ""
    return f"layout {name} (seq {r.seq}{when}{where})"


def _summary(outcomes: list[Any]) -> int:
    print("\nwhich node runs which layout:")
    for o in outcomes:
        note = {"applied": "serves it", "failed": f"FAILED: {o.why}", "untouched": "not changed"}
        print(f"  {o.node}: {o.layout or '(none)'} - {note.get(o.state, o.state)}")
    return exits.OK if all(o.state == NodeOutcome.APPLIED for o in outcomes) else exits.FAILED


async def _down(fleet: Fleet, nodes: list, args: argparse.Namespace) -> int:
    """Every chosen node's daemon stops its instances and exits (`POST /v1/shutdown`, as
    `vsup down` asks it), all nodes at once: a server across nodes goes down whole. On a
    terminal it asks first (`--yes` skips the question), as `vsup down` does."""
    import time

    from vsup.fleet.query import FleetClient
    from vsup.fleet.transport import NoDaemon

    if not nodes:
        print("vsup fleet down: no nodes chosen", file=sys.stderr)
        return exits.BAD_INPUT
    names = ", ".join(n.name for n in nodes)
    if not args.yes and sys.stdin.isatty():
        try:
            answer = input(f"stop every instance and the daemon on {names}? [y/N] ")
        except EOFError:
            answer = ""
        if answer.strip().lower() not in ("y", "yes"):
            print("vsup fleet down: not confirmed; nothing was stopped", file=sys.stderr)
            return exits.NOT_CONFIRMED

    async def one(fc: FleetClient, node: Any) -> str | None:
        try:
            answer, _ = await fc.call(node, lambda c: c.shutdown(), timeout=60)
        except NoDaemon:
            print(f"{node.name}: no daemon runs; nothing to stop", flush=True)
            return None
        except Exception as exc:
            return f"cannot ask it to stop: {exc}"
        stopping = ", ".join(answer.get("stopping") or ()) or "no instance"
        print(f"{node.name}: stopping {printable(stopping)}, then its daemon", flush=True)
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline:
            try:
                await fc.call(node, lambda c: c.ping(), timeout=fleet.timeout_s * 2)
            except NoDaemon:
                print(f"{node.name}: its daemon has exited", flush=True)
                return None
            except Exception:
                pass  # the daemon's socket closes before it exits: asked again
            await asyncio.sleep(0.5)
        return f"its daemon still runs after {args.timeout:.0f} s"

    async with FleetClient(fleet) as fc:
        failures = await asyncio.gather(*(one(fc, n) for n in nodes))
    for node, why in zip(nodes, failures, strict=True):
        if why is not None:
            print(f"{node.name}: FAILED: {why}", file=sys.stderr)
    return exits.OK if not any(failures) else exits.FAILED


def _fleet_layout(path: Path) -> tuple[str, Any] | int:
    """The layout file's text and its layout, or the exit status when it cannot go to the
    nodes (unreadable, not valid, models by relative paths), said on stderr."""
    from vsup.layout.files import UnreadableFile, read_text
    from vsup.layout.model import loads_layout

    try:
        toml = read_text(path)
    except UnreadableFile as exc:
        print(f"vsup fleet up: {exc}", file=sys.stderr)
        return exits.BAD_INPUT
    layout = loads_layout(toml, path)
    if layout.load_errors:
        for d in layout.load_errors:
            print(d.format(), file=sys.stderr)
        print(f"vsup fleet up: {path} is not valid; nothing was changed", file=sys.stderr)
        return exits.BAD_INPUT
    relative = relative_models(layout)
    if relative:
        for d in relative:
            print(d.format(), file=sys.stderr)
        print(
            f"vsup fleet up: {path} names models by relative paths; nothing was changed",
            file=sys.stderr,
        )
        return exits.BAD_INPUT
    return toml, layout


def _refusals(
    plans: list[Any],
    prog: str = "vsup fleet up",
    what: str = "take part",
    whole: str = "take the layout",
) -> int | None:
    """Say which node cannot take the layout and why; the exit status then, else None."""
    bad = False
    for p in plans:
        if p.error:
            print(f"{p.node.name}: cannot {what}: {printable(p.error)}", file=sys.stderr)
            bad = True
        for e in p.errors:
            print(f"{p.node.name}: {e}", file=sys.stderr)
            bad = True
    if not bad:
        return None
    print(f"{prog}: not every node can {whole}; nothing was changed", file=sys.stderr)
    return exits.BAD_INPUT if any(p.errors for p in plans) else 1


def span_nodes(layout: Any, fleet: Fleet, nodes: list[Any]) -> tuple[set[str], list[Any]]:
    """The nodes that run a part of a server across nodes (`span`), and the errors that keep
    `fleet up` from starting one: a node the fleet file lacks, or one not among the nodes
    chosen (a unit starts whole or not at all; docs/fleet.md, "One server across nodes")."""
    raw = layout.document.get("instance")
    tables = raw if isinstance(raw, list) else []
    if not any(isinstance(t, dict) and "span" in t for t in tables):
        return set(), []
    from vsup.layout.compiled import declared_spans  # the rules' weight: only for a span
    from vsup.layout.diagnostics import ERROR, Diagnostic
    from vsup.layout.span import fleet_problems, span_node_key

    declared = declared_spans(layout)
    problems = fleet_problems(
        declared,
        [n.name for n in fleet.nodes],
        str(fleet.path),
        layout.file,
        lambda i, node: layout.line("instance", i, "span", "ranks", node),
    )
    chosen = {n.name for n in nodes}
    members: set[str] = set()
    for d in declared:
        members.update(d.span.nodes)
        for node in d.span.nodes:
            if node in chosen or node not in {n.name for n in fleet.nodes}:
                continue
            problems.append(
                Diagnostic(
                    ERROR,
                    f"node '{node}' runs part of this server and is not among the nodes chosen "
                    f"({', '.join(sorted(chosen))}): a server across nodes starts on all its "
                    "nodes at once; choose them all (or no --node/--group)",
                    file=layout.file,
                    line=layout.line("instance", d.index, "span", "ranks", node),
                    instance=d.name,
                    key=span_node_key(d.span, node),  # `span.nodes` for a group across nodes
                )
            )
    return members, problems


async def same_vllm(fc: Any, layout: Any, members: list[Any]) -> int | None:
    """Every node of each span asked which vLLM it runs, before any node is touched: the exit
    status when they differ, one has none known (2) or cannot be asked (1), said on stderr;
    None when every unit may start (docs/fleet.md, "Started through each node's daemon")."""
    from vsup.fleet.units import vllm_versions
    from vsup.layout.compiled import declared_spans

    answers = await fc.paths_all(members)
    check = vllm_versions([(d.name, d.span.nodes) for d in declared_spans(layout)], answers)
    if check.ok:
        return None
    for line in (*check.bad, *check.unreachable):
        print(f"vsup fleet up: {line}", file=sys.stderr)
    print("vsup fleet up: a server across nodes cannot start; nothing was changed", file=sys.stderr)
    return exits.BAD_INPUT if check.bad else exits.FAILED


def with_node(toml: str, node: str) -> str:
    """The layout's text with `[layout] node = NODE`: which node it is applied on, so the
    node's daemon runs its own part of a span (layout/compiled.py)."""
    import tomlkit

    doc = tomlkit.parse(toml)
    table = doc.get("layout")
    if table is None:
        table = tomlkit.table()
        doc["layout"] = table
    table["node"] = node
    return tomlkit.dumps(doc)


def relative_models(layout: Any) -> list[Any]:
    """The layout's models written as paths relative to its directory (or, without `./`, naming
    a directory there): the nodes get the layout as text, so nothing is beside it there."""
    from vsup.layout.diagnostics import ERROR, Diagnostic
    from vsup.layout.modelpath import is_local_model

    out = []
    raw = layout.document.get("instance")
    tables: list[tuple[Any, tuple[Any, ...]]] = [(layout.defaults, ("defaults",))]
    tables += [(t, ("instance", i)) for i, t in enumerate(raw if isinstance(raw, list) else [])]
    for table, where in tables:
        model = table.get("model") if isinstance(table, dict) else None
        if not isinstance(model, str) or model.startswith(("/", "~")):
            continue
        if is_local_model(model) or (layout.base_dir / model).is_dir():
            name = table.get("name") if where[0] == "instance" else None
            out.append(
                Diagnostic(
                    ERROR,
                    f"model '{model}' is a path relative to the layout's directory, which the "
                    "nodes do not have (the layout is sent as text): a fleet layout needs "
                    "absolute paths (the same on every node) or hub ids",
                    file=layout.file,
                    line=layout.line(*where, "model"),
                    instance=name if isinstance(name, str) else None,
                    key="model",
                    table=None if where[0] == "instance" else "[defaults]",
                )
            )
    return out


def plan_line(plan: ApplyPlan, serving: set[str]) -> str:
    """`start: a; restart (rolling): b (serving); stop: c (serving)`."""
    parts = []
    rolling = set(plan.rolling)
    for key, label in (
        ("start", "start"),
        ("restart", "restart"),
        ("stop", "stop"),
        ("update", "update"),
    ):
        names = getattr(plan, key)
        if names:
            shown = ", ".join(n + (" (serving)" if n in serving else "") for n in names)
            if key == "restart" and rolling:
                label += " (rolling)"
            parts.append(f"{label}: {shown}")
    if plan.unchanged:
        parts.append(f"unchanged: {', '.join(plan.unchanged)}")
    router = plan.router
    if router not in (None, "unchanged"):
        # a restart or stop takes the node's router endpoint down (docs/router.md)
        parts.append(f"router: {router}" + (" (serving)" if "@router" in serving else ""))
    return "; ".join(parts) or "nothing to do"


def confirm(interrupts: dict[str, list[str]], prog: str = "vsup fleet up") -> int:
    """0 when the operator said yes on a terminal; exits.NOT_CONFIRMED otherwise."""
    what = "; ".join(
        f"{node}: {', '.join(n if n != '@router' else '@router (the router)' for n in names)}"
        for node, names in interrupts.items()
    )
    if not sys.stdin.isatty():
        print(
            f"{prog}: this stops or restarts serving instances ({what}) and there is no "
            "terminal to confirm it; nothing was changed. Check the plans above, then run again "
            "with --yes",
            file=sys.stderr,
        )
        return exits.NOT_CONFIRMED
    try:
        answer = input(f"stop or restart serving instances ({what})? [y/N] ")
    except EOFError:
        answer = ""
    if answer.strip().lower() not in ("y", "yes"):
        print(f"{prog}: not confirmed; nothing was changed", file=sys.stderr)
        return exits.NOT_CONFIRMED
    return exits.OK


# -- events ----------------------------------------------------------------------------------


# The width of the WHO column (instance, @router or vsup) of `vsup fleet events`.
WHO_WIDTH = 10


def event_line(ev: dict[str, Any], width: int) -> str | None:
    """One node's journal event as `vsup events` says it (its words, local time), with the
    node after the time: `2026-12-01 21:13:55  gpu01  a           ready after 31.2 s (...)`.
    None for an event `vsup events` leaves out (a `state` change other events already say)."""
    from vsup.commands.events import describe, local_time, subject

    words = describe(ev)
    if words is None:
        return None
    node, who = printable(ev.get("node", "?")).ljust(width), printable(subject(ev)).ljust(WHO_WIDTH)
    return f"{local_time(ev)}  {node}  {who}  {printable(words)}"


async def _events(fleet: Fleet, nodes: list, args: argparse.Namespace) -> int:
    from vsup.fleet.events import Merger
    from vsup.fleet.query import FleetClient

    width = max(len(n.name) for n in nodes)

    def note(text: str) -> None:
        print(f"vsup fleet events: {printable(text)}", file=sys.stderr, flush=True)

    async with FleetClient(fleet) as fc:
        merger = Merger(fc, nodes)
        tail = max(0, args.lines)
        while True:
            fresh = {name for name, nxt in merger.next.items() if nxt is None}
            # In words, `-n N` is the last N lines per node: the events left out (`state`) are
            # about half of a journal, so a node's first read reaches 4 N events back.
            events = await merger.round(tail if args.json else tail * 4, note)
            lines = [(ev, json.dumps(ev) if args.json else event_line(ev, width)) for ev in events]
            skip = Counter(ev.get("node") for ev, line in lines if line is not None)
            for node in skip:
                skip[node] = max(0, skip[node] - tail) if node in fresh and not args.json else 0
            for ev, line in lines:
                if line is None:
                    continue
                if skip[ev.get("node")] > 0:
                    skip[ev.get("node")] -= 1
                    continue
                print(line, flush=True)
            if not args.follow:
                return exits.FAILED if merger.down else exits.OK
            await asyncio.sleep(1.0)


# -- prometheus targets ------------------------------------------------------------------------


async def _targets(fleet: Fleet, nodes: list, args: argparse.Namespace) -> int:
    from vsup.fleet.query import FleetClient
    from vsup.fleet.targets import targets

    async with FleetClient(fleet) as fc:
        groups, warnings = await targets(fc, nodes)
    for w in warnings:
        print(f"vsup fleet prometheus-targets: {w}", file=sys.stderr)
    text = json.dumps(groups, indent=2) + "\n"
    if args.output:
        from vsup.fsutil import regular_target, write_atomic

        target = regular_target(args.output)
        write_atomic(target, text, mode=0o644)
    else:
        sys.stdout.write(text)
    return exits.OK


# -- dashboard -------------------------------------------------------------------------------


def _dashboard(fleet: Fleet, args: argparse.Namespace) -> int:
    if args.refresh <= 0:
        print("vsup fleet: --refresh must be a positive number of seconds", file=sys.stderr)
        return exits.BAD_INPUT
    from vsup.tui.fleet_app import FleetApp
    from vsup.tui.keymap import load_keymap

    try:
        keymap = load_keymap()
    except ValueError as exc:
        print(f"vsup fleet: {exc}", file=sys.stderr)
        return exits.BAD_INPUT
    app = FleetApp(fleet, readonly=args.readonly, keymap=keymap, refresh_s=args.refresh)
    app.run()
    return app.return_code or 0
