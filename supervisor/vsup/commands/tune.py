"""`vsup tune BASE_LAYOUT --slo ...`: find the layout serving the most under an SLO on this node.

From the base layout and a search space (defaults from the node and the model, a `[tune]` table
over them; vsup/tune/space.py) it builds the candidates, prunes those that do not validate or
that the planner says do not fit, and runs the rest one after another through `vsup bench`'s
machinery (vLLM's own client, vsup's telemetry, the layout lease) in an asynchronous successive
halving over rungs of prompts (vsup/tune/search.py), within `--budget`. It prints the ranking,
the Pareto front and a plot; `--json`, `--markdown` and `--plot` save them, and `-o FILE` writes
the best layout under the SLO with a comment block saying how it was chosen. The original
layout comes back at the end, on Ctrl-C and on SIGTERM, unless `--apply` leaves the best one
running. `--dry-run` lists the candidates and the rungs and starts nothing.

Exit status: 0 a layout met the SLO (and was written with -o); 1 none did, or the original did
not come back; 2 bad input (the base layout, the space, the SLO, the workload); 3 not
confirmed; 130 interrupted (after restoring, with the results so far saved).
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import Path

    from vsup.bench.guard import LayoutGuard
    from vsup.bench.runner import Original
    from vsup.control.client import Client
    from vsup.layout.node import NodeFacts
    from vsup.tune.measure import Measurer, TuneRunner
    from vsup.tune.search import SearchResult, Step
    from vsup.tune.space import Base, Candidate

from vsup.commands.bench import (
    add_limit_arguments,
    add_workload_arguments,
    connect_for_run,
    workload_base,
    workload_overrides,
)


def _duration(text: str) -> float:
    """`30m`, `1h30m`, `90s`, `45` (seconds) -> seconds."""
    raw = text.strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", raw):
        value = float(raw)
    else:
        parts = re.findall(r"(\d+(?:\.\d+)?)([hms])", raw)
        if not parts or "".join(n + u for n, u in parts) != raw:
            raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 30m, 1h30m, 90s)")
        value = sum(float(n) * {"h": 3600, "m": 60, "s": 1}[u] for n, u in parts)
    if value <= 0:
        raise argparse.ArgumentTypeError("must be above 0")
    return value


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be 1 or more")
    return value


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "tune",
        help="search layouts around a base layout for the one serving the most under an SLO",
        description="Build candidates from BASE_LAYOUT and a search space ([tune] table), prune "
        "those that do not validate or fit, measure the rest with vLLM's own client in a "
        "successive halving within --budget, and report the ranking, the Pareto front and the "
        "best layout under the SLO. The original layout is restored at the end.",
    )
    p.add_argument("base", metavar="BASE_LAYOUT", help="the layout TOML file to start from")
    p.add_argument(
        "--slo",
        metavar="TERMS",
        help="latency SLO, e.g. 'ttft_p99<=2s,tpot_p99<=100ms' (metrics ttft, tpot, itl, e2el; "
        "p50..p99.9 or mean; ms or s); ranks by goodput. Without it: by output tokens/s",
    )
    p.add_argument(
        "--space", metavar="FILE", help="a TOML file whose [tune] table overrides the space"
    )
    w = add_workload_arguments(
        p, prompts="prompts of the last rung (200)", rate="requests/s (default inf)"
    )
    w.add_argument(
        "--warmups",
        type=int,
        default=2,
        metavar="N",
        help="warm-up requests per client before it measures (vLLM's --num-warmups; default 2, "
        "0 for a vLLM client without the flag)",
    )
    _search_arguments(p.add_argument_group("search"))
    _output_arguments(p.add_argument_group("output"))
    p.add_argument("--yes", "-y", action="store_true", help="replace the running layout")
    add_limit_arguments(
        p, "candidate", "rung", "the candidates, the clients' logs and results", "tune"
    )
    p.set_defaults(func=run)


def _search_arguments(s: argparse._ArgumentGroup) -> None:
    s.add_argument(
        "--budget",
        type=_duration,
        metavar="TIME",
        help="bound the whole search, e.g. 30m: a step that would run past it is not started",
    )
    s.add_argument("--eta", type=int, default=2, metavar="N", help="keep 1/N per rung (2)")
    s.add_argument(
        "--min-prompts",
        type=_positive,
        default=16,
        metavar="N",
        help="prompts of the smallest rung, at least (16)",
    )
    s.add_argument(
        "--repeats",
        type=_positive,
        default=2,
        metavar="N",
        help="runs at the last rung, for the spread (2)",
    )
    s.add_argument(
        "--dry-run", action="store_true", help="list the candidates and rungs; start nothing"
    )


def _output_arguments(o: argparse._ArgumentGroup) -> None:
    o.add_argument("--json", metavar="FILE", help="write every figure and client command here")
    o.add_argument("--markdown", metavar="FILE", help="write the report as markdown here")
    o.add_argument("--plot", metavar="FILE", help="the throughput/latency plot: .svg, or .png")
    o.add_argument("-o", "--output", metavar="FILE", help="write the best layout here")
    o.add_argument(
        "--apply", action="store_true", help="leave the best layout running instead of restoring"
    )


def run(args: argparse.Namespace) -> int:
    from vsup.commands.cliutil import run_command

    return run_command(_tune, args)


def _say(line: str) -> None:
    print(f"vsup tune: {line}", file=sys.stderr, flush=True)


# -- input ---------------------------------------------------------------------------------


def read_base(raw: str, node: NodeFacts) -> Base:
    """The base layout, compiled on this node; CommandFailed (2) naming the file otherwise."""
    import tomllib
    from pathlib import Path

    from vsup.commands.cliutil import CommandFailed, print_diagnostics
    from vsup.layout.compiled import compile_layout
    from vsup.layout.files import UnreadableFile, read_text
    from vsup.tune.space import Base

    path = Path(raw).expanduser().absolute()
    try:
        text = read_text(path)
    except UnreadableFile as exc:
        raise CommandFailed(f"vsup tune: {exc.diagnostic.format()}", 2) from None
    compiled, diagnostics = compile_layout(text, path, node)
    print_diagnostics([d for d in diagnostics if not d.is_error])
    if compiled is None:
        errors = "\n".join(d.format() for d in diagnostics if d.is_error)
        raise CommandFailed(f"vsup tune: the base layout does not validate:\n{errors}", 2)
    if not compiled.specs:
        raise CommandFailed(f"vsup tune: {path}: the layout has no instances", 2)
    return Base(path, text, tomllib.loads(text), list(compiled.specs), compiled.name)


def space_overrides(args: argparse.Namespace, base: Base) -> list[tuple[str, Any]]:
    """The [tune] tables over the defaults: the base layout's, then the --space file's."""
    import tomllib
    from pathlib import Path

    from vsup.commands.cliutil import CommandFailed

    out: list[tuple[str, Any]] = []
    if "tune" in base.document:
        out.append((str(base.path), base.document["tune"]))
    if args.space:
        path = Path(args.space).expanduser().absolute()
        try:
            doc = tomllib.loads(path.read_text())
        except OSError as exc:
            raise CommandFailed(
                f"vsup tune: cannot read {path}: {exc.strerror or exc}", 2
            ) from None
        except tomllib.TOMLDecodeError as exc:
            raise CommandFailed(f"vsup tune: {path}: not valid TOML ({exc})", 2) from None
        if "tune" not in doc:
            raise CommandFailed(f"vsup tune: {path}: no [tune] table", 2)
        out.append((str(path), doc["tune"]))
    return out


def workload_from_args(args: argparse.Namespace) -> Any:
    """`vsup bench`'s workload with --warmups: the clients' warm-up requests."""
    from dataclasses import asdict

    from vsup.tune.measure import TuneWorkload

    base = TuneWorkload(**asdict(workload_base(args)), warmups=max(0, args.warmups))
    return base.with_overrides(**workload_overrides(args)).check("vsup tune")


def check_outputs(args: argparse.Namespace) -> None:
    from pathlib import Path

    from vsup.commands.cliutil import CommandFailed
    from vsup.tune.report import has_matplotlib

    for opt in ("json", "markdown", "plot", "output"):
        target = getattr(args, opt)
        if target and not Path(target).expanduser().absolute().parent.is_dir():
            flag = "-o" if opt == "output" else f"--{opt}"
            raise CommandFailed(f"vsup tune: {flag} {target}: its directory does not exist", 2)
    if args.plot and not args.plot.endswith((".svg", ".png")):
        raise CommandFailed(f"vsup tune: --plot {args.plot}: name a .svg or .png file", 2)
    if args.plot and args.plot.endswith(".png") and not has_matplotlib():
        raise CommandFailed(
            f"vsup tune: --plot {args.plot}: a PNG needs matplotlib, which is not installed in "
            "vsup's environment; name a .svg file instead",
            2,
        )
    if args.eta < 2:
        raise CommandFailed("vsup tune: --eta must be 2 or more", 2)


def describe(cands: list[Candidate], rungs: list[int], space: Any) -> None:
    runnable = [c for c in cands if not c.pruned]
    _say(f"search space: {space.size} candidate(s); {len(runnable)} to run, rungs {rungs} prompts")
    for c in cands:
        where = f"pruned: {c.pruned}" if c.pruned else "runs" + (
            " (the base layout's instances: no restart)" if c.same_as_base else "")  # fmt: skip
        _say(f"  {c.name}: {c.knobs.words()} - {where}")
        for note in c.notes:
            _say(f"    note: {note}")


# -- the command ---------------------------------------------------------------------------


def _tune(args: argparse.Namespace) -> int:
    from vsup import paths
    from vsup.bench.guard import LayoutGuard
    from vsup.bench.workload import WorkloadError
    from vsup.commands.cliutil import CommandFailed
    from vsup.telemetry.gpu import node_facts
    from vsup.tune.search import rung_sizes
    from vsup.tune.slo import SloError, parse_slo
    from vsup.tune.space import SpaceError, build_space, make_candidates

    if args.dataset and len(args.dataset) > (2 if args.dataset[0] == "sharegpt" else 1):
        raise CommandFailed("vsup tune: --dataset takes random, or sharegpt FILE", 2)
    try:
        slo = parse_slo(args.slo) if args.slo else None
        workload = workload_from_args(args)
    except (SloError, WorkloadError) as exc:
        raise CommandFailed(f"vsup tune: {exc}", 2) from None
    check_outputs(args)
    node = node_facts()
    base = read_base(args.base, node)
    try:
        space = build_space(base, node, space_overrides(args, base))
    except SpaceError as exc:
        raise CommandFailed(f"vsup tune: {exc}", 2) from None
    cands = make_candidates(base, space, node)
    runnable = [c for c in cands if not c.pruned]
    # the base layout's own settings first: the yardstick, and no restart
    runnable.sort(key=lambda c: not c.same_as_base)
    rungs = rung_sizes(workload.num_prompts, args.eta, max(1, len(runnable)), args.min_prompts)
    describe(cands, rungs, space)
    if not runnable:
        raise CommandFailed("vsup tune: every candidate was pruned; nothing was started", 2)
    if args.dry_run:
        return 0
    home = paths.vsup_home()
    with LayoutGuard(home, "tune", say=_say) as guard:
        return _tune_guarded(args, home, guard, base, space, cands, runnable, rungs, workload, slo)


@dataclass
class _Tune:
    """One tune run's inputs, as `run` worked them out."""

    args: argparse.Namespace
    home: Path
    guard: LayoutGuard
    base: Base
    space: Any
    cands: list[Candidate]
    runnable: list[Candidate]
    rungs: list[int]
    workload: Any
    slo: Any


