"""`vsup bench LAYOUT [LAYOUT ...]`: A/B layouts on this node with vLLM's own benchmark client.

For each layout in turn: apply it, wait until every instance is ready, send the same workload
(split across the instances in proportion, one `vllm bench serve` client each, started
together) while recording vsup's telemetry; then restore the layout that ran before (or keep
the last with `--keep`), also on Ctrl-C, SIGTERM or SIGHUP (the SSH session dropped; under
`nohup` the bench ignores it and runs to its end). Prints the layouts side by side; `--json`
and `--markdown` save every figure and the exact client command lines; the out dir gets the
same document (`result.json`) and everything the bench said (`bench.log`).

A bench that could not restore (SIGKILL) leaves its layout lease (vsup/lease.py): the daemon
shows it as advice, and `vsup bench --restore` puts the original layout back.

Replacing a layout that serves needs consent: a terminal's yes or `--yes`; without either the
bench changes nothing and exits 3 (as `vsup up` does). Exit status: 0 every layout ran cleanly;
1 a layout did not run cleanly (not ready, a client failed, an instance died, requests failed)
or the original did not come back; 2 bad input (no valid layout, a bad workload);
3 not confirmed; 130 interrupted (after restoring).
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported where used: `vsup --help` stays quick
    from pathlib import Path

    from vsup.bench.guard import LayoutGuard
    from vsup.bench.runner import BenchRunner, LayoutToRun, Original
    from vsup.bench.workload import Workload
    from vsup.control.client import Client

# The same status `vsup up` uses when nobody confirmed stopping serving instances.
from vsup.commands.up import EXIT_NOT_CONFIRMED
from vsup.states import IDLE, SERVING


def _rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r} (requests/s, or inf)") from None
    if not value > 0:
        raise argparse.ArgumentTypeError("must be > 0 (requests/s, or inf for all at once)")
    return value


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench",
        help="apply layouts in turn, load each with vLLM's own bench client, compare them",
        description="For each LAYOUT: apply it, wait until every instance is ready, run the "
        "workload with vLLM's own client (`vllm bench serve`, one per instance, the prompts "
        "split in proportion), record vsup's telemetry; then restore the layout that ran "
        "before. Prints the layouts side by side.",
    )
    # "*" and checked in run: a greedy `--dataset sharegpt FILE` may take the layouts after it
    p.add_argument("layouts", nargs="*", metavar="LAYOUT", help="layout TOML files, in order")
    add_workload_arguments(
        p,
        prompts="prompts per layout (200)",
        rate="requests/s over the whole layout (default inf: all at once)",
    )
    p.add_argument("--json", metavar="FILE", help="write every figure and client command here")
    p.add_argument("--markdown", metavar="FILE", help="write the table as markdown here")
    p.add_argument(
        "--yes", "-y", action="store_true", help="replace the running layout without asking"
    )
    p.add_argument(
        "--keep", action="store_true", help="leave the last layout running instead of restoring"
    )
    add_limit_arguments(p, "layout", "layout", "the clients' logs and result files", "bench")
    p.add_argument(
        "--restore",
        action="store_true",
        help="put back the layout a bench that died (e.g. SIGKILL) replaced, then exit",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from vsup.commands.cliutil import run_command

    return run_command(_bench, args)


def add_workload_arguments(
    p: argparse.ArgumentParser, prompts: str, rate: str
) -> argparse._ArgumentGroup:
    """The workload flags `vsup bench` and `vsup tune` share (`workload_base` and
    `workload_overrides` read them)."""
    w = p.add_argument_group("workload (flags override the --workload file's [bench] table)")
    w.add_argument("--workload", metavar="FILE", help="a TOML file with a [bench] table")
    w.add_argument("--num-prompts", type=int, metavar="N", help=prompts)
    w.add_argument("--input-len", type=int, metavar="N", help="prompt tokens, random (512)")
    w.add_argument("--output-len", type=int, metavar="N", help="output tokens (128)")
    w.add_argument("--request-rate", type=_rate, metavar="R", help=rate)
    w.add_argument(
        "--dataset",
        nargs="+",
        metavar=("random|sharegpt", "FILE"),
        help="random (default), or sharegpt FILE",
    )
    w.add_argument("--seed", type=int, help="the clients' seed (instance i gets seed + i)")
    return w


def add_limit_arguments(
    p: argparse.ArgumentParser, what: str, run: str, files: str, verb: str
) -> None:
    """--timeout (to ready), --run-timeout (the clients) and --out-dir, as bench and tune
    name them: `what` becomes ready ("layout", "candidate"), `run` is one client run."""
    p.add_argument(
        "--timeout",
        type=float,
        default=1200.0,
        metavar="S",
        help=f"how long a {what} may take to become ready (default 1200 s)",
    )
    p.add_argument(
        "--run-timeout",
        type=float,
        default=3600.0,
        metavar="S",
        help=f"how long one {run}'s clients may run (default 3600 s)",
    )
    p.add_argument(
        "--out-dir",
        metavar="DIR",
        help=f"where {files} go (default $VSUP_HOME/{verb}/TIME)",
    )


def workload_base(args: argparse.Namespace) -> Workload:
    """The --workload file's [bench] table (or the defaults), with --dataset over it: the flag
    replaces the file's dataset and its path together."""
    from dataclasses import replace

    from vsup.bench.workload import Workload, load_workload

    base = load_workload(args.workload) if args.workload else Workload()
    if args.dataset:
        path = args.dataset[1] if len(args.dataset) == 2 else None
        base = replace(base, dataset=args.dataset[0], dataset_path=path)
    return base


