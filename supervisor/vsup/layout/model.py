"""The layout document: what the TOML file says, kept whole; loading it and writing it as TOML.

A `Layout` holds the parsed document exactly as the file gave it - every table and key, unknown
ones included, in the file's order - so load -> save -> load is the identity and `vsup save`
never drops what an operator wrote. Typed views (`name`, `profiles`, `instances`, ...) read it;
`with_instance` / `without_instance` return new layouts for the dashboard's forms.

Loading never raises: TOML syntax errors and unreadable files become `load_errors`
(diagnostics with the file and line). Saving (`vsup.layout.store`) refuses a layout that does
not validate and writes atomically; it sits above validation, this module below it.

Comments are not kept: tomllib does not report them and tomli-w cannot write them.
"""

from __future__ import annotations

import copy
import math
import os
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import tomli_w

from vsup.layout.diagnostics import ERROR, Diagnostic
from vsup.layout.files import UnreadableFile, read_text, toml_error_diagnostic
from vsup.layout.listen import listen_address
from vsup.layout.modelpath import is_local_model, resolve_model_path
from vsup.layout.sourcemap import SourceMap
from vsup.layout.spec import InstanceSpec

__all__ = [
    "Layout",
    "dumps_document",
    "dumps_layout",
    "is_local_model",
    "load_layout",
    "loads_layout",
    "ordered",
    "resolve_model_path",
    "toml_error_diagnostic",
]