def _tune_guarded(
    args: argparse.Namespace,
    home: Path,
    guard: LayoutGuard,
    base: Base,
    space: Any,
    cands: list[Candidate],
    runnable: list[Candidate],
    rungs: list[int],
    workload: Any,
    slo: Any,
) -> int:
    """Under the layout lease: take the original layout's place, run the search, build the
    report and bring the original (or, with --apply, the best) back, whatever happened."""
    from datetime import UTC, datetime

    from vsup.commands.cliutil import CommandFailed
    from vsup.tune.measure import Measurer
    from vsup.tune.search import SearchResult

    tune = _Tune(args, home, guard, base, space, cands, runnable, rungs, workload, slo)
    client, daemon_was_running = connect_for_run(home)
    started_at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    with client:
        original, out_dir, cand_paths, runner = _prepare(tune, client, daemon_was_running)
        order = [c.index for c in runnable]
        measurer = Measurer(runner, workload, slo, out_dir, order, cand_paths, say=_say)
        progress = _Progress(tune, runner, measurer)
        interrupted = False
        result = SearchResult([], [], {}, {}, False)
        if runner.publisher is not None:
            runner.publisher.start()
        try:
            interrupted = _search(tune, runner, progress, result)
        finally:
            # from here on a signal only says to wait: the original must come back
            runner.restoring = True
            runner.progress.clear()
            runner.close_clients()
            doc = _report(tune, progress, result, original, out_dir, started_at, interrupted)
            restore = _restore(tune, runner, doc, original, cand_paths, interrupted)
        if doc is None:
            raise CommandFailed(f"vsup tune: no report; restore: {restore.get('outcome')}", 1)
        doc["restore"] = restore
        guard.restoring = True
        if restore.get("outcome") != "failed":
            guard.release()
    return _finish(args, doc, cands, out_dir, base)


