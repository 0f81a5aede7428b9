"""`vsup plan`: write a layout for one model on this node's GPUs and print its memory budget.

A hub id without local files is sized from its config.json and safetensors headers, fetched
from the hub (never the weights) and cached under $VSUP_HOME/cache/hub.

With `-o FILE` the layout goes to FILE and the budget to stdout; without it the layout goes to
stdout and the budget to stderr, so `vsup plan ... > layout.toml` works. Exit 2 when the plan
is impossible (an instance could not hold one full-length request, unknown sizes, bad flags).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from vsup.layout.diagnostics import Diagnostic
    from vsup.layout.node import NodeFacts
    from vsup.layout.plan import Plan, PlanRequest

GPU_CHOICES = ("MI300X", "MI325X", "MI355X", "H200", "H100")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan",
        help="write a layout for one model and print the per-GPU memory budget",
        description=__doc__.splitlines()[0],
    )
    _what_arguments(p)
    _size_arguments(p)
    _sleep_arguments(p)
    _output_arguments(p)
    p.set_defaults(func=run)


def _what_arguments(p: argparse.ArgumentParser) -> None:
    """What to plan: the model and the shape of its instances on the GPUs."""
    p.add_argument("--model", required=True, help="hub id (org/name) or a local model directory")
    p.add_argument("--gpus", required=True, help="'all' or GPU indices: 0,1,2 or 0-7")
    p.add_argument(
        "--per-gpu",
        type=int,
        default=1,
        metavar="N",
        help="instances per GPU (or per TP group); default 1",
    )
    p.add_argument(
        "--tp",
        type=int,
        default=1,
        metavar="N",
        help="tensor-parallel size; groups of N consecutive GPUs",
    )
    p.add_argument(
        "--dp",
        type=int,
        default=1,
        metavar="N",
        help="data-parallel ranks per instance: one server (one port) over TP x N GPUs",
    )
    p.add_argument(
        "--port-base",
        type=int,
        default=8000,
        metavar="P",
        help="first port; instances count up from it",
    )
    p.add_argument(
        "--profile",
        nargs="+",
        metavar="NAME",
        help="profiles to list in the layout (default: the GPU's platform profile)",
    )


def _size_arguments(p: argparse.ArgumentParser) -> None:
    """What to size it for: the GPU, the model's size and the memory each instance takes."""
    p.add_argument(
        "--gpu",
        type=str.upper,
        choices=GPU_CHOICES,
        help="size for this GPU instead of this node's",
    )
    p.add_argument(
        "--gpu-mem-gib",
        type=float,
        metavar="G",
        help="memory of one GPU in GiB (overrides --gpu and the probe)",
    )
    p.add_argument(
        "--params",
        type=float,
        metavar="B",
        help="parameters in billions, for a model without local files",
    )
    p.add_argument(
        "--dtype",
        metavar="D",
        help="weight dtype or quantization: bfloat16, float16, float32, fp8, int8, int4, awq, gptq",
    )
    p.add_argument(
        "--max-model-len",
        type=int,
        metavar="L",
        help="context length every instance must hold (default: the model's)",
    )
    p.add_argument(
        "--kv-cache-dtype",
        metavar="D",
        help="e.g. fp8: halves the KV bytes per token (written into args)",
    )
    p.add_argument(
        "--utilization",
        type=float,
        default=0.90,
        metavar="U",
        help="share of each GPU for all its instances (default 0.90, at most 0.95)",
    )


def _sleep_arguments(p: argparse.ArgumentParser) -> None:
    """Time sharing: instances of a GPU that take turns with vLLM's sleep mode."""
    p.add_argument(
        "--time-share",
        action="store_true",
        help="the --per-gpu instances of each GPU take turns with vLLM's sleep mode: one swap "
        "group, one awake at a time, each with the whole --utilization (docs/layout.md)",
    )
    p.add_argument(
        "--sleep-level",
        type=int,
        choices=(1, 2),
        default=1,
        help="with --time-share: 1 keeps a sleeper's weights in host RAM (a wake takes "
        "seconds), 2 drops them (a wake reloads them); default 1",
    )
    p.add_argument(
        "--host-ram-gib",
        type=float,
        metavar="G",
        help="the node's RAM in GiB for the level-1 sleepers' weights (default: this node's)",
    )


def _output_arguments(p: argparse.ArgumentParser) -> None:
    """The layout's name, what is printed and where the layout goes."""
    p.add_argument("--name", help="the layout's name (default: from the model and shape)")
    p.add_argument(
        "--explain",
        action="store_true",
        help="also print each GPU's memory item by item (weights, activation/graph reserve, KV, "
        "what is left) and why each number is what it is",
    )
    p.add_argument(
        "--offline",
        action="store_true",
        help="never ask the hub for a hub id's config (the local caches only)",
    )
    p.add_argument("-o", "--output", metavar="FILE", help="write the layout here (default: stdout)")


def run(args: argparse.Namespace) -> int:
    from vsup.commands.exits import BAD_INPUT
    from vsup.layout.plan import PlanError, make_plan, parse_gpus
    from vsup.telemetry.gpu import node_facts

    out_path = Path(args.output) if args.output else None
    node = node_facts()
    # sized for a GPU named on the command line: a plan for another node's GPUs
    other_node = (
        "--gpu-mem-gib" if args.gpu_mem_gib else (f"--gpu {args.gpu}" if args.gpu else None)
    )
    try:
        gpus = parse_gpus(args.gpus, node.gpu_count, other_node)
        plan = make_plan(_request(args, gpus, node), base_dir=Path.cwd(), out_path=out_path)
    except PlanError as exc:
        print(f"vsup plan: {exc}", file=sys.stderr)
        return BAD_INPUT
    report = sys.stdout if out_path else sys.stderr
    _print_budget(args, plan, node, gpus, other_node, report)
    if not plan.ok:
        for problem in plan.problems:
            print(f"vsup plan: refused: {problem}", file=sys.stderr)
        return BAD_INPUT
    return _check_and_write(args, plan, node, gpus, out_path, report)


