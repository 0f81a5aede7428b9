"""Which `model` values are local directories, and where they point."""

from __future__ import annotations

import os
from pathlib import Path

LOCAL_PREFIXES = ("/", "./", "../", "~")


def is_local_model(model: str) -> bool:
    """A model is a local path when it starts with `/`, `./`, `../` or `~` (else a hub id)."""
    return model.startswith(LOCAL_PREFIXES) or model in (".", "..")


def resolve_model_path(model: str, base_dir: Path | None) -> str:
    """A local model path made absolute: `~` expanded, `./x` and `../x` against `base_dir`."""
    if not is_local_model(model):
        return model
    p = Path(model).expanduser()
    if not p.is_absolute():
        p = (base_dir or Path.cwd()) / p
    return os.path.normpath(p)