def _prepare(
    tune: _Tune, client: Client, daemon_was_running: bool
) -> tuple[Original, Path, dict[int, Path], TuneRunner]:
    """The original layout, the output folder with every candidate's layout in it, and the
    runner, with the lease claimed; a refusal or an interrupt releases what was taken."""
    from vsup.bench.guard import Interrupted
    from vsup.commands.bench import stop_daemon_started
    from vsup.commands.cliutil import CommandFailed

    try:
        original = _original(tune, client, daemon_was_running)
        out_dir = _out_dir(tune)
        tune.guard.log_to(out_dir / "tune.log")
        cand_paths = {}
        for c in tune.cands:
            cand_paths[c.index] = out_dir / "candidates" / f"{c.name}.toml"
            cand_paths[c.index].write_text(c.toml)
        runner = _runner(tune, client, out_dir)
        tune.guard.claim(original.to_json(), [(c.name, c.toml) for c in tune.runnable])
    except (Interrupted, CommandFailed):
        tune.guard.release()
        if not daemon_was_running:
            stop_daemon_started(tune.home, client)
        raise
    return original, out_dir, cand_paths, runner


def _original(tune: _Tune, client: Client, daemon_was_running: bool) -> Original:
    """The layout the daemon runs now, to come back at the end; asks before replacing
    instances that serve (unless --yes)."""
    from vsup.bench.runner import Original
    from vsup.commands.bench import confirm, refuse_while_left_behind
    from vsup.commands.cliutil import CommandFailed
    from vsup.states import IDLE, SERVING

    current = client.layout()
    try:
        refuse_while_left_behind(tune.home, current.toml)
    except CommandFailed as exc:
        raise CommandFailed(str(exc).replace("vsup bench: ", "vsup tune: ", 1), 1) from None
    before = {i.name: i.lifecycle.state for i in client.status().instances}
    serving = [n for n, state in before.items() if state in SERVING]
    original = Original(
        toml=current.toml,
        path=current.path,
        name=current.name,
        serving=serving,
        daemon_was_running=daemon_was_running,
        idle=[n for n, state in before.items() if state in IDLE],
    )
    if original.name or serving:
        after = "the best layout stays (--apply)" if tune.args.apply else "it comes back"
        _say(f"this replaces layout {original.name or '(unnamed)'} while it runs; {after}")
    if serving and not tune.args.yes:
        confirm(serving)
    return original