def workload_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The workload flags to lay over `workload_base` (None: not given)."""
    return {
        "num_prompts": args.num_prompts,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "request_rate": args.request_rate,
        "seed": args.seed,
    }


def workload_from_args(args: argparse.Namespace) -> Workload:
    """The workload: the --workload file's [bench] table, then the flags over it."""
    return workload_base(args).with_overrides(**workload_overrides(args)).check("vsup bench")


def read_layouts(paths: list[str]) -> list[LayoutToRun]:
    """Each layout read and compiled once, on this node's GPUs (the telemetry probe, read
    once for all); invalid ones carry their errors."""
    from pathlib import Path

    from vsup.bench.runner import LayoutToRun
    from vsup.commands.cliutil import print_diagnostics
    from vsup.layout.compiled import compile_layout
    from vsup.layout.files import UnreadableFile, read_text
    from vsup.telemetry.gpu import node_facts

    node = node_facts()
    out: list[LayoutToRun] = []
    for raw in paths:
        path = Path(raw).expanduser().absolute()
        try:
            text = read_text(path)
        except UnreadableFile as exc:
            why = exc.diagnostic.message.removeprefix("cannot read the layout: ")
            out.append(LayoutToRun(path, path.stem, "", errors=[f"cannot read {path}: {why}"]))
            continue
        compiled, diagnostics = compile_layout(text, path, node)
        print_diagnostics([d for d in diagnostics if not d.is_error])
        if compiled is None:
            errors = [d.format() for d in diagnostics if d.is_error]
            out.append(LayoutToRun(path, path.stem, text, errors=errors))
            continue
        lay = LayoutToRun(path, compiled.name, text, specs=list(compiled.specs))
        if not lay.specs:
            lay.errors = [f"{path}: the layout has no instances to load"]
        out.append(lay)
    return out


def take_back_layouts(args: argparse.Namespace) -> None:
    """`--dataset sharegpt FILE a.toml b.toml`: argparse gives --dataset every word after it;
    the words beyond its name (and file, for sharegpt) are the layouts."""
    if not args.dataset:
        return
    keep = 2 if args.dataset[0] == "sharegpt" else 1
    args.layouts = [*args.dataset[keep:], *args.layouts]
    args.dataset = args.dataset[:keep]


