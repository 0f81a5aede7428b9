"""`vsup status [--json]`: one snapshot; exit 1 when any instance is not ready."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


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
    from vsup.commands.cliutil import client_for_cli, run_command

    def body(args: argparse.Namespace) -> int:
        with client_for_cli(start=False) as client:
            doc = client.status()
        if args.json:
            json.dump(doc, sys.stdout, indent=2)
            sys.stdout.write("\n")
        else:
            sys.stdout.write(render(doc))
        return 0 if all(i["state"] == "ready" for i in doc.get("instances", ())) else 1

    return run_command(body, args)


GiB = 1024**3


def _num(value: Any, fmt: str = "{:.0f}") -> str:
    return "-" if value is None else fmt.format(value)


def bench_line(b: dict[str, Any]) -> str:
    """`BENCH 2/3 two: running 412/1000 requests, 1m12s (vsup bench pid 4242 replaced the
    layout; it restores it at the end)`: a layout change nobody should take for an incident."""
    from vsup.commands.progress import fmt_duration

    where = f" {b['index']}/{b['count']}" if b.get("index") and b.get("count") else ""
    what = b["phase"].replace("_", " ")
    if b["phase"] in ("running", "collecting") and b.get("requests_total"):
        what += f" {b.get('requests_done') or 0}/{b['requests_total']} requests"
    return (
        f"BENCH{where} {b.get('layout') or ''}: {what}, {fmt_duration(b.get('elapsed_s'))} "
        f"(vsup bench pid {b['pid']} replaced the layout; it restores it at the end)"
    )


def _shape(parallel: dict[str, Any] | None) -> str:
    """`TP1 x DP8` (snapshot.Parallel.label) from the status JSON; `-` from an older daemon."""
    from vsup.snapshot import Parallel

    if not parallel:
        return "-"
    return Parallel(parallel["tp"], parallel["pp"], parallel["dp"]).label


def _rank(r: dict[str, Any]) -> str:
    """`DP1 gpu 1 pid 7948 dead 12.3G`."""
    state = {True: "alive", False: "dead", None: "not seen"}[r.get("alive")]
    gpus = ",".join(str(g) for g in r.get("gpus") or ()) or "cpu"
    hbm = f" {r['hbm_bytes'] / GiB:.1f}G" if r.get("hbm_bytes") is not None else ""
    return f"DP{r['rank']} gpu {gpus} pid {_num(r.get('pid'), '{}')} {state}{hbm}"


def exit_how(le: dict[str, Any]) -> str:
    """How a run ended, for `last exit REASON (HOW)`: its code or signal, else why neither
    is known (never a bare `?`)."""
    if le.get("code") is not None:
        return f"code {le['code']}"
    if le.get("signal"):
        return str(le["signal"])
    if le.get("reason") == "port_in_use":
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


def render(doc: dict[str, Any]) -> str:
    """The readable table: a header line, one row per instance, exits and advice below."""
    from vsup.commands.progress import fmt_duration

    sup = doc.get("supervisor", {})
    insts = doc.get("instances", [])
    ready = sum(1 for i in insts if i["state"] == "ready")
    lines = [
        f"vsup {sup.get('version', '?')} · layout {sup.get('layout') or '(none)'} · "
        f"{ready}/{len(insts)} ready · daemon pid {sup.get('pid')} up "
        f"{fmt_duration(sup.get('uptime_s'))}"
    ]
    if doc.get("bench"):
        lines.append(bench_line(doc["bench"]))
    header = (
        "NAME",
        "STATE",
        "PID",
        "PORT",
        "GPUS",
        "SHAPE",
        "KV",
        "PREEMPT/MIN",
        "RUN/WAIT",
        "TOK/S",
        "HBM",
        "BACKEND",
        "RESTARTS",
        "UPTIME",
    )
    rows = [header]
    for i in insts:
        state = i["state"]
        if state == "backoff" and i.get("backoff_remaining_s") is not None:
            state += f" {fmt_duration(i['backoff_remaining_s'])}"
        if i.get("stalled"):
            # a flag on a ready instance (its state stays ready: scripts switch on it)
            state += f" STALLED {fmt_duration(i.get('stalled_for_s'))}"
        hbm = "-" if i.get("hbm_bytes") is None else f"{i['hbm_bytes'] / GiB:.1f}G"
        if i.get("hbm_bytes") is None and i.get("gpus"):
            hbm = "n/a"
        rw = (
            "-"
            if i.get("requests_running") is None and i.get("requests_waiting") is None
            else f"{_num(i.get('requests_running'))}/{_num(i.get('requests_waiting'))}"
        )
        backend = i.get("backend") or "-"
        if i.get("backend") and i.get("backend_source") not in (None, "log"):
            backend += "*"
        rows.append(
            (
                i["name"],
                state,
                _num(i.get("pid"), "{}"),
                _num(i.get("port"), "{}"),
                ",".join(str(g) for g in i.get("gpus") or ()) or "cpu",
                _shape(i.get("parallel")),
                _num(i.get("kv_cache_usage"), "{:.0%}"),
                _num(i.get("preemptions_per_min"), "{:.1f}"),
                rw,
                _num(i.get("generation_tokens_per_s"), "{:.1f}"),
                hbm,
                backend,
                str(i.get("restarts", 0)),
                fmt_duration(i.get("uptime_s")),
            )
        )
    router = doc.get("router")
    if router:
        # the router's own row: it is no instance, so only the columns that apply
        rows.append(
            (
                "(router)",
                router.get("state", "?"),
                _num(router.get("pid"), "{}"),
                _num(router.get("port"), "{}"),
                *("-",) * (len(header) - 6),
                str(router.get("restarts", 0)),
                fmt_duration(router.get("uptime_s")),
            )
        )
    widths = [max(len(r[c]) for r in rows) for c in range(len(header))]
    for r in rows:
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=False)).rstrip())
    if not insts:
        lines.append("(no instances: `vsup up LAYOUT` starts some)")
    for i in insts:
        le = i.get("last_exit")
        if le and i["state"] != "ready":
            line = f"{i['name']}: last exit {le['reason']} ({exit_how(le)}) at {le.get('at')}"
            if le.get("rank") is not None:
                line += f", data-parallel rank {le['rank']} died first"
            if le.get("log_excerpt"):
                line += f": {le['log_excerpt'].strip().splitlines()[-1][:160]}"
            if le.get("reason") == "port_in_use" and "in use by" not in (
                le.get("log_excerpt") or ""
            ):
                line += port_holder_note(i.get("port"))
            lines.append(line)
    for i in insts:
        if i.get("ranks"):
            lines.append(f"{i['name']} ranks: " + "; ".join(_rank(r) for r in i["ranks"]))
    if router:
        from vsup.routerview import router_line

        lines.append(router_line(router) or "")
    if any(i.get("backend_source") not in (None, "log") and i.get("backend") for i in insts):
        lines.append("* backend inferred from flags or the platform default, not seen in the log")
    for a in doc.get("advice", ()):
        lines.append(f"{a['severity']}: {a['message']}")
    return "\n".join(lines) + "\n"