def _out_dir(tune: _Tune) -> Path:
    """--out-dir, or a dated folder under VSUP_HOME/tune; made, with its candidates/."""
    from datetime import UTC, datetime
    from pathlib import Path

    args = tune.args
    out_dir = (
        Path(args.out_dir).expanduser().absolute()
        if args.out_dir
        else tune.home / "tune" / datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    )
    (out_dir / "candidates").mkdir(parents=True, exist_ok=True)
    return out_dir


def _runner(tune: _Tune, client: Client, out_dir: Path) -> TuneRunner:
    from vsup.bench.publish import ProgressPublisher
    from vsup.control.client import Client
    from vsup.tune.measure import TuneRunner

    home = tune.home
    return TuneRunner(
        client=client,
        make_client=lambda: Client(home),
        workload=tune.workload,
        out_dir=out_dir,
        ready_timeout=tune.args.timeout,
        run_timeout=tune.args.run_timeout,
        say=_say,
        publisher=ProgressPublisher(lambda: Client(home), tool="tune"),
        guard=tune.guard,
    )


class _Progress:
    """The search's `measure`: says where the search is, measures the step, says how it went.
    `cursor` names the step being measured (an interrupt cuts it); `steps` are those done."""

    def __init__(self, tune: _Tune, runner: TuneRunner, measurer: Measurer) -> None:
        import time

        self.tune = tune
        self.runner = runner
        self.measurer = measurer
        self.steps: list[Step] = []
        self.t0 = time.monotonic()
        self.done: set[int] = set()
        self.cursor: dict[str, int] = {}

    def __call__(self, cand: Candidate, rung: int, prompts: int, repeat: int) -> Step:
        import time

        from vsup.tune.search import eta_seconds, eta_text

        args, runnable, rungs = self.tune.args, self.tune.runnable, self.tune.rungs
        # first of all: an interrupt from here on cuts this step, and the JSON says so
        self.cursor.update(index=cand.index, rung=rung, prompts=prompts, repeat=repeat)
        position = runnable.index(cand) + 1
        self.done.add(cand.index)
        elapsed = time.monotonic() - self.t0
        per = elapsed / (len(self.done) - 1) if len(self.done) > 1 else None
        left = eta_seconds(len(runnable) - position + 1, per, args.budget, elapsed)
        if self.runner.publisher is not None:
            self.runner.publisher.eta(left)  # the dashboard's `~12m left`
        rep = f", repeat {repeat + 1}/{args.repeats}" if rung == len(rungs) - 1 else ""
        _say(
            f"candidate {position}/{len(runnable)} {cand.name}: rung {rung + 1}/{len(rungs)} "
            f"({prompts} prompts{rep}); elapsed {_dur(elapsed)}, {eta_text(left)}"
        )
        step = self.measurer(cand, rung, prompts, repeat)
        self.steps.append(step)
        self.cursor.clear()  # measured: an interrupt from here on cuts no step
        verdict = "meets the SLO" if step.slo_met else "breaks the SLO"
        score = "-" if step.score is None else f"{step.score:.2f}"
        verdict = verdict if self.tune.slo else ""
        _say(f"  {cand.name}: {step.outcome}, score {score}, {verdict}".rstrip(", "))
        return step


