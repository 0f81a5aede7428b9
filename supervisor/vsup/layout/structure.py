"""Structure checks: what stops a layout from being built at all.

TOML syntax, unknown keys (with "did you mean"), wrong types, values out of range, missing or
duplicate names, unknown profiles, flags vsup sets itself. These read the document as written
(nothing merged), so `Layout.resolve` and validation share them, and every problem points at
the file and line where it is written. The rules about what the merged values mean (ports,
GPUs, secrets, memory...) come later, in `vsup.layout.rules`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from vsup.layout.diagnostics import ERROR, Diagnostic
from vsup.layout.flags import flag_name
from vsup.layout.model import Layout
from vsup.layout.profiles import ProfileCache, is_path_like
from vsup.layout.schema import (
    ALERTS_KEYS,
    ARGS_OWNED_BY_KEYS,
    COMMON_KEYS,
    DEFAULTS_KEYS,
    ENV_NAME_RE,
    INSTANCE_KEYS,
    INSTANCE_ONLY_KEYS,
    LAYOUT_KEYS,
    PROFILE_HEADER_KEYS,
    PROFILE_TOP_KEYS,
    RESTART_KEYS,
    ROUTER_ARGS_OWNED_BY_KEYS,
    ROUTER_KEYS,
    SLEEP_KEYS,
    SPAN_KEYS,
    TOP_KEYS,
    Key,
    is_number,
    suggest,
    toml_type,
    type_problem,
)
from vsup.layout.secrets import is_secret_name
from vsup.layout.sourcemap import SourceMap
from vsup.layout.vllm_flags import frozen_flags

# Short vLLM aliases that flags.py would turn into unknown long flags (`tp` -> `--tp`).
ARG_ALIASES = {
    "tp": "tensor-parallel-size",
    "pp": "pipeline-parallel-size",
    "dp": "data-parallel-size",
    "q": "quantization",
    "ep": "enable-expert-parallel",
}


@dataclass(frozen=True)
class Where:
    """A table in some file: enough to turn a problem into a Diagnostic with a line."""

    file: str | None
    smap: SourceMap | None
    path: tuple
    instance: str | None = None
    table: str | None = None
    key_prefix: str = ""

    def diag(
        self, severity: str, message: str, key: str | None = None, sub: tuple = ()
    ) -> Diagnostic:
        line = self.smap.line(self.path + sub) if self.smap else None
        shown = (
            f"{self.key_prefix}{key}" if key is not None else (self.key_prefix.rstrip(".") or None)
        )
        return Diagnostic(
            severity,
            message,
            file=self.file,
            line=line,
            instance=self.instance,
            key=shown,
            table=None if self.instance else self.table,
        )

    def sub(self, key: str) -> Where:
        return Where(
            self.file,
            self.smap,
            self.path + (key,),
            self.instance,
            self.table,
            f"{self.key_prefix}{key}.",
        )


@dataclass(frozen=True)
class WrittenTable:
    """A table of instance keys as one file wrote it: a profile's or the layout's `[defaults]`,
    or one `[[instance]]`."""

    where: Where
    table: Mapping[str, Any]
    section: str  # "profile" | "defaults" | "instance"
    index: int | None = None  # the [[instance]] position, for instance tables


def instance_label(table: Mapping[str, Any], index: int) -> str:
    """The instance's name, or `#N` for one without a usable name (as merge labels it)."""
    name = table.get("name")
    return name if isinstance(name, str) else f"#{index + 1}"


def instance_tables(layout: Layout) -> Iterator[tuple[int, Mapping[str, Any]]]:
    """(position, table) of every `[[instance]]` entry that is a table."""
    raw = layout.document.get("instance")
    if isinstance(raw, list):
        for i, table in enumerate(raw):
            if isinstance(table, Mapping):
                yield i, table