@dataclass(frozen=True, eq=False)
class Layout:
    """A layout file's content. Equality compares the documents, key order included."""

    document: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None  # the file it was read from (relative models resolve against it)
    source: str | None = None  # the text it was read from, for line numbers; None once edited
    load_errors: tuple[Diagnostic, ...] = ()

    # -- identity -------------------------------------------------------------------------

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Layout):
            return NotImplemented
        return ordered(self.document) == ordered(other.document)

    __hash__ = None  # type: ignore[assignment]

    # -- views ----------------------------------------------------------------------------

    @property
    def file(self) -> str | None:
        return str(self.path) if self.path else None

    @property
    def base_dir(self) -> Path:
        """Where relative model paths and `configs/` are looked for."""
        return self.path.expanduser().absolute().parent if self.path else Path.cwd()

    @property
    def header(self) -> dict[str, Any]:
        """The `[layout]` table ({} when absent or not a table)."""
        return _table(self.document.get("layout"))

    @property
    def alerts(self) -> dict[str, Any]:
        """The `[alerts]` table ({} when absent or not a table)."""
        return _table(self.document.get("alerts"))

    @property
    def defaults(self) -> dict[str, Any]:
        """The `[defaults]` table ({} when absent or not a table)."""
        return _table(self.document.get("defaults"))

    @property
    def instances(self) -> list[dict[str, Any]]:
        """The `[[instance]]` tables, in file order (entries that are not tables are skipped)."""
        raw = self.document.get("instance")
        if not isinstance(raw, list):
            return []
        return [t for t in raw if isinstance(t, Mapping)]

    @property
    def name(self) -> str:
        value = self.header.get("name")
        if isinstance(value, str) and value:
            return value
        return self.path.stem if self.path else "layout"

    @property
    def description(self) -> str | None:
        value = self.header.get("description")
        return value if isinstance(value, str) else None

    @property
    def profiles(self) -> list[str]:
        value = self.header.get("profiles")
        if isinstance(value, str):
            return [value]
        if not isinstance(value, list):
            return []
        return [p for p in value if isinstance(p, str)]

    @property
    def metrics_listen(self) -> tuple[str, int] | None:
        """(host, port) of the opt-in Prometheus exporter, or None when not set or malformed."""
        return listen_address(self.header.get("metrics_listen"))

    @property
    def router(self) -> dict[str, Any] | None:
        """The `[router]` table as written, or None when the layout runs no router."""
        value = self.document.get("router")
        return dict(value) if isinstance(value, Mapping) else None

    @property
    def empty_ok(self) -> bool:
        """`[layout] empty = true`: the layout means to run no instance (see validation)."""
        return self.header.get("empty") is True

    @property
    def instance_names(self) -> list[str]:
        return [t["name"] for t in self.instances if isinstance(t.get("name"), str)]

    def instance(self, name: str) -> dict[str, Any] | None:
        """The `[[instance]]` table named `name` (a copy), or None."""
        for table in self.instances:
            if table.get("name") == name:
                return copy.deepcopy(table)
        return None

    def line(self, *path: Any) -> int | None:
        """The source line of a document path, e.g. `line("instance", 2, "port")`."""
        return self.source_map.line(path)

    @property
    def source_map(self) -> SourceMap:
        cached = self.__dict__.get("_source_map")
        if cached is None:
            cached = SourceMap(self.source)
            object.__setattr__(self, "_source_map", cached)
        return cached

    # -- building new layouts -------------------------------------------------------------

    @classmethod
    def from_tables(
        cls,
        instances: Iterable[Mapping[str, Any]],
        defaults: Mapping[str, Any] | None = None,
        header: Mapping[str, Any] | None = None,
        path: Path | str | None = None,
    ) -> Layout:
        """Build a layout from plain tables (what the dashboard's form and `vsup plan` produce)."""
        doc: dict[str, Any] = {}
        if header:
            doc["layout"] = copy.deepcopy(dict(header))
        if defaults:
            doc["defaults"] = copy.deepcopy(dict(defaults))
        doc["instance"] = [copy.deepcopy(dict(t)) for t in instances]
        return cls(document=doc, path=Path(path) if path else None)

    def to_document(self) -> dict[str, Any]:
        """A deep copy of the document, safe to change."""
        return copy.deepcopy(self.document)

    def _edited(self, doc: dict[str, Any]) -> Layout:
        # The source text no longer describes the document: line numbers would mislead.
        return Layout(document=doc, path=self.path, source=None, load_errors=())

    def with_instance(self, table: Mapping[str, Any], replace_name: str | None = None) -> Layout:
        """A new layout with `table` in place of the instance named `replace_name` (or of the
        instance with the table's own name), or appended when there is none."""
        doc = self.to_document()
        raw = doc.get("instance")
        entries: list[Any] = raw if isinstance(raw, list) else []
        target = replace_name if replace_name is not None else table.get("name")
        new = copy.deepcopy(dict(table))
        for i, existing in enumerate(entries):
            if isinstance(existing, Mapping) and existing.get("name") == target:
                entries[i] = new
                break
        else:
            entries.append(new)
        doc["instance"] = entries
        return self._edited(doc)

    def without_instance(self, name: str) -> Layout:
        """A new layout without the instance `name`; KeyError when there is none."""
        doc = self.to_document()
        raw = doc.get("instance")
        entries = raw if isinstance(raw, list) else []
        kept = [t for t in entries if not (isinstance(t, Mapping) and t.get("name") == name)]
        if len(kept) == len(entries):
            raise KeyError(f"no instance named {name!r} in layout {self.name!r}")
        doc["instance"] = kept
        return self._edited(doc)

    def with_defaults(self, table: Mapping[str, Any]) -> Layout:
        """A new layout whose `[defaults]` table is `table`."""
        doc = self.to_document()
        doc["defaults"] = copy.deepcopy(dict(table))
        return self._edited(_reorder(doc))

    def with_header(self, **values: Any) -> Layout:
        """A new layout with `[layout]` keys set (`None` removes a key)."""
        doc = self.to_document()
        header = _table(doc.get("layout"))
        for k, v in values.items():
            if v is None:
                header.pop(k, None)
            else:
                header[k] = copy.deepcopy(v)
        doc["layout"] = header
        return self._edited(_reorder(doc))

    def relocated(self, path: Path | str) -> Layout:
        """The same layout meant to live at `path`: relative local model paths are rewritten so
        they still name the same directories from the new place."""
        path = Path(path)
        new_base = path.expanduser().absolute().parent
        if new_base == self.base_dir:
            return replace(self, path=path)
        doc = self.to_document()
        tables: list[Any] = [doc.get("defaults")]
        if isinstance(doc.get("instance"), list):
            tables += doc["instance"]
        for table in tables:
            if not isinstance(table, dict):
                continue
            model = table.get("model")
            if isinstance(model, str) and (model.startswith(("./", "../")) or model in (".", "..")):
                absolute = resolve_model_path(model, self.base_dir)
                rel = os.path.relpath(absolute, new_base)
                table["model"] = rel if rel.startswith("../") or rel == ".." else f"./{rel}"
        return Layout(document=doc, path=path, source=None, load_errors=())

    # -- resolution -----------------------------------------------------------------------

    def resolve(self, profile_dirs: Sequence[Path] | None = None) -> list[InstanceSpec]:
        """One InstanceSpec per instance, in file order.

        Merge order: built-in defaults <- profiles (in the order listed) <- `[defaults]` <-
        `[[instance]]`; `args`, `env` and `restart` merge key by key, other keys replace;
        `args` entries set to `false` remove the flag. Raises LayoutError when the layout has
        errors that stop it from being built (unknown profile, wrong type, missing key...).
        """
        # The one import inside a function in vsup.layout: resolving needs the layers above
        # the document (structure checks, merge), which import this module. The method is the
        # API every caller uses; `vsup.layout.resolve.resolve_specs` is the same without it.
        from vsup.layout.resolve import resolve_specs

        return resolve_specs(self, profile_dirs)