def _bench(args: argparse.Namespace) -> int:
    from vsup import paths
    from vsup.bench.guard import LayoutGuard

    home = paths.vsup_home()
    if args.restore:
        return restore_left(args, home)
    # First of all: a signal from here on restores, or stops the daemon this bench started.
    with LayoutGuard(home, "bench", say=_say) as guard:
        return _bench_guarded(args, home, guard)


def _say(line: str) -> None:
    print(f"vsup bench: {line}", file=sys.stderr, flush=True)


def connect_for_run(home: Path) -> tuple[Client, bool]:
    """The daemon's client for a bench or a tune (starting the daemon if none runs) and
    whether one ran before; an interrupt while it starts stops a daemon this run started."""
    from vsup.bench.guard import Interrupted
    from vsup.commands.cliutil import client_for_cli
    from vsup.control.client import Client

    probe = Client(home)
    daemon_was_running = probe.alive() is not None
    probe.close()
    try:
        client = client_for_cli()
    except Interrupted:
        if not daemon_was_running:
            stop_daemon_started(home)
        raise
    return client, daemon_was_running


def _bench_guarded(args: argparse.Namespace, home: Path, guard: LayoutGuard) -> int:
    from vsup.bench.guard import Interrupted
    from vsup.commands.cliutil import CommandFailed

    workload, layouts = _bench_inputs(args)
    client, daemon_was_running = connect_for_run(home)
    with client:
        try:
            original = _original(client, home, daemon_was_running)
            announce(layouts, original, args.keep)
            if original.serving and not args.yes:
                confirm(original.serving)
            out_dir = _out_dir(args, home)
            guard.log_to(out_dir / "bench.log")
            runner = _runner(args, client, home, guard, workload, out_dir)
            guard.claim(
                original.to_json(), [(lay.name, lay.toml) for lay in layouts if not lay.errors]
            )
        except (Interrupted, CommandFailed):
            # nothing was applied yet: what this bench started goes, nothing else changes
            guard.release()
            if not daemon_was_running:
                stop_daemon_started(home, client)
            raise
        doc = runner.run(layouts, original)
        guard.restoring = True  # from here on a signal has nothing left to undo
        if doc["restore"].get("outcome") != "failed":
            guard.release()  # the original is back, or kept on purpose
    return _report(args, doc, out_dir)


def _bench_inputs(args: argparse.Namespace) -> tuple[Workload, list[LayoutToRun]]:
    """The workload and the layouts to compare, checked before anything changes."""
    from pathlib import Path

    from vsup.bench.workload import WorkloadError
    from vsup.commands.cliutil import CommandFailed

    take_back_layouts(args)
    if not args.layouts:
        raise CommandFailed("vsup bench: name one or more layout files to compare", 2)
    try:
        workload = workload_from_args(args)
    except WorkloadError as exc:
        raise CommandFailed(f"vsup bench: {exc}", 2) from None
    for opt in ("json", "markdown"):
        target = getattr(args, opt)
        if target and not Path(target).expanduser().absolute().parent.is_dir():
            raise CommandFailed(f"vsup bench: --{opt} {target}: its directory does not exist", 2)
    layouts = read_layouts(args.layouts)
    for lay in layouts:
        for e in lay.errors:
            print(f"vsup bench: layout {lay.path.name} does not validate: {e}", file=sys.stderr)
    if not any(not lay.errors for lay in layouts):
        raise CommandFailed("vsup bench: no layout is valid; nothing was changed", 2)
    return workload, layouts


def _original(client: Client, home: Path, daemon_was_running: bool) -> Original:
    """What the bench replaces (and brings back): the running layout and its instances."""
    from vsup.bench.runner import Original

    current = client.layout()
    refuse_while_left_behind(home, current.toml)
    before = {i.name: i.lifecycle.state for i in client.status().instances}
    return Original(
        toml=current.toml,
        path=current.path,
        name=current.name,
        serving=[n for n, state in before.items() if state in SERVING],
        daemon_was_running=daemon_was_running,
        # a layout loaded with its instances down (after `vsup down`, say) comes back down
        idle=[n for n, state in before.items() if state in IDLE],
    )