def written_tables(layout: Layout, cache: ProfileCache) -> list[WrittenTable]:
    """Every table of instance keys the layout is built from, lowest in the merge first:
    the listed profiles' `[defaults]` (those that loaded), `[defaults]`, each `[[instance]]`."""
    out: list[WrittenTable] = []
    for name in dict.fromkeys(layout.profiles):
        profile = cache.get(name)
        if profile is None or profile.load_errors:
            continue
        defaults = profile.document.get("defaults")
        if isinstance(defaults, Mapping):
            where = Where(
                str(profile.path),
                SourceMap(profile.source),
                ("defaults",),
                table=f"profile '{name}' [defaults]",
            )
            out.append(WrittenTable(where, defaults, "profile"))
    doc = layout.document
    file, smap = layout.file, layout.source_map
    if isinstance(doc.get("defaults"), Mapping):
        where = Where(file, smap, ("defaults",), table="[defaults]")
        out.append(WrittenTable(where, doc["defaults"], "defaults"))
    for i, table in instance_tables(layout):
        where = Where(file, smap, ("instance", i), instance=instance_label(table, i))
        out.append(WrittenTable(where, table, "instance", i))
    return out


# -- one table ------------------------------------------------------------------------------


def _misplaced_hint(key: str, section: str) -> str | None:
    if section in ("defaults", "profile") and key in INSTANCE_ONLY_KEYS:
        return f"'{key}' is set per instance: move it into each [[instance]] table"
    if section in ("defaults", "instance", "profile") and key in LAYOUT_KEYS and key != "name":
        return f"'{key}' belongs in the [layout] table"
    if section == "layout" and key in COMMON_KEYS:
        return f"'{key}' belongs in [defaults] (or an [[instance]] table), not [layout]"
    # The frozen list is enough for a hint; the installed vLLM's flags are for the rules.
    if section in ("defaults", "instance", "profile") and frozen_flags().knows(flag_name(key)[2:]):
        return f"'{key}' is a vLLM flag: put it in args, e.g. args = {{ {key} = ... }}"
    return None


def check_table(
    table: Mapping[str, Any], keys: Mapping[str, Key], where: Where, section: str
) -> list[Diagnostic]:
    """Unknown keys (with a suggestion) and wrong types in one table, plus its sub-tables."""
    out: list[Diagnostic] = []
    for key, value in table.items():
        spec = keys.get(key)
        if spec is None:
            hint = _misplaced_hint(key, section)
            if hint is None:
                close = suggest(key, list(keys))
                hint = f"did you mean '{close}'?" if close else "known keys: " + ", ".join(keys)
            out.append(where.diag(ERROR, f"unknown key: {hint}", key, (key,)))
            continue
        problem = type_problem(spec, value)
        if problem:
            out.append(where.diag(ERROR, problem, key, (key,)))
            continue
        problem = spec.check(value) if spec.check else None
        if problem:
            out.append(where.diag(ERROR, problem, key, (key,)))
        if spec.kind == "restart":
            out += check_table(value, RESTART_KEYS, where.sub(key), "restart")
            out += _check_restart(value, where.sub(key))
        elif spec.kind == "sleep":
            out += check_table(value, SLEEP_KEYS, where.sub(key), "sleep")
        elif spec.kind == "span":
            out += check_table(value, SPAN_KEYS, where.sub(key), "span")
        elif spec.kind == "table" and key == "args" and section == "router":
            out += _check_router_args(value, where.sub(key))
        elif spec.kind == "table" and key == "args":
            out += _check_args(value, where.sub(key))
        elif spec.kind == "env_table":
            out += _check_env(value, where.sub(key))
    return out


def _check_restart(table: Mapping[str, Any], where: Where) -> list[Diagnostic]:
    lo, hi = table.get("backoff_s"), table.get("backoff_max_s")
    if is_number(lo) and is_number(hi) and hi < lo:
        return [
            where.diag(
                ERROR,
                f"backoff_max_s ({hi}) is below backoff_s ({lo}): raise backoff_max_s or lower "
                "backoff_s",
                "backoff_max_s",
                ("backoff_max_s",),
            )
        ]
    return []


