"""Saving a layout: refused when it does not validate, written atomically.

The top of the layout package: it validates before writing, so it imports validation, which
imports the document model below it.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from vsup.layout.diagnostics import ERROR, Diagnostic, LayoutError
from vsup.layout.model import Layout, dumps_layout, loads_layout
from vsup.layout.validate import validate


def save_layout(
    layout: Layout,
    path: Path | str,
    *,
    node_gpus: int | None = None,
    profile_dirs: Sequence[Path] | None = None,
    check: bool = True,
) -> Path:
    """Write the layout to `path` atomically; refuses (LayoutError) a layout that does not validate.

    Relative local model paths are rewritten for the new location (see `Layout.relocated`).
    """
    path = Path(path)
    target = layout.relocated(path)
    if target.load_errors:
        raise LayoutError(target.load_errors)
    if check:
        diagnostics = validate(target, node_gpus=node_gpus, profile_dirs=profile_dirs)
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


def write_atomic(path: Path, text: str) -> None:
    """Temp file in the same directory, fsync, rename over `path`, fsync the directory."""
    directory = path.expanduser().absolute().parent
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        try:
            mode = os.stat(path).st_mode & 0o777
        except FileNotFoundError:
            mode = 0o644
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    try:
        dir_fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)
