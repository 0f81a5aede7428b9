"""Saving a layout: refused when it does not validate, written atomically.

The top of the layout package: it validates before writing, so it imports validation, which
imports the document model below it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from vsup.fsutil import write_atomic  # the one atomic writer of the package
from vsup.layout.diagnostics import ERROR, Diagnostic, LayoutError
from vsup.layout.model import Layout, dumps_layout, loads_layout
from vsup.layout.node import NodeFacts
from vsup.layout.validate import validate


def save_layout(
    layout: Layout,
    path: Path | str,
    *,
    node_gpus: int | None = None,
    profile_dirs: Sequence[Path] | None = None,
    check: bool = True,
    parents: bool = False,
    node: NodeFacts | None = None,
) -> Path:
    """Write the layout to `path` atomically; refuses (LayoutError) a layout that does not validate.

    `node` / `node_gpus`: the node to validate against, as `validate` takes them.
    Relative local model paths are rewritten for the new location (see `Layout.relocated`). A
    missing directory is created only with `parents`; otherwise it is a LayoutError that says so.
    """
    path = Path(path)
    if not path.parent.is_dir():
        if not parents:
            raise LayoutError(
                [
                    Diagnostic(
                        ERROR,
                        f"directory {path.parent} does not exist: create it first (vsup creates "
                        "missing directories only when asked, e.g. `vsup save --parents`)",
                        file=str(path),
                    )
                ]
            )
        path.parent.mkdir(parents=True, exist_ok=True)
    target = layout.relocated(path)
    if target.load_errors:
        raise LayoutError(target.load_errors)
    if check:
        diagnostics = validate(target, node_gpus=node_gpus, profile_dirs=profile_dirs, node=node)
        if any(d.is_error for d in diagnostics):
            raise LayoutError(diagnostics)
    text = dumps_layout(target)
    # A writer bug must never replace a good file with one that reads back differently.
    if loads_layout(text) != target:
        raise LayoutError(
            [
                Diagnostic(
                    ERROR,
                    "internal error: the TOML written does not read back the same",
                    file=str(path),
                )
            ]
        )
    write_atomic(path, text)
    return path
