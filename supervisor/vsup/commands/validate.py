"""`vsup validate LAYOUT [--node-gpus N]`: every error at once, warnings on stderr.

Exit 0 when the layout is valid (warnings may still be printed on stderr), 2 when it has
errors. Each line reads `FILE:LINE: error: instance 'gpu0': key 'port': ... (what to change)`.
"""

from __future__ import annotations

import argparse
import json
import sys


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "validate",
        help="check a layout: exit 0 if valid (warnings on stderr), 2 with every error",
        description=__doc__.splitlines()[0],
    )
    p.add_argument("layout", metavar="LAYOUT", help="the layout TOML file")
    p.add_argument(
        "--node-gpus",
        type=int,
        metavar="N",
        help="check GPU indices against a node with N GPUs (default: this node's GPUs)",
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from vsup.layout.validate import validate_file

    if args.node_gpus is not None and args.node_gpus < 0:
        print("vsup validate: --node-gpus must be 0 or more", file=sys.stderr)
        return 2
    layout, diagnostics = validate_file(args.layout, node_gpus=args.node_gpus)
    errors = [d for d in diagnostics if d.is_error]
    warnings = [d for d in diagnostics if not d.is_error]
    if args.json:
        doc = {
            "path": args.layout,
            "valid": not errors,
            "name": layout.name,
            "instances": layout.instance_names,
            "errors": [d.to_json() for d in errors],
            "warnings": [d.to_json() for d in warnings],
        }
        print(json.dumps(doc, indent=2))
        return 2 if errors else 0
    for d in diagnostics:
        print(d.format(), file=sys.stderr)
    if errors:
        print(
            f"{args.layout}: {len(errors)} error{'s' if len(errors) != 1 else ''}"
            + (f", {len(warnings)} warning{'s' if len(warnings) != 1 else ''}" if warnings else ""),
            file=sys.stderr,
        )
        return 2
    n = len(layout.instances)
    note = f", {len(warnings)} warning{'s' if len(warnings) != 1 else ''}" if warnings else ""
    print(f"{args.layout}: valid ({n} instance{'s' if n != 1 else ''}{note})")
    return 0
