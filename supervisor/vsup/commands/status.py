"""`vsup status [--json]`: one snapshot; exit 1 when any instance is not ready.

The document is fetched with the standard library when a daemon answers (`fetch_status`):
the control client's httpx took longer to import than the whole answer of a 128-instance
daemon. Without an answer it falls back to the client, which never starts a daemon (a
read-only command: exit 4, `exits.NO_DAEMON`) and reports errors as every command does.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vsup.snapshot import (
        BenchStatus,
        InstanceStatus,
        LastExit,
        Parallel,
        RankStatus,
        RolloutStatus,
        RouterStatus,
        StatusSnapshot,
    )

from vsup import sleepview
from vsup.states import CanaryState, ExitReason, PullState, RolloutState, State


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "status",
        help="print one status snapshot (exit 1 if any instance is not ready)",
        description="Print every instance's state and telemetry once. Exit status 1 when any "
        "instance is not ready, 4 when no daemon runs for this VSUP_HOME (status never starts "
        "one: `vsup up` or `vsup daemon --detach` do).",
    )
    p.add_argument("--json", action="store_true", help="the status document (schema 1)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    doc = fetch_status()
    if doc is None:
        return _run_with_client(args)
    return _show(doc, args)


def _run_with_client(args: argparse.Namespace) -> int:
    from vsup.commands.cliutil import client_for_cli, run_command

    def body(args: argparse.Namespace) -> int:
        with client_for_cli(start=False) as client:
            doc = client.status_json()  # --json prints it as the daemon sent it
        return _show(doc, args)

    return run_command(body, args)


def _show(doc: dict[str, Any], args: argparse.Namespace) -> int:
    if args.json:
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render(doc))
    return 0 if all(i["state"] == State.READY for i in doc.get("instances", ())) else 1


def fetch_status(home: Path | None = None, timeout: float = 30.0) -> dict[str, Any] | None:
    """GET /v1/status over the daemon's socket with the standard library; None when no
    daemon answers it with a 200 and a JSON object (the caller then uses the client)."""
    from vsup import paths
    from vsup.udshttp import BrokenAnswer, unix_request

    try:
        path = paths.socket_path(home or paths.vsup_home())
        status, body = unix_request(
            str(path),
            b"GET /v1/status HTTP/1.1\r\nHost: vsup\r\nConnection: close\r\n\r\n",
            timeout,
        )
    except (OSError, ValueError, BrokenAnswer):
        return None  # no daemon, a bad VSUP_HOME, a path too long: the client says which
    if status != 200:
        return None
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


GiB = 1024**3


def _num(value: Any, fmt: str = "{:.0f}") -> str:
    return "-" if value is None else fmt.format(value)


def _p(text: Any) -> str:
    """Text from a layout, a log or the daemon, safe to print (termtext.printable)."""
    from vsup.termtext import printable

    return printable("" if text is None else text)


def bench_line(b: BenchStatus) -> str:
    """`BENCH 2/3 two: running 412/1000 requests, 1m12s (vsup bench pid 4242 replaced the
    layout; it restores it at the end)`: a layout change nobody should take for an incident."""
    from vsup.progress import fmt_duration

    where = f" {b.index}/{b.count}" if b.index and b.count else ""
    what = b.phase.replace("_", " ")
    if b.phase in ("running", "collecting") and b.requests_total:
        what += f" {b.requests_done or 0}/{b.requests_total} requests"
    if b.eta_s is not None and b.phase != "restoring":
        what += f" (~{fmt_duration(b.eta_s)} left of the whole {b.tool})"
    return _p(
        f"{b.tool.upper()}{where} {b.layout or ''}: {what}, {fmt_duration(b.elapsed_s)} "
        f"(vsup {b.tool} pid {b.pid} replaced the layout; it restores it at the end)"
    )


def exit_how(le: LastExit) -> str:
    """How a run ended, for `last exit REASON (HOW)`: its code or signal, else why neither
    is known (never a bare `?`)."""
    if le.code is not None:
        return f"code {le.code}"
    if le.signal:
        return str(le.signal)
    if le.reason == ExitReason.PORT_IN_USE:
        return "refused before it started"
    return "exit status unknown: not the daemon's child"


def port_holder_note(port: Any) -> str:
    """`; port 8101 is held by pid 4242 (python3)` when this node says who listens there
    (read-only: the socket table, no bind), else what to run to find out."""
    if not isinstance(port, int):
        return ""
    try:
        import psutil

        for c in psutil.net_connections(kind="tcp"):
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid:
                try:
                    who = f"pid {c.pid} ({psutil.Process(c.pid).name()})"
                except psutil.Error:
                    who = f"pid {c.pid}"
                return f"; port {port} is held by {who} now"
    except (psutil.Error, OSError):
        pass
    return f"; port {port}: `ss -ltnp 'sport = :{port}'` shows who holds it"


def short_duration(seconds: float | None) -> str:
    """`fmt_duration` without a zero tail: `20m`, `1h`, `2m10s`."""
    from vsup.progress import fmt_duration

    text = fmt_duration(seconds)
    for zero in ("m00s", "h00m"):
        if text.endswith(zero):
            return text[: -len(zero) + 1]
    return text


def rollout_lines(r: RolloutStatus | None) -> list[str]:
    """What `vsup status` says of the latest rolling apply: while it runs (the wave, what
    restarts, what is pending), and after it failed or was interrupted while instances still
    run their old config. Nothing for one that ended well."""
    if r is None:
        return []
    names = ", ".join(r.current) or "-"
    if r.state == RolloutState.RUNNING and r.canary_state == CanaryState.WATCHING:
        line = (
            f"ROLLOUT wave {r.wave}/{r.waves}: watching canary {', '.join(r.canary) or names} "
            f"for {r.canary_s:g} s "
            f"beside {', '.join(r.pending) or '-'} (old config) · `vsup rollout promote|abort`"
        )
        return [_p(line)]
    if r.state == RolloutState.ROLLED_BACK:
        return [
            _p(f"ROLLOUT ROLLED BACK at its canary: {r.failure or '?'}"),
            _p(f"  on the old config: {', '.join(r.old_config) or '-'}"),
        ]
    if r.state == RolloutState.RUNNING:
        line = f"ROLLOUT wave {r.wave}/{r.waves}: restarting {names} · {r.done}/{r.total} done"
        if r.pending:
            line += f" · pending {', '.join(r.pending)} (on the old config until their wave)"
        return [_p(line + f" · max_unavailable {r.max_unavailable}")]
    if r.state == RolloutState.FAILED and r.old_config:
        return [
            _p(f"ROLLOUT FAILED at wave {r.wave}/{r.waves}: {r.failure or '?'}"),
            _p(f"  on the old config: {', '.join(r.old_config)}"),
        ]
    if r.state == RolloutState.INTERRUPTED and r.old_config:
        return [
            _p(
                f"ROLLOUT INTERRUPTED at wave {r.wave}/{r.waves} ({r.done}/{r.total} done; its "
                f"daemon ended): {', '.join(r.old_config)} still run the old config - "
                "`vsup up LAYOUT` finishes it"
            )
        ]
    return []


def state_cell(i: InstanceStatus) -> str:
    """The STATE column: the state, then what it waits for or how far its start is."""
    from vsup.progress import fmt_duration
    from vsup.pullview import state_mark

    state: str = i.lifecycle.state
    if state == State.BACKOFF and i.lifecycle.backoff_remaining_s is not None:
        state += f" {fmt_duration(i.lifecycle.backoff_remaining_s)}"
    elif state == State.STARTING and i.lifecycle.wait is not None:
        state += " (waits)"
    elif state == State.STARTING and i.lifecycle.start_elapsed_s is not None:
        state += f" {fmt_duration(i.lifecycle.start_elapsed_s)}"
        if i.lifecycle.start_timeout_s:
            state += f" of {short_duration(i.lifecycle.start_timeout_s)}"
    stall = i.active_stall
    if stall is not None:
        # a flag on a ready instance (its state stays ready: scripts switch on it)
        state += f" STALLED {fmt_duration(stall.for_s)}"
    if sleepview.sleeping(i.sleep) and i.sleep is not None:
        # sleep mode: a live, healthy server (ready) that serves nothing
        state += f" ({sleepview.state_word(i.sleep, ellipsis='')})"
    if i.lifecycle.outdated:
        state += " (old spec)"
    mark = state_mark(i.pull)
    if mark:
        state += f" ({mark})"
    return state


def wait_line(i: InstanceStatus) -> str | None:
    """`b: waits for a starting (a co-tenant of its device)`, one line per waiting instance."""
    w = i.lifecycle.wait
    if w is None:
        return None
    what = {
        "co_tenant": "a co-tenant of its device",
        "start_slot": "its turn to start on its device",
        "gpu_memory": "GPU memory",
    }.get(w.kind)
    if w.kind == "backoff":
        return _p(f"{i.name}: backing off after a failure, {w.message}")
    return _p(f"{i.name}: waits for {w.message}" + (f" ({what})" if what else ""))


def sleep_line(i: InstanceStatus) -> str | None:
    """`b: asleep for 2m10s · level 1 (weights in host RAM) · swap group g0 · last sleep 1.2s,
    wake 0.9s · keeps 1.7 GiB of GPU memory`, for an instance with sleep mode (None without)."""
    if i.sleep is None:
        return None
    return _p(f"{i.name}: sleep mode, {sleepview.detail_line(i.sleep)}")


def _shape(parallel: Parallel | None) -> str:
    """`TP1 x DP8` (snapshot.Parallel.label); `-` from an older daemon."""
    return parallel.label if parallel is not None else "-"


def _rank(r: RankStatus) -> str:
    """`DP1 gpu 1 pid 7948 dead 12.3G`."""
    state = {True: "alive", False: "dead", None: "not seen"}[r.alive]
    gpus = ",".join(str(g) for g in r.gpus) or "cpu"
    hbm = f" {r.hbm_bytes / GiB:.1f}G" if r.hbm_bytes is not None else ""
    return f"DP{r.rank} gpu {gpus} pid {_num(r.pid, '{}')} {state}{hbm}"


def _hbm_cell(i: InstanceStatus) -> str:
    if i.memory.hbm_bytes is None:
        return "n/a" if i.gpus else "-"
    return f"{i.memory.hbm_bytes / GiB:.1f}G"


def _run_wait_cell(i: InstanceStatus) -> str:
    if i.telemetry.requests_running is None and i.telemetry.requests_waiting is None:
        return "-"
    return f"{_num(i.telemetry.requests_running)}/{_num(i.telemetry.requests_waiting)}"


def _backend_cell(i: InstanceStatus) -> str:
    backend = i.telemetry.backend or "-"
    if i.telemetry.backend and i.telemetry.backend_source not in (None, "log"):
        backend += "*"  # inferred: the footnote says so
    return _p(backend)


def _duration(seconds: float | None) -> str:
    from vsup.progress import fmt_duration

    return fmt_duration(seconds)


# The table's columns: header, and the cell of an instance's row.
COLUMNS: tuple[tuple[str, Callable[[InstanceStatus], str]], ...] = (
    ("NAME", lambda i: _p(i.name)),
    ("STATE", lambda i: state_cell(i)),
    ("PID", lambda i: _num(i.lifecycle.pid, "{}")),
    ("PORT", lambda i: _num(i.port, "{}")),
    ("GPUS", lambda i: ",".join(str(g) for g in i.gpus) or "cpu"),
    ("SHAPE", lambda i: _shape(i.parallel)),
    ("KV", lambda i: _num(i.telemetry.kv_cache_usage, "{:.0%}")),
    ("PREEMPT/MIN", lambda i: _num(i.telemetry.preemptions_per_min, "{:.1f}")),
    ("RUN/WAIT", _run_wait_cell),
    ("TOK/S", lambda i: _num(i.telemetry.generation_tokens_per_s, "{:.1f}")),
    ("HBM", _hbm_cell),
    ("BACKEND", _backend_cell),
    ("RESTARTS", lambda i: str(i.lifecycle.restarts)),
    ("UPTIME", lambda i: _duration(i.lifecycle.uptime_s)),
)


def _router_row(router: RouterStatus) -> tuple[str, ...]:
    """The router's own row: it is no instance, so only the columns that apply."""
    return (
        "(router)",
        router.state,
        _num(router.pid, "{}"),
        _num(router.port, "{}"),
        *("-",) * (len(COLUMNS) - 6),
        str(router.restarts),
        _duration(router.uptime_s),
    )