# -- load -------------------------------------------------------------------------------------


def loads_layout(text: str, path: Path | str | None = None) -> Layout:
    """Parse layout text. Never raises: syntax errors become `load_errors`."""
    path = Path(path) if path is not None else None
    file = str(path) if path else None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        return Layout(path=path, source=text, load_errors=(toml_error_diagnostic(exc, file),))
    except (RecursionError, ValueError, TypeError) as exc:
        diag = Diagnostic(
            ERROR, f"cannot parse the layout ({type(exc).__name__}: {exc})", file=file
        )
        return Layout(path=path, source=text, load_errors=(diag,))
    return Layout(document=doc, path=path, source=text)


def load_layout(path: Path | str) -> Layout:
    """Read a layout file. Never raises: an unreadable, oversized, non-regular or non-UTF-8
    file, or bad TOML, becomes `load_errors` (see `vsup.layout.files`)."""
    path = Path(path)
    try:
        text = read_text(path, "layout")
    except UnreadableFile as exc:
        return Layout(path=path, load_errors=(exc.diagnostic,))
    return loads_layout(text, path)


# -- save -------------------------------------------------------------------------------------

_TOP_ORDER = ("layout", "defaults", "instance")
_INLINE_MAX = 100  # longest line written as an inline table before a sub-table is used


def dumps_layout(layout: Layout) -> str:
    """The layout as TOML text (atoms written by tomli-w; structure in the layout's own order)."""
    return dumps_document(layout.document)


def dumps_document(doc: Mapping[str, Any]) -> str:
    out: list[str] = []
    _emit_table(doc, (), out, top=True)
    text = "\n".join(out).strip("\n") + "\n"
    return text


# -- helpers ----------------------------------------------------------------------------------


def ordered(value: Any) -> Any:
    """A structure whose equality includes dict key order (dicts become lists of pairs)."""
    if isinstance(value, Mapping):
        return ("table", [(k, ordered(v)) for k, v in value.items()])
    if isinstance(value, list):
        return ("array", [ordered(v) for v in value])
    if isinstance(value, float) and math.isnan(value):
        return ("nan",)
    return value


def _table(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, Mapping) else {}


def _reorder(doc: dict[str, Any]) -> dict[str, Any]:
    """Put [layout], [defaults], [[instance]] first, in that order, when a helper added one."""
    out = {k: doc[k] for k in _TOP_ORDER if k in doc}
    out.update((k, v) for k, v in doc.items() if k not in out)
    return out


def _atom(value: Any) -> str:
    return tomli_w.dumps({"v": value})[len("v = ") : -1]


def _key(key: str) -> str:
    return tomli_w.dumps({key: 0})[: -len(" = 0\n")]


def _inline(value: Any) -> str:
    if isinstance(value, Mapping):
        if not value:
            return "{}"
        return "{ " + ", ".join(f"{_key(k)} = {_inline(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list):
        return "[" + ", ".join(_inline(v) for v in value) + "]"
    return _atom(value)


def _is_aot(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, Mapping) for v in value)


def _emit_table(
    table: Mapping[str, Any], path: tuple[str, ...], out: list[str], top: bool = False
) -> None:
    """Write a table's keys in order. Keys are written inline until the trailing run of keys
    whose values are tables (or arrays of tables): those may become `[sub]` / `[[sub]]`
    sections without changing the order a reader sees - at the top level always, deeper only
    when the inline form would be too long."""
    items = list(table.items())
    split = len(items)
    while split > 0 and (isinstance(items[split - 1][1], Mapping) or _is_aot(items[split - 1][1])):
        split -= 1
    if not top:
        # Deeper down, keep short tables inline; only from the first long one onward use sections.
        first_long = len(items)
        for i in range(split, len(items)):
            k, v = items[i]
            if len(f"{_key(k)} = {_inline(v)}") > _INLINE_MAX or _is_aot(v):
                first_long = i
                break
        split = first_long
    for k, v in items[:split]:
        out.append(f"{_key(k)} = {_inline(v)}")
    for k, v in items[split:]:
        sub = (*path, _key(k))
        name = ".".join(sub)
        if isinstance(v, Mapping):
            out.append("")
            out.append(f"[{name}]")
            _emit_table(v, sub, out)
        else:
            for entry in v:
                out.append("")
                out.append(f"[[{name}]]")
                _emit_table(entry, sub, out)