def _check_args(args: Mapping[str, Any], where: Where) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    seen: dict[str, str] = {}
    for key, value in args.items():
        flag = flag_name(key)[2:]
        sub = (key,)
        if flag in seen:
            out.append(
                where.diag(
                    ERROR,
                    f"'{key}' and '{seen[flag]}' are the same flag --{flag}: keep one",
                    key,
                    sub,
                )
            )
        seen[flag] = key
        if flag in ARGS_OWNED_BY_KEYS:
            owner = ARGS_OWNED_BY_KEYS[flag]
            out.append(
                where.diag(
                    ERROR,
                    f"vsup sets --{flag} itself: remove it from args and use the '{owner}' key",
                    key,
                    sub,
                )
            )
            continue
        if not flag_value_ok(value):
            out.append(
                where.diag(
                    ERROR,
                    f"{toml_type(value)} cannot be a flag value: use a string, number, boolean, "
                    "array or table",
                    key,
                    sub,
                )
            )
            continue
        if flag in ARG_ALIASES:
            out.append(
                where.diag(
                    ERROR,
                    f"'{key}' would become --{flag}, which vLLM does not know: write "
                    f"'{ARG_ALIASES[flag]}' instead",
                    key,
                    sub,
                )
            )
    return out


def _check_router_args(args: Mapping[str, Any], where: Where) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    for key, value in args.items():
        flag = flag_name(key)[2:]
        if flag in ROUTER_ARGS_OWNED_BY_KEYS:
            owner = ROUTER_ARGS_OWNED_BY_KEYS[flag]
            out.append(
                where.diag(
                    ERROR,
                    f"vsup sets --{flag} itself: remove it from args and use the [router] key "
                    f"'{owner}'",
                    key,
                    (key,),
                )
            )
        elif is_secret_name(flag):
            out.append(
                where.diag(
                    ERROR,
                    f"--{flag} takes a secret, and the router's command line shows in ps: "
                    "remove it (vsup does not pass secrets to the router yet)",
                    key,
                    (key,),
                )
            )
        elif not flag_value_ok(value):
            out.append(
                where.diag(
                    ERROR,
                    f"{toml_type(value)} cannot be a flag value: use a string, number, boolean "
                    "or array",
                    key,
                    (key,),
                )
            )
    return out


def flag_value_ok(value: Any) -> bool:
    """Whether a value has a command-line form (dates and times have none)."""
    if isinstance(value, (str, int, float, bool)):
        return True
    if isinstance(value, list):
        return all(flag_value_ok(v) for v in value)
    if isinstance(value, Mapping):
        return all(flag_value_ok(v) for v in value.values())
    return False


def _check_env(env: Mapping[str, Any], where: Where) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    for key, value in env.items():
        sub = (key,)
        if not ENV_NAME_RE.match(key):
            out.append(where.diag(ERROR, f"{key!r} is not an environment variable name", key, sub))
        if isinstance(value, bool):
            out.append(
                where.diag(
                    ERROR,
                    f'write the value as a string ("1" or "0"), not {str(value).lower()}',
                    key,
                    sub,
                )
            )
        elif not (isinstance(value, str) or is_number(value)):
            out.append(where.diag(ERROR, f"must be a string, not {toml_type(value)}", key, sub))
    return out


# -- profiles -------------------------------------------------------------------------------


