"""Tuning profiles: named `[defaults]`-shaped tables kept in `configs/NAME.toml`.

A profile file holds a `[profile]` table (its `description`) and a `[defaults]` table with any
key a layout's `[defaults]` may hold. A layout lists profiles in `[layout] profiles`; they merge
in that order, under the layout's own `[defaults]`.

Where a name is looked up, first match wins:
1. each directory in `$VSUP_PROFILE_PATH` (colon-separated), in order;
2. `configs/` beside the layout file, then beside each directory above it;
3. the profiles shipped with vsup (`vsup.paths.builtin_configs_dir()`).
A name with a `/` or ending in `.toml` is a file path, relative to the layout's directory.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vsup import paths
from vsup.layout.diagnostics import ERROR, Diagnostic
from vsup.layout.files import UnreadableFile, read_text, toml_error_diagnostic
from vsup.layout.sourcemap import SourceMap

PROFILE_PATH_ENV = "VSUP_PROFILE_PATH"


@dataclass(frozen=True)
class Profile:
    name: str
    path: Path
    document: dict[str, Any] = field(default_factory=dict)
    source: str | None = None
    load_errors: tuple[Diagnostic, ...] = ()

    @property
    def description(self) -> str | None:
        header = self.document.get("profile")
        if isinstance(header, Mapping) and isinstance(header.get("description"), str):
            return header["description"]
        return None

    @property
    def defaults(self) -> dict[str, Any]:
        """The profile's `[defaults]` table ({} when it has none or it is not a table)."""
        table = self.document.get("defaults")
        return dict(table) if isinstance(table, Mapping) else {}

    def line(self, *path: Any) -> int | None:
        return SourceMap(self.source).line(path)


def search_dirs(
    layout_path: Path | None = None, env: Mapping[str, str] | None = None
) -> list[Path]:
    """The directories profiles are looked up in, in order (see the module docstring)."""
    env = os.environ if env is None else env
    dirs: list[Path] = []
    for item in env.get(PROFILE_PATH_ENV, "").split(os.pathsep):
        if item.strip():
            dirs.append(Path(item).expanduser())
    if layout_path is not None:
        here = Path(layout_path).expanduser().absolute().parent
        for parent in (here, *here.parents):
            candidate = parent / "configs"
            if candidate.is_dir():
                dirs.append(candidate)
    dirs.append(paths.builtin_configs_dir())
    unique: list[Path] = []
    for d in dirs:
        if d not in unique:
            unique.append(d)
    return unique


def is_path_like(name: str) -> bool:
    return "/" in name or name.endswith(".toml")


def find_profile(name: str, dirs: Sequence[Path], base_dir: Path | None = None) -> Path | None:
    """The file a profile name refers to, or None when no directory has it."""
    if not name:
        return None
    if is_path_like(name):
        p = Path(name).expanduser()
        if not p.is_absolute():
            p = (base_dir or Path.cwd()) / p
        return p if p.is_file() else None
    for d in dirs:
        candidate = Path(d) / f"{name}.toml"
        if candidate.is_file():
            return candidate
    return None


def available_profiles(dirs: Iterable[Path]) -> list[str]:
    """Every profile name the directories offer (first occurrence wins), sorted."""
    names: set[str] = set()
    for d in dirs:
        try:
            names.update(p.stem for p in Path(d).glob("*.toml") if p.is_file())
        except OSError:
            continue
    return sorted(names)


def read_profile(name: str, path: Path) -> Profile:
    """Read one profile file. Never raises: problems land in `load_errors`."""
    try:
        text = read_text(path, "profile")
    except UnreadableFile as exc:
        return Profile(name, path, load_errors=(exc.diagnostic,))
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        return Profile(
            name, path, source=text, load_errors=(toml_error_diagnostic(exc, str(path)),)
        )
    except (RecursionError, ValueError) as exc:
        return Profile(
            name,
            path,
            source=text,
            load_errors=(Diagnostic(ERROR, f"cannot parse profile: {exc}", file=str(path)),),
        )
    return Profile(name, path, document=doc, source=text)


class ProfileCache:
    """Profiles read once per validation or resolution, looked up in fixed directories."""

    def __init__(self, dirs: Sequence[Path], base_dir: Path | None = None) -> None:
        self.dirs = list(dirs)
        self.base_dir = base_dir
        self._cache: dict[str, Profile | None] = {}

    def get(self, name: str) -> Profile | None:
        if name not in self._cache:
            path = find_profile(name, self.dirs, self.base_dir)
            self._cache[name] = read_profile(name, path) if path else None
        return self._cache[name]

    def available(self) -> list[str]:
        return available_profiles(self.dirs)
