"""Validation: every problem in a layout at once, each naming file, line, instance and key.

The layers, each importing only those before it:
    structure checks (`structure.py`: TOML, keys, types, names, profiles) - what `resolve` needs
    -> merge (`merge.py`: one set of values per instance, each value's origin)
    -> rules (`rules/`: ports, GPUs, parallelism, env, secrets, flags, model, KV...)
    -> this driver; resolve (`resolve.py`) and saving (`store.py`) sit beside it.

Errors mean vLLM would not start, two instances would fight over a port or a GPU, or a secret
would be written down. Warnings mean it would start but probably not as intended; `vsup
validate` exits 0 with warnings.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vsup.layout.diagnostics import Diagnostic, merge_repeats, sort_key
from vsup.layout.merge import MergedInstance, merge_instances, profile_cache_for
from vsup.layout.model import Layout
from vsup.layout.node import NodeFacts
from vsup.layout.rules import Context, run_rules
from vsup.layout.structure import check_profile_document, check_structure, written_tables

__all__ = [
    "Checked",
    "check",
    "check_profile_document",
    "instance_diagnostics",
    "validate",
    "validate_instance",
]


@dataclass(frozen=True)
class Checked:
    """One validation: its diagnostics (errors first) and the merged instances it checked,
    which the compiled layout builds its specs from (no second merge)."""

    diagnostics: list[Diagnostic]
    merged: Sequence[MergedInstance]

    @property
    def ok(self) -> bool:
        return not any(d.is_error for d in self.diagnostics)


def check(
    layout: Layout,
    node: NodeFacts | None = None,
    profile_dirs: Sequence[Path] | None = None,
    *,
    gpu_memory_bytes: int | None = None,
) -> Checked:
    """Every error and warning of `layout` on the node `node` (see `validate`), with the
    merged instances. `node` None: nothing is known of the node (as a probe that found no
    GPU: indices are only checked to be >= 0, and that is said once)."""
    node = node if node is not None else NodeFacts()
    cache = profile_cache_for(layout, profile_dirs)
    out = check_structure(layout, cache)
    if layout.load_errors:
        return Checked(out, ())
    merged = merge_instances(layout, cache)
    ctx = Context(
        layout=layout,
        cache=cache,
        merged=merged,
        tables=written_tables(layout, cache),
        node_gpus=node.gpu_count,
        probed=node.probed,
        gpu_memory_bytes=gpu_memory_bytes or node.gpu_memory_bytes,
        host_memory_bytes=node.host_memory_bytes,
    )
    out += run_rules(ctx)
    return Checked(sorted(merge_repeats(out), key=sort_key), merged)


def validate(
    layout: Layout,
    node_gpus: int | None = None,
    profile_dirs: Sequence[Path] | None = None,
    *,
    gpu_memory_bytes: int | None = None,
    node: NodeFacts | None = None,
) -> list[Diagnostic]:
    """Every error and warning of `layout`, errors first.

    `node`: this node's GPUs (`vsup.telemetry.gpu.node_facts()`), to check indices against and
    size the KV-capacity warnings by. `node_gpus`: instead, a GPU count to check against (as
    `--node-gpus N`; ignored when `node` is given). Neither: the node is unknown, indices are
    only checked to be >= 0 and a warning says so once. `gpu_memory_bytes`: one GPU's memory
    for the KV-capacity warnings (default: the node's; none: the GPU estimates are skipped).
    """
    if node is None and node_gpus is not None:
        node = NodeFacts.given(node_gpus)
    return check(layout, node, profile_dirs, gpu_memory_bytes=gpu_memory_bytes).diagnostics


def instance_diagnostics(
    diagnostics: Sequence[Diagnostic],
    layout: Layout,
    table: Mapping[str, Any],
    replace_name: str | None = None,
) -> list[Diagnostic]:
    """Those of `diagnostics` (of a layout holding `table`) that concern that instance: its
    own, and those of others that name it (a port it takes). `layout` is the layout before
    the table was put in (for the label of a table without a name)."""
    name = table.get("name")
    if isinstance(name, str):
        label = name
    else:
        target = replace_name if replace_name is not None else name
        names = [t.get("name") for t in layout.instances]
        index = names.index(target) if target in names else len(layout.instances)
        label = f"#{index + 1}"
    return [
        d
        for d in diagnostics
        if d.instance == label or label in d.others or f"'{label}'" in d.message
    ]


def validate_instance(
    layout: Layout,
    table: Mapping[str, Any],
    *,
    replace_name: str | None = None,
    node_gpus: int | None = None,
    profile_dirs: Sequence[Path] | None = None,
    node: NodeFacts | None = None,
) -> list[Diagnostic]:
    """What validation says about `table` once put into `layout` (the dashboard's add/edit
    form): diagnostics of that instance, and those of others that name it (a port it takes)."""
    candidate = layout.with_instance(table, replace_name)
    diagnostics = validate(candidate, node_gpus=node_gpus, profile_dirs=profile_dirs, node=node)
    return instance_diagnostics(diagnostics, layout, table, replace_name)