def _exit_line(i: InstanceStatus) -> str | None:
    le = i.lifecycle.last_exit
    if not le or i.lifecycle.state == State.READY:
        return None
    line = f"{i.name}: last exit {le.reason} ({exit_how(le)}) at {le.at}"
    if le.rank is not None:
        line += f", data-parallel rank {le.rank} died first"
    if le.log_excerpt:
        line += f": {le.log_excerpt.strip().splitlines()[-1][:160]}"
    if le.reason == ExitReason.PORT_IN_USE and "in use by" not in (le.log_excerpt or ""):
        line += port_holder_note(i.port)
    return _p(line)


def _outdated_line(i: InstanceStatus) -> str | None:
    if not i.lifecycle.outdated:
        return None
    differ = ", ".join(i.lifecycle.outdated_fields) or "spec"
    return _p(
        f"{i.name}: runs an older spec than the layout ({differ} differ); "
        "`vsup up LAYOUT` restarts it with the layout's"
    )


def _ranks_line(i: InstanceStatus) -> str | None:
    return _p(f"{i.name} ranks: " + "; ".join(_rank(r) for r in i.ranks)) if i.ranks else None


def span_line(i: InstanceStatus) -> str | None:
    """A server across nodes: this node's part and where the rest lives (docs/fleet.md)."""
    span = i.span
    if span is None:
        return None

    def ranks(start: int, n: int) -> str:
        return f"{start}" if n == 1 else f"{start}-{start + n - 1}"

    role = "the head (API server)" if span.head else "headless"
    nodes = ", ".join(f"{n.node} ({ranks(n.start_rank, n.ranks)})" for n in span.nodes)
    head = span.nodes[0].node if span.nodes else "?"
    figures = (
        ""
        if span.head
        else f"; the unit's figures (tokens/s, requests, KV cache) are its head's, on {head}"
    )
    # a span of nodes: the workers of one tensor/pipeline parallel group, not DP ranks
    word = "worker" if span.across == "model" else "rank"
    return _p(
        f"{i.name}: one server across nodes: {span.node} runs {word}"
        f"{'s' if span.ranks > 1 else ''} {ranks(span.start_rank, span.ranks)} of {span.size}, "
        f"{role}; head {head} at {span.address}:{span.port}; {word}s on {nodes}{figures}"
    )