def _check_profiles(layout: Layout, cache: ProfileCache) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    raw = layout.header.get("profiles")
    if raw is None:
        return out
    where = Where(layout.file, layout.source_map, ("layout", "profiles"), table="[layout]")
    names = [raw] if isinstance(raw, str) else raw if isinstance(raw, list) else []
    for name in names:
        if not isinstance(name, str):
            continue
        profile = cache.get(name)
        if profile is None:
            available = cache.available()
            close = suggest(name, available)
            if close:
                hint = f"did you mean '{close}'?"
            elif is_path_like(name):
                hint = "no such file (relative paths start from the layout's directory)"
            else:
                hint = "available: " + (", ".join(available) or "none")
            dirs = ", ".join(str(d) for d in cache.dirs)
            out.append(
                where.diag(
                    ERROR,
                    f"unknown profile '{name}': {hint} (looked in {dirs}; add directories with "
                    "$VSUP_PROFILE_PATH)",
                    "profiles",
                )
            )
            continue
        if profile.load_errors:
            out += profile.load_errors
            continue
        out += check_profile_document(
            profile.document, str(profile.path), SourceMap(profile.source), name
        )
    return out


def check_profile_document(
    doc: Mapping[str, Any], file: str, smap: SourceMap, name: str
) -> list[Diagnostic]:
    """The keys of one profile file: `[profile]` (description) and a `[defaults]` table."""
    out: list[Diagnostic] = []
    top = Where(file, smap, (), table=f"profile '{name}'")
    for key, value in doc.items():
        if key not in PROFILE_TOP_KEYS:
            close = suggest(key, PROFILE_TOP_KEYS)
            hint = (
                f"did you mean '{close}'?" if close else "a profile holds [profile] and [defaults]"
            )
            out.append(top.diag(ERROR, f"unknown key: {hint}", key, (key,)))
        elif not isinstance(value, Mapping):
            out.append(
                top.diag(ERROR, f"must be a table ([{key}]), not {toml_type(value)}", key, (key,))
            )
    if isinstance(doc.get("profile"), Mapping):
        w = Where(file, smap, ("profile",), table=f"profile '{name}' [profile]")
        out += check_table(doc["profile"], PROFILE_HEADER_KEYS, w, "profile-header")
    if isinstance(doc.get("defaults"), Mapping):
        w = Where(file, smap, ("defaults",), table=f"profile '{name}' [defaults]")
        out += check_table(doc["defaults"], DEFAULTS_KEYS, w, "profile")
    return out


# -- the whole document ---------------------------------------------------------------------


def _top_level(layout: Layout) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    doc = layout.document
    top = Where(layout.file, layout.source_map, ())
    for key in doc:
        if key not in TOP_KEYS:
            if key == "instances":
                hint = "write each instance as an [[instance]] table"
            elif key in LAYOUT_KEYS:
                hint = f"put it in the [layout] table: [layout] {key} = ..."
            elif key in COMMON_KEYS:
                hint = f"put it in the [defaults] table: [defaults] {key} = ..."
            elif key in INSTANCE_ONLY_KEYS:
                hint = "put it in an [[instance]] table"
            else:
                close = suggest(key, TOP_KEYS)
                hint = (
                    f"did you mean '{close}'?"
                    if close
                    else "a layout holds [layout], [defaults] and [[instance]] tables"
                )
            out.append(top.diag(ERROR, f"unknown key: {hint}", key, (key,)))
    for key in ("layout", "defaults"):
        if key in doc and not isinstance(doc[key], Mapping):
            out.append(
                top.diag(
                    ERROR, f"must be the [{key}] table, not {toml_type(doc[key])}", key, (key,)
                )
            )
    raw_instances = doc.get("instance")
    if raw_instances is not None:
        if isinstance(raw_instances, Mapping):
            out.append(
                top.diag(
                    ERROR,
                    "write [[instance]] (double brackets) for each instance, not [instance]",
                    "instance",
                    ("instance",),
                )
            )
        elif not isinstance(raw_instances, list) or not all(
            isinstance(t, Mapping) for t in raw_instances
        ):
            out.append(
                top.diag(ERROR, "instances must be [[instance]] tables", "instance", ("instance",))
            )
    return out


def _has_model_below_instances(layout: Layout, cache: ProfileCache) -> bool:
    """Whether `[defaults]` or a listed profile sets `model` (any value: a wrong type is its
    own error)."""
    if "model" in layout.defaults:
        return True
    for name in layout.profiles:
        profile = cache.get(name)
        if profile is not None and not profile.load_errors and "model" in profile.defaults:
            return True
    return False