def _out_dir(args: argparse.Namespace, home: Path) -> Path:
    """Where the results go (made now): --out-dir, else a new directory under the home."""
    from datetime import UTC, datetime
    from pathlib import Path

    out_dir = (
        Path(args.out_dir).expanduser().absolute()
        if args.out_dir
        else (home / "bench" / datetime.now(UTC).strftime("%Y%m%d-%H%M%S"))
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    return out_dir


def _runner(
    args: argparse.Namespace,
    client: Client,
    home: Path,
    guard: LayoutGuard,
    workload: Workload,
    out_dir: Path,
) -> BenchRunner:
    from vsup.bench.publish import ProgressPublisher
    from vsup.bench.runner import BenchRunner
    from vsup.control.client import Client

    return BenchRunner(
        client=client,
        make_client=lambda: Client(home),
        workload=workload,
        out_dir=out_dir,
        ready_timeout=args.timeout,
        run_timeout=args.run_timeout,
        keep=args.keep,
        say=_say,
        publisher=ProgressPublisher(lambda: Client(home)),
        guard=guard,
    )


def _report(args: argparse.Namespace, doc: dict[str, Any], out_dir: Path) -> int:
    """Write and print the results; the exit status (130 interrupted, 1 a run failed or the
    original is not back)."""
    from pathlib import Path

    from vsup.bench.report import dump_json, render_markdown, render_table

    write_file(out_dir / "result.json", dump_json(doc))
    sys.stdout.write(render_table(doc["runs"]))
    for opt, text in (("json", dump_json(doc)), ("markdown", render_markdown(doc))):
        target = getattr(args, opt)
        if target:
            write_file(Path(target).expanduser().absolute(), text)
            print(f"vsup bench: wrote {target}", file=sys.stderr)
    print(f"vsup bench: client logs and results in {out_dir}", file=sys.stderr)
    if doc["restore"].get("outcome") == "failed":
        print(
            "vsup bench: the original layout is not back; run `vsup bench --restore` once the "
            "daemon answers",
            file=sys.stderr,
        )
    if doc["interrupted"]:
        return 130
    restored = doc["restore"].get("outcome") in (
        "restored",
        "kept",
        "stopped",
        "daemon_stopped",
        "untouched",
    )
    clean = all(r["outcome"] == "ok" for r in doc["runs"])
    return 0 if clean and restored else 1


def refuse_while_left_behind(home: Path, running: str | None) -> None:
    """Another bench's layout in place (it runs, or it died without restoring; `running` is the
    running layout's text): refuse, saying what to do, before anything changes: this bench
    would take that layout for the original."""
    from vsup.commands.cliutil import CommandFailed
    from vsup.lease import read_lease

    lease = read_lease(home)
    if lease is None:
        return
    if lease.alive():
        raise CommandFailed(
            f"vsup bench: another vsup {lease.owner} (pid {lease.pid}) replaced the layout at "
            f"{lease.started_at} and is still running; wait for it, or end it with "
            f"`kill -TERM {lease.pid}` (it restores the layout on its way out)",
            1,
        )
    if lease.holds(running):
        raise CommandFailed(
            f"vsup bench: a vsup {lease.owner} (pid {lease.pid}, gone) left its layout in place "
            f"of {lease.replaced_name() or 'nothing'} at {lease.started_at}; run "
            "`vsup bench --restore` first",
            1,
        )


def stop_daemon_started(home: Path, client: Client | None = None) -> None:
    """Stop the daemon this bench started before it changed anything (interrupted early):
    wait for it to answer if it is still starting, then let it go with its instances as
    they are (it applied nothing)."""
    import time

    from vsup.control.client import Client
    from vsup.control.errors import ControlError, DaemonUnavailable

    own = client is None
    client = client or Client(home)
    try:
        deadline = time.monotonic() + 30
        while client.alive() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        client.shutdown(stop_instances=False)
    except (ControlError, DaemonUnavailable, OSError):
        pass
    finally:
        if own:
            client.close()


def restore_left(args: argparse.Namespace, home: Path) -> int:
    """`vsup bench --restore`: put back the layout a bench that died replaced."""
    from vsup.bench.guard import LayoutGuard
    from vsup.bench.runner import BenchRunner, Original
    from vsup.bench.workload import Workload
    from vsup.commands.cliutil import CommandFailed, client_for_cli
    from vsup.control.client import Client
    from vsup.lease import clear_lease, read_lease

    lease = read_lease(home)
    if lease is None:
        print("vsup bench: no bench left its layout in place; nothing to restore", file=sys.stderr)
        return 0
    if lease.alive():
        raise CommandFailed(
            f"vsup bench: vsup {lease.owner} (pid {lease.pid}) is still running; it restores the "
            f"layout when it ends (`kill -TERM {lease.pid}` ends it now, restoring)",
            1,
        )
    with LayoutGuard(home, "bench", say=_say) as guard, client_for_cli() as client:
        running = client.layout()
        if not lease.holds(running.toml):
            clear_lease(home, pid=lease.pid)
            print(
                f"vsup bench: the running layout ({running.name or 'none'}) is not one "
                f"the bench (pid {lease.pid}) applied: someone applied another since; nothing "
                "to restore",
                file=sys.stderr,
            )
            return 0
        original = Original.from_json(lease.original)
        _say(
            f"the bench (pid {lease.pid}, gone) replaced {lease.replaced_name() or 'nothing'} "
            f"at {lease.started_at}; restoring"
        )
        runner = BenchRunner(
            client=client,
            make_client=lambda: Client(home),
            workload=Workload(),
            out_dir=home,
            ready_timeout=args.timeout,
            say=_say,
            guard=guard,
        )
        result = runner.restore_from(original, applied=running.name or "(unnamed)")
    if result.get("outcome") == "failed":
        return 1
    clear_lease(home, pid=lease.pid)
    return 0 if result.get("outcome") in ("restored", "stopped", "daemon_stopped") else 1


def announce(layouts: list[LayoutToRun], original: Original, keep: bool) -> None:
    """Say up front what the bench will replace and what comes back."""
    names = ", ".join(lay.name for lay in layouts if not lay.errors)
    print(f"vsup bench: layouts in turn: {names}", file=sys.stderr)
    if original.name or original.serving:
        after = "the last bench layout stays (--keep)" if keep else "it is restored at the end"
        name = original.name or "(unnamed)"
        if original.serving:
            what = f"the running layout {name} (serving: {', '.join(original.serving)})"
        else:
            what = f"the loaded layout {name} (none of its instances serves)"
        print(f"vsup bench: this replaces {what} while it runs; {after}", file=sys.stderr)


def confirm(serving: list[str]) -> None:
    """Ask on a terminal; refuse without one (nothing changed). Returns on yes."""
    from vsup.commands.cliutil import CommandFailed

    what = ", ".join(serving)
    if not sys.stdin.isatty():
        raise CommandFailed(
            f"vsup bench: this replaces serving instances ({what}) and there is no terminal to "
            "confirm it; nothing was changed. Run again with --yes",
            EXIT_NOT_CONFIRMED,
        )
    try:
        answer = input(f"replace the running layout (serving {what}) for the bench? [y/N] ")
    except EOFError:
        answer = ""
    if answer.strip().lower() not in ("y", "yes"):
        raise CommandFailed("vsup bench: not confirmed; nothing was changed", EXIT_NOT_CONFIRMED)


def write_file(path: Path, text: str) -> None:
    """Write atomically (vsup.fsutil): a crash never leaves half a report."""
    from vsup.fsutil import write_atomic

    write_atomic(path, text)