def _search(tune: _Tune, runner: TuneRunner, progress: _Progress, result: SearchResult) -> bool:
    """Run the search into `result`; True when Ctrl-C or SIGTERM cut it (the step it cut is
    recorded as interrupted and the clients are stopped)."""
    from vsup.tune.search import DEFAULT_MARGIN, Halving, Step, run_search

    args = tune.args
    halving = Halving(tune.rungs, eta=args.eta, margin=DEFAULT_MARGIN)
    try:
        run_search(
            tune.runnable,
            progress,
            halving,
            repeats=args.repeats,
            budget_s=args.budget,
            into=result,
        )
        if result.budget_hit:
            _say("the time budget ran out: the candidates left are not started")
    except KeyboardInterrupt as exc:
        runner.restoring = True  # a second signal must not cut the clean-up short
        why = getattr(exc, "why", None) or "interrupted (Ctrl-C or SIGTERM)"
        run: dict[str, Any] = {"outcome": "interrupted", "problems": [why]}
        if runner.runs and runner.runs[-1]["outcome"] == "running":
            run = runner.runs[-1]
            run["outcome"] = "interrupted"
            run["problems"].append(why)
        cursor = progress.cursor
        if cursor:
            at = (cursor["index"], cursor["rung"], cursor["prompts"], cursor["repeat"])
            progress.steps.append(Step(*at, "interrupted", None, False, 0.0, None, run))
        _say(f"{why}: stopping the clients, then restoring the original layout")
        runner._abort_current()
        return True
    return False


def _report(
    tune: _Tune,
    progress: _Progress,
    result: SearchResult,
    original: Original,
    out_dir: Path,
    started_at: str,
    interrupted: bool,
) -> dict[str, Any] | None:
    """The report document, or None when building it failed (the restore goes on)."""
    import socket

    from vsup import __version__

    t = tune
    try:
        header = _header(
            t.args, t.base, t.space, t.rungs, t.workload, started_at, progress.t0, __version__
        )
        header["host"] = socket.gethostname()
        header["interrupted"] = interrupted
        header["search"]["budget_hit"] = result.budget_hit
        header["original_layout"] = {"name": original.name, "path": original.path}
        header["out_dir"] = str(out_dir)
        return _document(header, t.cands, progress.steps, result, t.slo, t.rungs, t.args)
    except Exception as exc:  # a report that fails must not keep the original away
        _say(f"could not build the report ({exc!r}); restoring all the same")
        return None


def _restore(
    tune: _Tune,
    runner: TuneRunner,
    doc: dict[str, Any] | None,
    original: Original,
    cand_paths: dict[int, Path],
    interrupted: bool,
) -> dict[str, Any]:
    """Bring the original layout back (with --apply and a best one: leave that running)."""
    from vsup.bench.runner import Original

    restore_to = original
    if tune.args.apply and doc is not None and doc["best"] and not interrupted:
        best = next(c for c in tune.cands if c.index == doc["best"]["index"])
        _say(f"--apply: leaving the best layout {best.name} running")
        restore_to = Original(
            toml=best.toml,
            path=str(cand_paths[best.index]),
            name=best.name,
            serving=[s.name for s in best.specs],
            daemon_was_running=True,
        )
    try:
        return runner.restore(restore_to)
    finally:
        if runner.publisher is not None:
            runner.publisher.close()


