"""`vsup pull LAYOUT | --model ID [--revision R]`: a hub model's files into this node's cache.

Runs in the terminal (no daemon needed): asks the hub which files the revision has, keeps the
ones vLLM loads (docs/pull.md), checks the cache's disk, then downloads with huggingface_hub,
showing bytes, rate and ETA per file and in total. Several instances naming one model pull it
once. Ctrl-C stops it: the files finished stay in the cache and `vsup pull` again fetches only
the rest. `vsup up` pulls what is missing by itself, in the daemon (which outlives the SSH
session); `vsup pull` is for getting a node ready ahead of time, or moving to the hub's latest
commit of a branch.

Exit status (`exits.py`): 0 pulled; 1 a pull failed (the reason is printed); 2 bad input (an
invalid layout, no hub model in it); 130 interrupted (Ctrl-C).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from vsup.commands.exits import BAD_INPUT, FAILED, INTERRUPTED, OK
from vsup.states import FileState


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "pull",
        help="download a layout's hub models (only the files vLLM loads) into this node's cache",
        description=__doc__.splitlines()[0],
    )
    p.add_argument("layout", nargs="?", metavar="LAYOUT", help="pull every hub model it names")
    p.add_argument("--model", metavar="ID", help="pull this hub model instead of a layout's")
    p.add_argument("--revision", metavar="R", help="with --model: branch, tag or commit")
    p.add_argument(
        "--cache-dir",
        metavar="DIR",
        help="with --model: the Hugging Face cache to fill (default: HF_HUB_CACHE, HF_HOME/hub, "
        "~/.cache/huggingface/hub)",
    )
    p.add_argument(
        "--token-env",
        metavar="VAR",
        help="with --model: the variable holding the token for a gated or private model "
        "(default: HF_TOKEN or `hf auth login`)",
    )
    p.add_argument("--load-format", metavar="F", help="with --model: vLLM's --load-format")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="say what would be fetched and whether it fits on the disk; download nothing",
    )
    p.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    p.add_argument(
        "--workers", type=int, default=8, metavar="N", help="files downloaded at once (8)"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from vsup.pull.errors import CANCELLED, PullError

    try:
        targets = _targets(args)
    except _BadInput as exc:
        print(f"vsup pull: {exc}", file=sys.stderr)
        return BAD_INPUT
    results: list[dict[str, Any]] = []
    code = OK
    for target in targets:
        try:
            results.append(_pull_one(target, args))
        except PullError as exc:
            results.append({"model": target.model, "reason": exc.reason, "error": exc.message})
            if exc.reason == CANCELLED:
                print(f"vsup pull: {target.label}: {exc.message}", file=sys.stderr)
                code = INTERRUPTED
                break
            print(f"vsup pull: {target.label}: {exc.message}", file=sys.stderr)
            code = FAILED
    if args.json:
        print(json.dumps(results, indent=1))
    return code


class _BadInput(Exception):
    pass


def _targets(args: argparse.Namespace) -> list[Any]:
    import os
    from pathlib import Path

    from vsup.layout.diagnostics import ERROR, WARNING
    from vsup.pull import cache as cache_mod
    from vsup.pull.targets import PullTarget, group, pulls_hub_model, target_of, wants_pull

    if args.workers < 1:
        raise _BadInput("--workers must be 1 or more")
    if bool(args.layout) == bool(args.model):
        raise _BadInput("name a LAYOUT or a --model ID (one of them)")
    if args.model:
        cache_dir = (
            Path(args.cache_dir).expanduser()
            if args.cache_dir
            else cache_mod.hub_cache_dir(os.environ)
        )
        return [
            PullTarget(args.model, args.revision, cache_dir, args.load_format, args.token_env, ())
        ]
    if args.revision or args.cache_dir or args.token_env or args.load_format:
        raise _BadInput(
            "--revision, --cache-dir, --token-env and --load-format go with --model; a layout "
            "says them with its keys (revision, env HF_HOME, hf_token_env, args load-format)"
        )
    from vsup.commands.cliutil import compile_here, print_diagnostics

    path = Path(args.layout).expanduser().absolute()
    compiled, diagnostics = compile_here(path)
    print_diagnostics([d for d in diagnostics if not d.is_error])
    if compiled is None:
        print_diagnostics([d for d in diagnostics if d.is_error])
        raise _BadInput(f"{path} is not valid; nothing was pulled")
    specs = compiled.specs
    # as for `vsup up`: local paths, `pull = false` and instances whose env sets HF_HUB_OFFLINE
    # are left out (the daemon's own HF_HUB_OFFLINE is this process's: the pull says `offline`)
    hub_specs = [s for s in specs if wants_pull(s, {})]
    offline = [s for s in specs if pulls_hub_model(s) and not wants_pull(s, {})]
    if not hub_specs:
        print_diagnostics(_offline_diagnostics(compiled, offline, ERROR))
        raise _BadInput(
            f"{path} names no hub model to pull (local paths, instances with pull = false and "
            "instances whose env sets HF_HUB_OFFLINE are left out)"
        )
    print_diagnostics(_offline_diagnostics(compiled, offline, WARNING))
    return group(target_of(s) for s in hub_specs)


def _offline_diagnostics(compiled: Any, specs: list[Any], severity: str) -> list[Any]:
    """Why each instance's hub model is not pulled (its env sets HF_HUB_OFFLINE, and where),
    and what to do: pull it by hand, or let vsup pull it."""
    import shlex

    from vsup.layout.diagnostics import Diagnostic, merge_repeats
    from vsup.layout.merge import merge_instances, profile_cache_for
    from vsup.pull.targets import target_of

    merged = {
        m.name: m
        for m in merge_instances(compiled.layout, profile_cache_for(compiled.layout, None))
    }
    out = []
    for spec in specs:
        m = merged.get(spec.name)
        origin = m.origin("env", "HF_HUB_OFFLINE") if m is not None else None
        here = origin is not None and origin.file == compiled.path
        where = "" if origin is None or here else f" (set in {origin.label}: {origin.file})"
        target = target_of(spec)
        command = ["vsup", "pull", "--model", spec.model]
        if target.revision:
            command += ["--revision", target.revision]
        command += ["--cache-dir", str(target.cache_dir)]
        value = spec.env.get("HF_HUB_OFFLINE")
        message = (
            f'HF_HUB_OFFLINE = "{value}"{where} tells vsup not to ask the hub, so it pulls '
            f"{spec.model} neither here nor in `vsup up` (vLLM looks for it in the cache, "
            f"offline): pull it by hand with `{shlex.join(command)}`, or write "
            'env = { HF_HUB_OFFLINE = "0" } in [defaults] or the instance, and vsup pulls it '
            "here and in `vsup up`"
        )
        line = origin.line if origin is not None and here else None
        out.append(
            Diagnostic(
                severity,
                message,
                file=compiled.path,
                line=line,
                instance=spec.name,
                key="env.HF_HUB_OFFLINE",
            )
        )
    return merge_repeats(out)


def _pull_one(target: Any, args: argparse.Namespace) -> dict[str, Any]:
    import shutil

    from vsup.pull import cache as cache_mod
    from vsup.pull.run import plan_pull, pull_model
    from vsup.pull.targets import token_for

    token = token_for(target)
    req = target.request()
    who = f" for {', '.join(target.instances)}" if target.instances else ""
    if args.dry_run:
        plan = plan_pull(req, token)
        _print_plan(plan, who, sys.stderr)
        free = shutil.disk_usage(cache_mod.existing_parent(req.cache_dir)).free
        fits = "fits" if plan.state.bytes_to_fetch <= free else "does NOT fit"
        print(
            f"  {cache_mod.human_bytes(plan.state.bytes_to_fetch)} to fetch {fits} in "
            f"{cache_mod.human_bytes(free)} free under {req.cache_dir}",
            file=sys.stderr,
        )
        return plan.to_json()
    display = PullDisplay(target.label + who)

    def on_plan(plan: Any) -> None:
        _print_plan(plan, who, sys.stderr)
        display.start(plan)

    try:
        result = pull_model(
            req,
            token,
            on_plan=on_plan,
            on_progress=display.update,
            workers=args.workers,
        )
    finally:
        display.stop()
    print(
        f"{target.label}: {len(result.plan.selection.files)} files "
        f"({cache_mod.human_bytes(result.plan.selection.total_bytes)}) in {result.snapshot}; "
        f"fetched {cache_mod.human_bytes(result.fetched_bytes)} in {result.elapsed_s:.1f} s",
        file=sys.stderr,
    )
    return result.to_json()


def _print_plan(plan: Any, who: str, stream: Any) -> None:
    from vsup.pullview import human_bytes

    sel = plan.selection
    weights = {
        "safetensors": "safetensors weights",
        "mistral": "Mistral-format (consolidated) weights",
        "bin": "PyTorch .bin weights",
        "pt": ".pt weights",
        "none": "no weights",
        "all": "every file",
    }.get(sel.weights, sel.weights)
    print(
        f"{plan.request.label}{who}: commit {plan.listing.commit[:12]}, {len(sel.files)} files "
        f"({weights}), {human_bytes(sel.total_bytes)}; "
        f"{human_bytes(plan.state.bytes_to_fetch)} to fetch into {plan.request.cache_dir}",
        file=stream,
    )
    if sel.left_out:
        shown = ", ".join(sel.left_out[:6]) + (" ..." if len(sel.left_out) > 6 else "")
        print(f"  left on the hub (vLLM does not load them): {shown}", file=stream)
    if sel.note:
        print(f"  note: {sel.note}", file=stream)


class PullDisplay:
    """Progress of one pull on the terminal: a bar in total and one per file in flight
    (bytes, rate, ETA), or on a pipe a line every 10 s and one per file done."""

    LINE_EVERY_S = 10.0

    def __init__(self, label: str, stream: Any = None) -> None:
        self.label = label
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._progress: Any = None
        self._tasks: dict[str, Any] = {}
        self._total: Any = None
        self._last_line = 0.0
        self._done: set[str] = set()

    def start(self, plan: Any = None) -> None:
        if not self.tty or self._progress is not None:
            return
        from rich.console import Console
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn

        # rate and ETA are vsup's (the figures status JSON and the dashboard show)
        self._progress = Progress(
            TextColumn("{task.description}", style="bold"),
            BarColumn(bar_width=30),
            DownloadColumn(binary_units=True),
            TextColumn("{task.fields[rate]:>11}"),
            TextColumn("{task.fields[eta]}"),
            console=Console(file=self.stream),
            transient=False,
            refresh_per_second=4,
        )
        self._progress.start()

    def update(self, report: Any) -> None:
        """Take a ProgressReport (or its JSON, as status gives it)."""
        doc = report.to_json() if hasattr(report, "to_json") else report
        if self.tty:
            self.start()
            self._update_bars(doc)
        else:
            self._update_lines(doc)

    def _update_bars(self, doc: dict[str, Any]) -> None:
        p = self._progress
        if self._total is None:
            self._total = p.add_task(
                f"total {self.label}", total=doc.get("bytes_total") or None, rate="", eta=""
            )
        # the total is known once the hub's file list came (a daemon's pull reports it later)
        p.update(
            self._total,
            total=doc.get("bytes_total") or None,
            completed=doc.get("bytes_done") or 0,
            **_rate_eta(doc),
        )
        for f in doc.get("files") or ():
            name, state = f["name"], f["state"]
            if state == FileState.FETCHING and name not in self._tasks and name not in self._done:
                self._tasks[name] = p.add_task(
                    f"  {_short(name)}", total=f.get("size") or None, rate="", eta=""
                )
            task = self._tasks.get(name)
            if task is None:
                continue
            if state in (FileState.DONE, FileState.CACHED, FileState.FAILED):
                self._done.add(name)
                p.remove_task(self._tasks.pop(name))
            else:
                p.update(task, completed=f.get("done") or 0, **_rate_eta(f))

    def _update_lines(self, doc: dict[str, Any]) -> None:
        from vsup.pullview import human_bytes

        for f in doc.get("files") or ():
            if f["state"] == FileState.DONE and f["name"] not in self._done:
                self._done.add(f["name"])
                print(f"fetched {f['name']} ({human_bytes(f.get('size'))})", file=self.stream)
        now = time.monotonic()
        if now - self._last_line < self.LINE_EVERY_S:
            return
        self._last_line = now
        print(progress_line(self.label, doc), file=self.stream, flush=True)

    def stop(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


def progress_line(label: str, doc: dict[str, Any]) -> str:
    """`org/name for a, b: 3.2 GiB/15.0 GiB (21%), 85.0 MiB/s, ETA 2m21s, 2/5 files`."""
    from vsup.pullview import pull_line

    line = pull_line({**doc, "model": label, "revision": None, "instances": (), "state": "pulling"})
    return line.removeprefix("PULL ")


def _rate_eta(doc: dict[str, Any]) -> dict[str, str]:
    from vsup.pullview import duration, human_bytes

    rate, eta = doc.get("rate_bps"), doc.get("eta_s")
    return {
        "rate": f"{human_bytes(rate)}/s" if rate else "",
        "eta": f"ETA {duration(eta)}" if eta is not None and rate else "",
    }


def _short(name: str, width: int = 40) -> str:
    return name if len(name) <= width else "…" + name[-(width - 1) :]