def _request(args: argparse.Namespace, gpus: list[int], node: NodeFacts) -> PlanRequest:
    from vsup.layout.node import GIB
    from vsup.layout.plan import PlanRequest

    return PlanRequest(
        model=args.model,
        gpus=gpus,
        per_gpu=args.per_gpu,
        tp=args.tp,
        dp=args.dp,
        port_base=args.port_base,
        profiles=args.profile,
        gpu=args.gpu,
        gpu_memory_bytes=int(args.gpu_mem_gib * GIB) if args.gpu_mem_gib else None,
        params=args.params * 1e9 if args.params else None,
        dtype=args.dtype,
        max_model_len=args.max_model_len,
        utilization=args.utilization,
        kv_cache_dtype=args.kv_cache_dtype,
        name=args.name,
        hub=not args.offline,
        node=node,
        time_share=args.time_share,
        sleep_level=args.sleep_level,
        host_memory_bytes=int(args.host_ram_gib * GIB) if args.host_ram_gib else None,
    )


def _print_budget(
    args: argparse.Namespace,
    plan: Plan,
    node: NodeFacts,
    gpus: list[int],
    other_node: str | None,
    report: TextIO,
) -> None:
    """The budget (and with --explain each GPU item by item) on `report`."""
    from vsup.layout.plan import render_budget, render_explain

    print(render_budget(plan), file=report, end="")
    if args.gpus.strip() == "all" and not node.gpu_count:
        print(
            f"note: --gpus all: no GPU on this machine; planned for a node of {len(gpus)} GPUs "
            f"({other_node}); list them (--gpus 0-3) for another count",
            file=report,
        )
    if args.explain:
        print("", file=report)
        print(render_explain(plan), file=report, end="")


def _check_and_write(
    args: argparse.Namespace,
    plan: Plan,
    node: NodeFacts,
    gpus: list[int],
    out_path: Path | None,
    report: TextIO,
) -> int:
    """Validate the planned layout on a node with the planned GPUs, then write it (to -o's
    file, or stdout); the exit status."""
    from vsup.commands.exits import BAD_INPUT, FAILED, OK
    from vsup.layout.compiled import compile_document
    from vsup.layout.diagnostics import LayoutError
    from vsup.layout.model import dumps_layout
    from vsup.layout.store import save_layout

    # Without -o the layout has no file: its diagnostics name none (make_plan's placeholder
    # path does not exist). Relative model paths stay relative to the working directory.
    layout = plan.layout if out_path else replace(plan.layout, path=None)
    compiled, diagnostics = compile_document(layout, _target_node(plan, node, gpus))
    diagnostics = [_elsewhere(d, args.model) for d in diagnostics]
    for d in diagnostics:
        print(d.format() if d.file else f"planned layout: {d.format()}", file=sys.stderr)
    if any(d.is_error for d in diagnostics):
        unwritten = f"; nothing written to {out_path}" if out_path else ""
        print(
            f"vsup plan: the planned layout does not validate (see above){unwritten}",
            file=sys.stderr,
        )
        return BAD_INPUT
    if out_path is None:
        sys.stdout.write(compiled.text if compiled else dumps_layout(layout))
        return OK
    try:
        # `-o` names the file the operator asked for: its directory is made like `mkdir -p`.
        # It was checked just now against the same node: saving need not validate again.
        save_layout(layout, out_path, parents=True, check=False)
    except LayoutError as exc:
        print(f"vsup plan: {exc}", file=sys.stderr)
        return BAD_INPUT
    except OSError as exc:
        print(f"vsup plan: cannot write {out_path}: {exc}", file=sys.stderr)
        return FAILED
    print(f"wrote {out_path} ({len(plan.budgets)} instances)", file=report)
    return OK


def _target_node(plan: Plan, node: NodeFacts, gpus: list[int]) -> NodeFacts:
    """The plan may be for GPUs this node lacks (--gpu H200 on a laptop): it is checked
    against a node that has them, of the memory it was sized for."""
    from vsup.layout.node import NodeFacts, NodeGpu

    count = max(node.gpu_count or 0, max(gpus) + 1)
    names = {g.index: g.name for g in node.gpus}
    return NodeFacts(
        tuple(NodeGpu(i, names.get(i), plan.gpu_memory_bytes, node.vendor) for i in range(count)),
        probed=False,
        host_memory_bytes=plan.host_memory_bytes,
    )


def _elsewhere(d: Diagnostic, model: str) -> Diagnostic:
    """`d`, a warning instead when it is the validation's error about a local model directory
    without weights: a plan is sized from the config alone (planning for another node from a
    copy of its config.json), and the weights are the node's that runs the layout, where
    `vsup validate` and `vsup up` check them."""
    from vsup.layout.diagnostics import WARNING
    from vsup.layout.modelpath import is_local_model

    if not (d.is_error and d.key == "model" and is_local_model(model)):
        return d
    if "has no weights" not in d.message or "no config.json" in d.message:
        return d
    where = d.message.split(" has ", 1)[0].removeprefix("local model directory ")
    message = (
        f"local model directory {where} has no weights on this machine: the layout is written "
        "for a node that has them there (vsup validate on that node checks it)"
    )
    return replace(d, severity=WARNING, message=message)
