"""Merging a layout into one set of values per instance, remembering where each value came from.

Order, lowest first: built-in defaults <- profiles (as listed in `[layout] profiles`) <-
`[defaults]` <- the `[[instance]]` table. `args`, `env` and `restart` merge key by key (an
`args` key replaces an earlier one with the same flag, `max_model_len` and `max-model-len`
alike); any other key replaces the value below it. `args.X = false` removes flag X.

Each merged value keeps its `Origin` (file and document path), so a diagnostic about a flag a
profile set points at the profile's line, not at the instance.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vsup.layout.flags import flag_name
from vsup.layout.model import Layout
from vsup.layout.profiles import ProfileCache, search_dirs
from vsup.layout.schema import (
    COMMON_KEYS,
    INSTANCE_KEYS,
    builtin_defaults,
    is_int,
    is_number,
    type_problem,
)
from vsup.layout.sourcemap import SourceMap

MERGED_TABLES = ("args", "env", "restart", "sleep")


@dataclass(frozen=True)
class Origin:
    """Where a merged value was written."""

    label: str  # "built-in" | "profile 'NAME'" | "[defaults]" | "[[instance]]"
    file: str | None
    doc_path: tuple  # the value's path inside that file's document
    source_map: SourceMap | None = field(default=None, compare=False, repr=False)

    @property
    def line(self) -> int | None:
        return self.source_map.line(self.doc_path) if self.source_map else None

    @property
    def is_instance(self) -> bool:
        return self.label == "[[instance]]"


BUILTIN = Origin("built-in", None, ())


@dataclass
class MergedInstance:
    index: int  # position among the layout's [[instance]] tables
    table: dict[str, Any]  # the [[instance]] table as written
    values: dict[str, Any]  # merged, well-typed values only
    origins: dict[tuple[str, ...], Origin]
    instance_origin: Origin  # the [[instance]] table itself

    @property
    def name(self) -> str | None:
        v = self.table.get("name")
        return v if isinstance(v, str) else None

    @property
    def label(self) -> str:
        """The name, or `#N` for an instance without a usable name."""
        return self.name or f"#{self.index + 1}"

    def origin(self, *key: str) -> Origin:
        """Where `key` (e.g. "args", "max-model-len") came from; the instance when unknown."""
        path = tuple(key)
        while path:
            if path in self.origins:
                return self.origins[path]
            path = path[:-1]
        return self.instance_origin

    @property
    def args(self) -> dict[str, Any]:
        return self.values.get("args", {})

    @property
    def env(self) -> dict[str, Any]:
        return self.values.get("env", {})

    def arg(self, name: str, default: Any = None) -> Any:
        """The merged value of a vLLM flag, whichever spelling set it; `false` counts as unset."""
        want = flag_name(name)
        for k, v in self.args.items():
            if flag_name(k) == want:
                return default if v is False else v
        return default

    def arg_key(self, name: str) -> str | None:
        want = flag_name(name)
        for k in self.args:
            if flag_name(k) == want:
                return k
        return None

    @property
    def gpus(self) -> list[int] | None:
        return self.values.get("gpus")


def _layer_tables(layout: Layout, profiles: ProfileCache) -> list[tuple[Origin, dict[str, Any]]]:
    layers: list[tuple[Origin, dict[str, Any]]] = [(BUILTIN, builtin_defaults())]
    for name in layout.profiles:
        profile = profiles.get(name)
        if profile is None or profile.load_errors:
            continue
        layers.append(
            (
                Origin(
                    f"profile '{name}'", str(profile.path), ("defaults",), SourceMap(profile.source)
                ),
                profile.defaults,
            )
        )
    layers.append(
        (Origin("[defaults]", layout.file, ("defaults",), layout.source_map), layout.defaults)
    )
    return layers


def _merge_into(
    values: dict[str, Any],
    origins: dict[tuple[str, ...], Origin],
    layer: Mapping[str, Any],
    origin: Origin,
    known: Mapping[str, Any],
) -> None:
    for key, value in layer.items():
        spec = known.get(key)
        if spec is None or type_problem(spec, value) is not None:
            continue  # reported by the table checks; never let it reach a spec
        key_origin = Origin(origin.label, origin.file, origin.doc_path + (key,), origin.source_map)
        if key in MERGED_TABLES:
            merged = dict(values.get(key, {}))
            for sub, sub_value in value.items():
                if key == "env" and not _env_value_ok(sub_value):
                    continue
                if (
                    key == "restart"
                    and sub in _RESTART_TYPES
                    and not _RESTART_TYPES[sub](sub_value)
                ):
                    continue
                if key == "sleep" and sub in _SLEEP_TYPES and not _SLEEP_TYPES[sub](sub_value):
                    continue
                if key == "args":
                    # `max_model_len` replaces an earlier `max-model-len`: one flag, one value.
                    for existing in [k for k in merged if flag_name(k) == flag_name(sub)]:
                        merged.pop(existing)
                        origins.pop((key, existing), None)
                merged[sub] = copy.deepcopy(sub_value)
                origins[(key, sub)] = Origin(
                    origin.label, origin.file, key_origin.doc_path + (sub,), origin.source_map
                )
            values[key] = merged
            origins[(key,)] = key_origin
        else:
            values[key] = copy.deepcopy(value)
            origins[(key,)] = key_origin


def _env_value_ok(v: Any) -> bool:
    return isinstance(v, str) or is_number(v)


_SLEEP_TYPES: dict[str, Callable[[Any], bool]] = {
    "level": is_int,
    "after_idle_s": is_number,
    "start": lambda v: isinstance(v, str),
    "public_dev_mode": lambda v: isinstance(v, bool),
    "recycle_growth_gib": is_number,
}
_RESTART_TYPES: dict[str, Callable[[Any], bool]] = {
    "policy": lambda v: isinstance(v, str),
    "backoff_s": is_number,
    "backoff_max_s": is_number,
    "stable_s": is_number,
    "max_failures": is_int,
}


def merge_instances(layout: Layout, profiles: ProfileCache) -> list[MergedInstance]:
    """Every `[[instance]]` merged with the layers below it (see the module docstring)."""
    layers = _layer_tables(layout, profiles)
    base_values: dict[str, Any] = {}
    base_origins: dict[tuple[str, ...], Origin] = {}
    for origin, table in layers:
        _merge_into(base_values, base_origins, table, origin, COMMON_KEYS)
    raw = layout.document.get("instance")
    entries = raw if isinstance(raw, list) else []
    merged: list[MergedInstance] = []
    for i, table in enumerate(entries):
        if not isinstance(table, Mapping):
            continue
        values = copy.deepcopy(base_values)
        origins = dict(base_origins)
        inst_origin = Origin("[[instance]]", layout.file, ("instance", i), layout.source_map)
        _merge_into(values, origins, table, inst_origin, INSTANCE_KEYS)
        merged.append(MergedInstance(i, dict(table), values, origins, inst_origin))
    return merged


def profile_cache_for(layout: Layout, profile_dirs: Sequence[Path] | None) -> ProfileCache:
    """The profiles a layout can use: `profile_dirs`, else the search path (docs/layout.md)."""
    dirs = list(profile_dirs) if profile_dirs is not None else search_dirs(layout.path)
    return ProfileCache(dirs, layout.base_dir)
