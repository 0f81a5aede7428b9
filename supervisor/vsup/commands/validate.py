"""`vsup validate LAYOUT.. [--node-gpus N]`: every error at once, warnings on stderr.

Each layout is compiled as `vsup up` compiles it (`vsup.layout.compile_document`), against this
node's GPUs as the telemetry probe finds them, or a node of N GPUs with `--node-gpus N`.
Exit 0 when every layout is valid (warnings may still be printed on stderr), 2 when any has
errors. Each line reads `FILE:LINE: error: instance 'gpu0': key 'port': ... (what to change)`;
with several layouts, a problem found in another file (a profile) is prefixed with the layout
it concerns, and each layout ends with its own summary line. A valid layout's swap groups
(instances that time-share GPUs with vLLM's sleep mode) follow it, one line each.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vsup.layout.node import NodeFacts


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "validate",
        help="check layouts: exit 0 if all are valid (warnings on stderr), 2 with every error",
        description=__doc__.splitlines()[0],
    )
    p.add_argument("layouts", nargs="+", metavar="LAYOUT", help="layout TOML files")
    p.add_argument(
        "--node-gpus",
        type=int,
        metavar="N",
        help="check GPU indices against a node with N GPUs (default: this node's GPUs)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print the result as JSON on stdout (several layouts: {'valid', 'layouts': [...]})",
    )
    p.set_defaults(func=run)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"


def run(args: argparse.Namespace) -> int:
    from vsup.commands.exits import BAD_INPUT, OK
    from vsup.layout.node import NodeFacts

    if args.node_gpus is not None and args.node_gpus < 0:
        print("vsup validate: --node-gpus must be 0 or more", file=sys.stderr)
        return BAD_INPUT
    if args.node_gpus is not None:
        node = NodeFacts.given(args.node_gpus)
    else:
        from vsup.telemetry.gpu import node_facts

        node = node_facts()
    several = len(args.layouts) > 1
    docs = [_validate_one(path, node, several, args.json) for path in args.layouts]
    invalid = any(not doc["valid"] for doc in docs)
    if args.json:
        out = docs[0] if not several else {"valid": not invalid, "layouts": docs}
        print(json.dumps(out, indent=2))
    return BAD_INPUT if invalid else OK


def _validate_one(path: str, node: NodeFacts, several: bool, quiet: bool) -> dict[str, Any]:
    """Compile the layout at `path` for `node`; its JSON document. Unless `quiet` (--json) its
    diagnostics go to stderr and its summary line (and swap groups) after them."""
    from vsup.layout.compiled import compile_document
    from vsup.layout.model import load_layout
    from vsup.layout.timeshare import swap_group_summaries

    layout = load_layout(path)
    compiled, diagnostics = compile_document(layout, node)
    groups = swap_group_summaries(compiled.specs, layout.base_dir, node) if compiled else []
    errors = [d for d in diagnostics if d.is_error]
    warnings = [d for d in diagnostics if not d.is_error]
    doc = {
        "path": path,
        "valid": not errors,
        "name": layout.name,
        "instances": layout.instance_names,
        "errors": [d.to_json() for d in errors],
        "warnings": [d.to_json() for d in warnings],
        "swap_groups": groups,
    }
    if quiet:
        return doc
    for d in diagnostics:
        line = d.format()
        if several and d.file != str(layout.path):
            line = f"{path}: {line}"
        print(line, file=sys.stderr)
    note = f", {_plural(len(warnings), 'warning')}" if warnings else ""
    if errors:
        print(f"{path}: {_plural(len(errors), 'error')}{note}", file=sys.stderr)
    else:
        print(f"{path}: valid ({_plural(len(layout.instances), 'instance')}{note})")
        for group in groups:
            print(f"  swap group {group['text']}")
    return doc
