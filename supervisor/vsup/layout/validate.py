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
from pathlib import Path
from typing import Any

from vsup.layout import node as node_probe
from vsup.layout.diagnostics import Diagnostic, merge_repeats, sort_key
from vsup.layout.merge import merge_instances, profile_cache_for
from vsup.layout.model import Layout, load_layout
from vsup.layout.rules import Context, run_rules
from vsup.layout.structure import check_profile_document, check_structure, written_tables

__all__ = ["check_profile_document", "validate", "validate_file", "validate_instance"]


def validate(
    layout: Layout,
    node_gpus: int | None = None,
    profile_dirs: Sequence[Path] | None = None,
    *,
    gpu_memory_bytes: int | None = None,
) -> list[Diagnostic]:
    """Every error and warning of `layout`, errors first.

    `node_gpus`: the GPU count to check indices against; None probes this node (NVML/amdsmi)
    and, when it finds none, checks only that indices are >= 0 and says so once.
    `gpu_memory_bytes`: one GPU's memory, for the KV-capacity warnings; None takes it from the
    probe when `node_gpus` was probed, else skips the GPU estimates.
    """
    cache = profile_cache_for(layout, profile_dirs)
    out = check_structure(layout, cache)
    if layout.load_errors:
        return out
    probed = False
    if node_gpus is None:
        gpus = node_probe.node_gpus()
        node_gpus = len(gpus) or None
        probed = True
        if gpu_memory_bytes is None and gpus and gpus[0].memory_bytes:
            gpu_memory_bytes = min(g.memory_bytes or 0 for g in gpus) or None
    ctx = Context(
        layout=layout,
        cache=cache,
        merged=merge_instances(layout, cache),
        tables=written_tables(layout, cache),
        node_gpus=node_gpus,
        probed=probed,
        gpu_memory_bytes=gpu_memory_bytes,
    )
    out += run_rules(ctx)
    return sorted(merge_repeats(out), key=sort_key)


def validate_file(
    path: Path | str, node_gpus: int | None = None, profile_dirs: Sequence[Path] | None = None
) -> tuple[Layout, list[Diagnostic]]:
    """Load and validate a layout file: the layout and its diagnostics (errors first)."""
    layout = load_layout(path)
    return layout, validate(layout, node_gpus, profile_dirs)


def validate_instance(
    layout: Layout,
    table: Mapping[str, Any],
    *,
    replace_name: str | None = None,
    node_gpus: int | None = None,
    profile_dirs: Sequence[Path] | None = None,
) -> list[Diagnostic]:
    """What validation says about `table` once put into `layout` (the dashboard's add/edit
    form): diagnostics of that instance, and those of others that name it (a port it takes)."""
    candidate = layout.with_instance(table, replace_name)
    name = table.get("name")
    if isinstance(name, str):
        label = name
    else:
        target = replace_name if replace_name is not None else name
        names = [t.get("name") for t in layout.instances]
        index = names.index(target) if target in names else len(candidate.instances) - 1
        label = f"#{index + 1}"
    return [
        d
        for d in validate(candidate, node_gpus=node_gpus, profile_dirs=profile_dirs)
        if d.instance == label or label in d.others or f"'{label}'" in d.message
    ]
