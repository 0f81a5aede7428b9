"""Saving a layout: refused when it does not validate, written atomically.

The top of the layout package: it validates before writing, so it imports validation, which
imports the document model below it.
"""

from __future__ import annotations

import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from vsup.fsutil import write_atomic  # the one atomic writer of the package
from vsup.layout.diagnostics import ERROR, Diagnostic, LayoutError
from vsup.layout.keep import merged_text
from vsup.layout.model import Layout, dumps_layout, loads_layout
from vsup.layout.node import NodeFacts
from vsup.layout.validate import validate


@dataclass
class Saved:
    """What a save wrote: `text` to `path`; `kept`: the comments and formatting of the file
    it replaced (or of the text the layout was applied from) were kept; `lost`: what of them
    was not, in words (None: nothing)."""

    text: str
    path: Path
    lost: str | None = None
    kept: bool = False


def save_layout(
    layout: Layout,
    path: Path | str,
    *,
    node_gpus: int | None = None,
    profile_dirs: Sequence[Path] | None = None,
    check: bool = True,
    parents: bool = False,
    node: NodeFacts | None = None,
    keep_from: str | None = None,
) -> Saved:
    """Write the layout to `path` atomically; refuses (LayoutError) a layout that does not validate.

    Saved over a layout file (or, for a new file, given `keep_from`: the text the layout was
    applied from), the operator's comments and formatting are kept (`layout_text`); what could
    not be kept is in the answer's `lost`.

    `node` / `node_gpus`: the node to validate against, as `validate` takes them.
    Relative local model paths are rewritten for the new location (see `Layout.relocated`). A
    missing directory is created only with `parents`; otherwise it is a LayoutError that says so.
    """
    path = Path(path)
    _make_directory(path, parents)
    target = layout.relocated(path)
    if target.load_errors:
        raise LayoutError(target.load_errors)
    if check:
        diagnostics = validate(target, node_gpus=node_gpus, profile_dirs=profile_dirs, node=node)
        if any(d.is_error for d in diagnostics):
            raise LayoutError(diagnostics)
    saved = layout_text(target, path, keep_from)
    # A writer bug must never replace a good file with one that reads back differently.
    # (a text that kept the operator's formatting was checked as it was made: key order aside)
    if not saved.kept and loads_layout(saved.text) != target:
        raise LayoutError(
            [
                Diagnostic(
                    ERROR,
                    "internal error: the TOML written does not read back the same",
                    file=str(path),
                )
            ]
        )
    write_atomic(path, saved.text)
    return saved


def _make_directory(path: Path, parents: bool) -> None:
    """`path`'s directory, made only with `parents` (else a LayoutError that says so)."""
    if path.parent.is_dir():
        return
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


def layout_text(layout: Layout, path: Path, keep_from: str | None = None) -> Saved:
    """The text to write for `layout` at `path`: the file there (else `keep_from`, the text
    the layout was applied from) edited to hold the layout, so that the operator's comments
    and formatting stay; a plain dump when there is neither, or when that edit cannot be
    made to read back as the layout (then `Saved.lost` says so)."""
    base, what = None, ""
    try:
        if path.is_file():
            base, what = path.read_text(encoding="utf-8"), str(path)
    except (OSError, UnicodeDecodeError) as exc:
        why = f"{path} could not be read ({exc}): its comments and formatting were not kept"
        return Saved(dumps_layout(layout), path, why)
    if base is None and keep_from:
        base, what = keep_from, "the layout as applied"
    plain = dumps_layout(layout)
    if base is None:
        return Saved(plain, path)
    merged = merged_text(base, layout.document)
    if merged is not None:
        try:
            same = tomllib.loads(merged) == layout.document
        except tomllib.TOMLDecodeError:
            same = False
        if same:
            return Saved(merged, path, kept=True)
    return Saved(
        plain,
        path,
        f"the comments and formatting of {what} could not be kept (it was rewritten in "
        "vsup's own format)",
    )