def _instance_structure(layout: Layout, cache: ProfileCache) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    smap = layout.source_map
    model_below = _has_model_below_instances(layout, cache)
    names: dict[str, int] = {}
    for i, table in instance_tables(layout):
        where = Where(layout.file, smap, ("instance", i), instance=instance_label(table, i))
        out += check_table(table, INSTANCE_KEYS, where, "instance")
        for required, example in (
            ("name", 'name = "gpu0"'),
            ("gpus", "gpus = [0] (or [] for a CPU instance)"),
            ("port", "port = 8000"),
        ):
            if required not in table:
                out.append(where.diag(ERROR, f"missing: add {example}", required))
        if "model" not in table and not model_below:
            out.append(
                where.diag(
                    ERROR,
                    'no model: set model = "org/name" (or a local directory) in [defaults] or in '
                    "this instance",
                    "model",
                )
            )
        name = table.get("name")
        if isinstance(name, str):
            if name in names:
                first = names[name]
                first_line = smap.line(("instance", first))
                at = f" (line {first_line})" if first_line else ""
                out.append(
                    where.diag(
                        ERROR,
                        f"duplicate name '{name}': the instance #{first + 1}{at} has it too; "
                        "rename one",
                        "name",
                        ("name",),
                    )
                )
            else:
                names[name] = i
    return out


def _check_alerts(doc: Mapping[str, Any], where: Where) -> list[Diagnostic]:
    """`[alerts]`: a table of ALERTS_KEYS naming at least one way to reach a person."""
    if "alerts" not in doc:
        return []
    table = doc["alerts"]
    if not isinstance(table, Mapping):
        return [where.diag(ERROR, f"must be the [alerts] table, not {toml_type(table)}", None, ())]
    out = check_table(table, ALERTS_KEYS, where, "alerts")
    if "webhook_env" not in table and "command" not in table:
        out.append(
            where.diag(
                ERROR,
                'says nowhere to send alerts: add webhook_env = "VSUP_ALERT_WEBHOOK" (the '
                "variable holding the URL) or command = [...]",
                None,
                (),
            )
        )
    return out


def check_structure(layout: Layout, cache: ProfileCache) -> list[Diagnostic]:
    """Problems that stop the layout from being built (see the module docstring)."""
    if layout.load_errors:
        return list(layout.load_errors)
    out = _top_level(layout)
    doc = layout.document
    file, smap = layout.file, layout.source_map
    if isinstance(doc.get("layout"), Mapping):
        out += check_table(
            doc["layout"], LAYOUT_KEYS, Where(file, smap, ("layout",), table="[layout]"), "layout"
        )
    out += _check_alerts(doc, Where(file, smap, ("alerts",), table="[alerts]"))
    out += _check_profiles(layout, cache)
    if isinstance(doc.get("defaults"), Mapping):
        out += check_table(
            doc["defaults"],
            DEFAULTS_KEYS,
            Where(file, smap, ("defaults",), table="[defaults]"),
            "defaults",
        )
    out += _instance_structure(layout, cache)
    if "router" in doc:
        out += _router_structure(layout)
    return out


def _router_structure(layout: Layout) -> list[Diagnostic]:
    table = layout.document["router"]
    where = Where(layout.file, layout.source_map, ("router",), table="[router]")
    if not isinstance(table, Mapping):
        top = Where(layout.file, layout.source_map, ())
        return [
            top.diag(
                ERROR,
                f"must be the [router] table, not {toml_type(table)}, e.g. [router] port = 8080",
                "router",
                ("router",),
            )
        ]
    out = check_table(table, ROUTER_KEYS, where, "router")
    if "port" not in table:
        out.append(where.diag(ERROR, "missing: add port = 8080 (the port clients use)", "port"))
    return out