def _dur(seconds: float) -> str:
    from vsup.progress import fmt_duration

    return fmt_duration(seconds)


def _header(
    args: argparse.Namespace,
    base: Base,
    space: Any,
    rungs: list[int],
    workload: Any,
    started_at: str,
    t0: float,
    version: str,
) -> dict[str, Any]:
    import time
    from datetime import UTC, datetime

    from vsup.tune.search import DEFAULT_MARGIN

    return {
        "kind": "vsup-tune",
        "vsup_version": version,
        "started_at": started_at,
        "ended_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "base_layout": {"name": base.name, "path": str(base.path)},
        "workload": workload.to_json(),
        "seed": workload.seed,
        "space": space.to_json(),
        "search": {
            "method": "asynchronous successive halving (each candidate started once)",
            "eta": args.eta,
            "margin": DEFAULT_MARGIN,
            "rungs": rungs,
            "repeats": args.repeats,
            "budget_s": args.budget,
            "elapsed_s": round(time.monotonic() - t0, 1),
        },
    }


def _document(
    header: dict[str, Any],
    cands: list[Any],
    steps: list[Any],
    result: Any,
    slo: Any,
    rungs: list[int],
    args: argparse.Namespace,
) -> dict[str, Any]:
    from vsup.tune.report import build_document
    from vsup.tune.search import DEFAULT_MARGIN

    versions = {
        (i.get("client") or {}).get("vllm_version")
        for s in steps
        for i in s.result.get("instances", ())
    }
    header["vllm_version"] = ", ".join(sorted(v for v in versions if v)) or None
    return build_document(
        header=header,
        candidates=cands,
        steps=steps,
        result=result,
        slo=slo,
        rungs=rungs,
        repeats=args.repeats,
        margin=DEFAULT_MARGIN,
    )


def _finish(
    args: argparse.Namespace, doc: dict[str, Any], cands: list[Any], out_dir: Path, base: Base
) -> int:
    from pathlib import Path

    from vsup.commands.bench import write_file
    from vsup.tune.report import (
        dump_json,
        render_markdown,
        render_svg,
        render_table,
        render_terminal_plot,
        write_png,
    )

    write_file(out_dir / "result.json", dump_json(doc))
    write_file(out_dir / "pareto.svg", render_svg(doc))
    sys.stdout.write(render_table(doc))
    sys.stdout.write("\n" + render_terminal_plot(doc))
    for opt, text in (("json", dump_json(doc)), ("markdown", render_markdown(doc))):
        target = getattr(args, opt)
        if target:
            write_file(Path(target).expanduser().absolute(), text)
            _say(f"wrote {target}")
    if args.plot:
        target = str(Path(args.plot).expanduser().absolute())
        if target.endswith(".png"):
            write_png(doc, target)
        else:
            write_file(Path(target), render_svg(doc))
        _say(f"wrote {args.plot}")
    written = True
    if args.output and doc["best"]:
        written = write_best(args.output, doc, cands)
    elif args.output:
        _say(f"no candidate met the SLO: {args.output} was not written")
    _say(f"candidates, client logs and results in {out_dir}")
    if doc["restore"].get("outcome") == "failed":
        _say("the original layout is not back; run `vsup bench --restore` once the daemon answers")
    if doc["interrupted"]:
        return 130
    restored = doc["restore"].get("outcome") in (
        "restored",
        "stopped",
        "daemon_stopped",
        "untouched",
    )
    return 0 if doc["best"] and restored and written else 1


def write_best(target: str, doc: dict[str, Any], cands: list[Any]) -> bool:
    """Write the best layout with its comment block, after validating the very text written."""
    from pathlib import Path

    from vsup.commands.bench import write_file
    from vsup.layout.compiled import compile_layout
    from vsup.telemetry.gpu import node_facts
    from vsup.tune.report import best_layout_text

    path = Path(target).expanduser().absolute()
    best = next(c for c in cands if c.index == doc["best"]["index"])
    text = best_layout_text(doc, best.toml, target)
    compiled, diagnostics = compile_layout(text, path, node_facts())
    if compiled is None:
        errors = "; ".join(d.format() for d in diagnostics if d.is_error)
        _say(f"the best layout does not validate as written ({errors}); {target} not written")
        return False
    write_file(path, text)
    _say(f"wrote the best layout {best.name} to {target} (not applied)")
    return True