# What the table does not say, below it: each kind of line for every instance, in this order.
NOTES: tuple[Callable[[InstanceStatus], str | None], ...] = (
    lambda i: wait_line(i),
    _exit_line,
    _outdated_line,
    lambda i: sleep_line(i),
    span_line,
    _ranks_line,
)


def _head_lines(snap: StatusSnapshot) -> list[str]:
    """The header line, then a bench, a rollout and pulls in progress."""
    from vsup.pullview import pull_line

    sup = snap.supervisor
    lines = [
        _p(
            f"vsup {sup.version} · layout {sup.layout or '(none)'} · "
            f"{snap.ready_count}/{len(snap.instances)} ready · daemon pid {sup.pid} up "
            f"{_duration(sup.uptime_s)}"
        )
    ]
    if snap.bench is not None:
        lines.append(bench_line(snap.bench))
    lines.extend(rollout_lines(snap.rollout))
    # hub models pulled before their instances start (a failed one is advice; docs/pull.md)
    lines += [pull_line(p) for p in snap.pulls if p.state == PullState.PULLING]
    return lines


def _table(snap: StatusSnapshot) -> list[str]:
    rows = [tuple(h for h, _ in COLUMNS)]
    rows += [tuple(cell(i) for _, cell in COLUMNS) for i in snap.instances]
    if snap.router is not None:
        rows.append(_router_row(snap.router))
    widths = [max(len(r[c]) for r in rows) for c in range(len(COLUMNS))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)).rstrip() for r in rows]


def render(doc: StatusSnapshot | dict[str, Any]) -> str:
    """The readable table: a header line, one row per instance, exits and advice below.
    `doc` is the status document (read into a `StatusSnapshot`) or the snapshot itself."""
    from vsup.routerview import router_line
    from vsup.snapshot import StatusSnapshot

    snap = doc if isinstance(doc, StatusSnapshot) else StatusSnapshot.from_json(doc)
    insts = snap.instances
    lines = _head_lines(snap) + _table(snap)
    if not insts:
        lines.append("(no instances: `vsup up LAYOUT` starts some)")
    for note in NOTES:
        lines += [line for line in map(note, insts) if line is not None]
    if snap.router is not None:
        lines.append(router_line(snap.router) or "")
    if any(i.telemetry.backend_source not in (None, "log") and i.telemetry.backend for i in insts):
        lines.append("* backend inferred from flags or the platform default, not seen in the log")
    lines += [_p(f"{a.severity}: {a.message}") for a in snap.advice]
    return "\n".join(lines) + "\n"
