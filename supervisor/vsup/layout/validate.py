"""Validation: every problem in a layout at once, each naming file, line, instance and key.

Two passes:
- `check_structure`: what stops a layout from being built at all (TOML syntax, unknown keys with
  "did you mean", wrong types, missing or duplicate names, unknown profiles). `Layout.resolve`
  runs only this.
- the rules (`validate`): ports, GPUs and their memory shares, tensor parallelism, secrets, model
  files, and the tuning guides' warnings (DESIGN.md, "Rules vsup applies").

Errors mean vLLM would not start, or two instances would fight over a port or a GPU. Warnings
mean it would start but probably not as intended; `vsup validate` exits 0 with warnings.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from vsup.layout import node as node_probe
from vsup.layout.diagnostics import (
    ERROR,
    WARNING,
    Diagnostic,
    merge_repeats,
    sort_key,
)
from vsup.layout.flags import flag_name
from vsup.layout.merge import MergedInstance, Origin, merge_instances, profile_cache_for
from vsup.layout.model import Layout, is_local_model, resolve_model_path
from vsup.layout.modelinfo import ModelInfo, model_info, quantized_by_name
from vsup.layout.profiles import ProfileCache, is_path_like
from vsup.layout.schema import (
    ARGS_OWNED_BY_KEYS,
    COMMON_KEYS,
    DEFAULTS_KEYS,
    ENV_NAME_RE,
    INSTANCE_KEYS,
    INSTANCE_ONLY_KEYS,
    LAYOUT_KEYS,
    MAX_GPU_UTILIZATION_SUM,
    PROFILE_HEADER_KEYS,
    PROFILE_TOP_KEYS,
    RESTART_KEYS,
    TOP_KEYS,
    VLLM_DEFAULT_GPU_MEMORY_UTILIZATION,
    Key,
    is_int,
    is_number,
    suggest,
    toml_type,
    type_problem,
)
from vsup.layout.sourcemap import SourceMap

# A model this small runs fastest as TP1 replicas (AMD's MI300X guide: <= 30B in TP1).
TP1_PARAMS_LIMIT = 30e9
# Below this start timeout, on-the-fly quantization (minutes of extra start-up) risks a timeout.
QUANTIZE_START_TIMEOUT_S = 1800
# vLLM flags that take a secret; a layout names the variable (api_key_env) instead.
SECRET_ARGS = ("api-key",)
SECRET_ENV = ("VLLM_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "OPENAI_API_KEY")
# Short vLLM aliases that flags.py would turn into unknown long flags (`tp` -> `--tp`).
ARG_ALIASES = {
    "tp": "tensor-parallel-size",
    "pp": "pipeline-parallel-size",
    "dp": "data-parallel-size",
    "q": "quantization",
    "ep": "enable-expert-parallel",
}


@lru_cache(maxsize=1)
def vllm_flags() -> frozenset[str]:
    """The long flags of `vllm serve` (vLLM 0.32), without the leading `--`."""
    text = resources.files("vsup.layout").joinpath("vllm_flags.txt").read_text()
    return frozenset(
        line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")
    )


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


def _origin_diag(severity: str, message: str, m: MergedInstance, *key: str) -> Diagnostic:
    """A diagnostic about a merged value, pointed at the file and line that set it."""
    key = tuple(k for k in key if k)
    origin: Origin = m.origin(*key)
    if origin.label == "built-in":
        origin = m.instance_origin  # vsup's own default: point at the instance using it
    suffix = (
        "" if origin.is_instance or origin.label == "[defaults]" else f" (set in {origin.label})"
    )
    return Diagnostic(
        severity,
        message + suffix,
        file=origin.file,
        line=origin.line,
        instance=m.label,
        key=".".join(key) or None,
    )


# -- structure ------------------------------------------------------------------------------


def _misplaced_hint(key: str, section: str) -> str | None:
    if section in ("defaults", "profile") and key in INSTANCE_ONLY_KEYS:
        return f"'{key}' is set per instance: move it into each [[instance]] table"
    if section in ("defaults", "instance", "profile") and key in LAYOUT_KEYS and key != "name":
        return f"'{key}' belongs in the [layout] table"
    if section == "layout" and key in COMMON_KEYS:
        return f"'{key}' belongs in [defaults] (or an [[instance]] table), not [layout]"
    if section in ("defaults", "instance", "profile") and flag_name(key)[2:] in vllm_flags():
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
            _check_restart(value, where.sub(key), out)
        elif spec.kind == "table" and key == "args":
            out += _check_args(value, where.sub(key))
        elif spec.kind == "env_table":
            out += _check_env(value, where.sub(key))
    return out


def _check_restart(table: Mapping[str, Any], where: Where, out: list[Diagnostic]) -> None:
    lo, hi = table.get("backoff_s"), table.get("backoff_max_s")
    if is_number(lo) and is_number(hi) and hi < lo:
        out.append(
            where.diag(
                ERROR,
                f"backoff_max_s ({hi}) is below backoff_s ({lo}): raise backoff_max_s or lower "
                "backoff_s",
                "backoff_max_s",
                ("backoff_max_s",),
            )
        )


def _check_args(args: Mapping[str, Any], where: Where) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    seen: dict[str, str] = {}
    flags = vllm_flags()
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
        if flag in SECRET_ARGS:
            out.append(
                where.diag(
                    ERROR,
                    "a secret must not be written in the layout: remove it and set "
                    'api_key_env = "VAR" (the supervisor passes $VAR to vLLM as VLLM_API_KEY)',
                    key,
                    sub,
                )
            )
            continue
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
        if not _flag_value_ok(value):
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
        elif flags and flag not in flags and not (flag.startswith("no-") and flag[3:] in flags):
            close = suggest(flag, sorted(flags))
            hint = (
                f"; did you mean '{close}'?"
                if close
                else "; check the spelling (vLLM exits with bad_args on an unknown flag)"
            )
            out.append(where.diag(WARNING, f"vLLM 0.32 has no flag --{flag}{hint}", key, sub))
    return out


def _flag_value_ok(value: Any) -> bool:
    if isinstance(value, (str, int, float, bool)):
        return True
    if isinstance(value, list):
        return all(_flag_value_ok(v) for v in value)
    if isinstance(value, Mapping):
        return all(_flag_value_ok(v) for v in value.values())
    return False  # dates and times have no command-line form


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
        if key in SECRET_ENV:
            out.append(
                where.diag(
                    ERROR,
                    "a secret must not be written in the layout: remove it; for the API key set "
                    'api_key_env = "VAR" and export VAR where the supervisor runs',
                    key,
                    sub,
                )
            )
    return out


def _check_profiles(layout: Layout, cache: ProfileCache) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    header = layout.header
    raw = header.get("profiles")
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


def check_structure(
    layout: Layout, cache: ProfileCache, merged: Sequence[MergedInstance] | None = None
) -> list[Diagnostic]:
    """Problems that stop the layout from being built (see the module docstring)."""
    if layout.load_errors:
        return list(layout.load_errors)
    out: list[Diagnostic] = []
    doc = layout.document
    file, smap = layout.file, layout.source_map
    top = Where(file, smap, ())
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
    if "layout" in doc and not isinstance(doc["layout"], Mapping):
        out.append(
            top.diag(
                ERROR,
                f"must be the [layout] table, not {toml_type(doc['layout'])}",
                "layout",
                ("layout",),
            )
        )
    if "defaults" in doc and not isinstance(doc["defaults"], Mapping):
        out.append(
            top.diag(
                ERROR,
                f"must be the [defaults] table, not {toml_type(doc['defaults'])}",
                "defaults",
                ("defaults",),
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
    if isinstance(doc.get("layout"), Mapping):
        out += check_table(
            doc["layout"], LAYOUT_KEYS, Where(file, smap, ("layout",), table="[layout]"), "layout"
        )
    out += _check_profiles(layout, cache)
    if isinstance(doc.get("defaults"), Mapping):
        out += check_table(
            doc["defaults"],
            DEFAULTS_KEYS,
            Where(file, smap, ("defaults",), table="[defaults]"),
            "defaults",
        )
    if merged is None:
        merged = merge_instances(layout, cache)
    names: dict[str, MergedInstance] = {}
    for m in merged:
        where = Where(file, smap, ("instance", m.index), instance=m.label)
        out += check_table(m.table, INSTANCE_KEYS, where, "instance")
        for required, example in (
            ("name", 'name = "gpu0"'),
            ("gpus", "gpus = [0] (or [] for a CPU instance)"),
            ("port", "port = 8000"),
        ):
            if required not in m.table:
                out.append(where.diag(ERROR, f"missing: add {example}", required))
        if "model" not in m.values and "model" not in m.table:
            out.append(
                where.diag(
                    ERROR,
                    'no model: set model = "org/name" (or a local directory) in [defaults] or in '
                    "this instance",
                    "model",
                )
            )
        name = m.name
        if name is not None:
            if name in names:
                first = names[name]
                first_line = smap.line(("instance", first.index))
                at = f" (line {first_line})" if first_line else ""
                out.append(
                    where.diag(
                        ERROR,
                        f"duplicate name '{name}': the instance #{first.index + 1}{at} has it "
                        "too; rename one",
                        "name",
                        ("name",),
                    )
                )
            else:
                names[name] = m
    return out


# -- rules ----------------------------------------------------------------------------------


def _env_flag_on(value: Any) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes", "on")


def _int_arg(value: Any) -> int | None:
    """An integer flag value as vLLM reads it: 8192, "8192", "8k" (1000s), "8K" (1024s)."""
    if is_int(value):
        return value
    if isinstance(value, str):
        import re

        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)([kKmMgG]?)\s*", value)
        if m:
            number, suffix = m.groups()
            if not suffix:
                return int(float(number))
            if suffix.islower():
                return int(float(number) * {"k": 10**3, "m": 10**6, "g": 10**9}[suffix])
            if "." not in number:
                return int(number) * {"K": 2**10, "M": 2**20, "G": 2**30}[suffix]
    return None


class _Models:
    """model_info per (model, base dir), computed once per validation."""

    def __init__(self, base_dir: Path) -> None:
        self.base_dir = base_dir
        self._cache: dict[str, ModelInfo] = {}

    def get(self, model: str) -> ModelInfo:
        if model not in self._cache:
            self._cache[model] = model_info(model, self.base_dir)
        return self._cache[model]


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
    merged = merge_instances(layout, cache)
    out = check_structure(layout, cache, merged)
    if layout.load_errors:
        return out
    probed = False
    if node_gpus is None:
        gpus = node_probe.node_gpus()
        node_gpus = len(gpus) or None
        probed = True
        if gpu_memory_bytes is None and gpus and gpus[0].memory_bytes:
            gpu_memory_bytes = min(g.memory_bytes or 0 for g in gpus) or None
    out += _rules(layout, merged, node_gpus, probed, gpu_memory_bytes)
    out = merge_repeats(out)
    return sorted(out, key=sort_key)


def _rules(
    layout: Layout,
    merged: Sequence[MergedInstance],
    node_gpus: int | None,
    probed: bool,
    gpu_memory_bytes: int | None,
) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    models = _Models(layout.base_dir)
    out += _port_rules(layout, merged)
    out += _gpu_rules(merged, node_gpus, probed, layout.file)
    for m in merged:
        out += _instance_rules(layout, m, models, gpu_memory_bytes)
    return out


def _port_rules(layout: Layout, merged: Sequence[MergedInstance]) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    by_port: dict[int, MergedInstance] = {}
    listen = layout.metrics_listen
    for m in merged:
        port = m.values.get("port")
        if not is_int(port) or not 1 <= port <= 65535:
            continue
        if port in by_port:
            other = by_port[port]
            out.append(
                _origin_diag(
                    ERROR,
                    f"port {port} is also used by instance '{other.label}': give each instance "
                    "its own port",
                    m,
                    "port",
                )
            )
        else:
            by_port[port] = m
        if listen and listen[1] == port:
            out.append(
                _origin_diag(
                    ERROR,
                    f"port {port} is also the metrics exporter's ([layout] metrics_listen): "
                    "change one",
                    m,
                    "port",
                )
            )
        if port < 1024:
            out.append(
                _origin_diag(
                    WARNING,
                    f"port {port} is privileged: vLLM needs root to bind it; use 1024 or above",
                    m,
                    "port",
                )
            )
    return out


def _gpu_rules(
    merged: Sequence[MergedInstance], node_gpus: int | None, probed: bool, file: str | None
) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    shares: dict[int, list[tuple[MergedInstance, float, bool]]] = {}
    any_gpu = False
    for m in merged:
        gpus = m.gpus
        if gpus is None:
            continue
        if gpus:
            any_gpu = True
        for g in gpus:
            if g < 0:
                out.append(
                    _origin_diag(
                        ERROR, f"GPU index {g} is negative: GPUs are numbered from 0", m, "gpus"
                    )
                )
            elif node_gpus is not None and g >= node_gpus:
                source = "this node has" if probed else "--node-gpus says the node has"
                out.append(
                    _origin_diag(
                        ERROR,
                        f"GPU {g} does not exist: {source} {node_gpus} "
                        f"GPU{'s' if node_gpus != 1 else ''} "
                        f"(0-{node_gpus - 1}); use an index in that range",
                        m,
                        "gpus",
                    )
                )
        dupes = sorted({g for g in gpus if gpus.count(g) > 1})
        if dupes:
            out.append(
                _origin_diag(
                    ERROR, f"GPU {dupes[0]} is listed twice: list each GPU once", m, "gpus"
                )
            )
        util = m.values.get("gpu_memory_utilization")
        if gpus:
            explicit = util is not None
            share = float(util) if explicit else VLLM_DEFAULT_GPU_MEMORY_UTILIZATION
            if 0 < share <= 1:  # an out-of-range value is reported on its own
                for g in set(gpus):
                    shares.setdefault(g, []).append((m, share, explicit))
        elif util is not None:
            out.append(
                _origin_diag(
                    WARNING,
                    "a CPU instance (gpus = []) ignores gpu_memory_utilization; size its KV cache "
                    "with env VLLM_CPU_KVCACHE_SPACE (GiB)",
                    m,
                    "gpu_memory_utilization",
                )
            )
    if any_gpu and node_gpus is None:
        out.append(
            Diagnostic(
                WARNING,
                "no GPU found on this node: GPU indices were only checked to be >= 0; pass "
                "--node-gpus N to check them against a node with N GPUs",
                file=file,
            )
        )
    for g in sorted(shares):
        tenants = shares[g]
        total = sum(s for _, s, _ in tenants)
        if total > MAX_GPU_UTILIZATION_SUM + 1e-9:
            parts = ", ".join(
                f"'{m.label}' {s:g}" + ("" if explicit else " (vLLM's default)")
                for m, s, explicit in tenants
            )
            for m, _, explicit in tenants:
                out.append(
                    _origin_diag(
                        ERROR,
                        f"GPU {g} is over-committed: gpu_memory_utilization adds up to {total:.2f} "
                        f"({parts}); keep the sum at or below {MAX_GPU_UTILIZATION_SUM} "
                        f"(e.g. {math.floor(MAX_GPU_UTILIZATION_SUM * 100 / len(tenants)) / 100:g} "
                        "each) or move an instance",
                        m,
                        "gpu_memory_utilization" if explicit else "gpus",
                    )
                )
    return out


def _instance_rules(
    layout: Layout, m: MergedInstance, models: _Models, gpu_memory_bytes: int | None
) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    v = m.values
    gpus = m.gpus
    model = v.get("model")
    info: ModelInfo | None = None
    if isinstance(model, str):
        if not model.strip():
            out.append(
                _origin_diag(
                    ERROR, 'model is empty: set model = "org/name" or a local directory', m, "model"
                )
            )
        elif is_local_model(model):
            path = Path(resolve_model_path(model, layout.base_dir))
            if not path.exists():
                rel = (
                    " (relative paths start from the layout's directory)"
                    if model.startswith(".")
                    else ""
                )
                out.append(
                    _origin_diag(
                        ERROR,
                        f"local model path {path} does not exist{rel}: fix the path or download "
                        "the model there",
                        m,
                        "model",
                    )
                )
            else:
                info = models.get(model)
        else:
            info = models.get(model)
    command = v.get("command")
    if isinstance(command, list) and command and command[0]:
        program = command[0]
        if (
            program not in ("python", "python3")
            and shutil.which(program) is None
            and not Path(program).is_file()
        ):
            out.append(
                _origin_diag(
                    WARNING,
                    f"command '{program}' is not found on this node (fine if this layout is for "
                    "another node); "
                    'install vLLM or set command (e.g. ["python", "-m", '
                    '"vllm.entrypoints.openai.api_server"])',
                    m,
                    "command",
                )
            )
    # tensor parallelism
    tp_key = m.arg_key("tensor-parallel-size")
    tp_raw = m.arg("tensor-parallel-size")
    pp_raw = m.arg("pipeline-parallel-size")
    tp = _int_arg(tp_raw) if tp_raw is not None else None
    pp = _int_arg(pp_raw) if pp_raw is not None else 1
    if tp_raw is not None and (tp is None or tp < 1):
        out.append(
            _origin_diag(
                ERROR,
                f"tensor-parallel-size must be a positive integer, not {tp_raw!r}",
                m,
                "args",
                tp_key,
            )
        )
    if pp_raw is not None and (pp is None or pp < 1):
        out.append(
            _origin_diag(
                ERROR,
                f"pipeline-parallel-size must be a positive integer, not {pp_raw!r}",
                m,
                "args",
                m.arg_key("pipeline-parallel-size") or "",
            )
        )
        pp = None
    if gpus and tp is not None and pp is not None and tp * pp != len(gpus):
        what = f"tensor-parallel-size {tp}" + (f" x pipeline-parallel-size {pp}" if pp != 1 else "")
        out.append(
            _origin_diag(
                ERROR,
                f"{what} needs {tp * pp} GPU(s) but gpus lists {len(gpus)}: make them match "
                f"(or drop tensor-parallel-size: vsup sets it from gpus)",
                m,
                "args",
                tp_key,
            )
        )
    effective_tp = tp if tp is not None else (max(1, len(gpus)) if gpus else 1)
    env = m.env
    for var, message in (
        (
            "HIP_VISIBLE_DEVICES",
            (
                "vLLM on ROCm reads CUDA_VISIBLE_DEVICES, and HIP_VISIBLE_DEVICES renumbers the "
                "GPUs a second time; vsup removes it: delete it from env"
            ),
        ),
        (
            "CUDA_VISIBLE_DEVICES",
            "vsup sets CUDA_VISIBLE_DEVICES from gpus: delete it from env and list the GPUs there",
        ),
        (
            "VLLM_ATTENTION_BACKEND",
            'recent vLLM ignores VLLM_ATTENTION_BACKEND: use args = { attention-backend = "..." }',
        ),
    ):
        if var in env:
            out.append(_origin_diag(WARNING, message, m, "env", var))
    if "NCCL_MIN_NCHANNELS" in env and gpus and effective_tp == 1 and (pp or 1) == 1:
        out.append(
            _origin_diag(
                WARNING,
                "NCCL_MIN_NCHANNELS only helps multi-GPU (TP>1) instances; on a TP1 instance it "
                "does nothing: remove it",
                m,
                "env",
                "NCCL_MIN_NCHANNELS",
            )
        )
    if info is not None and effective_tp > 1:
        params = info.params
        if params is not None and params <= TP1_PARAMS_LIMIT:
            out.append(
                _origin_diag(
                    WARNING,
                    f"the model has about {params / 1e9:.1f}B parameters ({info.params_source}): "
                    "up to 30B, "
                    f"{effective_tp} TP1 replicas (one per GPU) usually serve more than one "
                    f"TP{effective_tp} instance",
                    m,
                    "gpus",
                )
            )
    # MLA with AITER on ROCm needs --block-size 1
    if info is not None and info.is_mla and gpus:
        aiter = _env_flag_on(env.get("VLLM_ROCM_USE_AITER", "0"))
        aiter_mla = _env_flag_on(env.get("VLLM_ROCM_USE_AITER_MLA", "1"))
        backend = str(m.arg("attention-backend") or "")
        other_backend = backend and "AITER_MLA" not in backend.upper()
        block = _int_arg(m.arg("block-size")) if m.arg("block-size") is not None else None
        if aiter and aiter_mla and not other_backend and block != 1:
            out.append(
                _origin_diag(
                    ERROR,
                    f"{model} uses MLA (its config has kv_lora_rank) and VLLM_ROCM_USE_AITER=1 "
                    "selects the "
                    "AITER MLA backend, which needs --block-size 1 (vLLM refuses to start "
                    "otherwise): "
                    "add block-size = 1 to args",
                    m,
                    "args",
                    m.arg_key("block-size") or "",
                )
            )
    # on-the-fly quantization
    quant = m.arg("quantization")
    if isinstance(quant, str) and quant and isinstance(model, str):
        prequantized = (info is not None and info.quantization is not None) or quantized_by_name(
            model
        ) is not None
        timeout = v.get("start_timeout_s")
        if not prequantized and is_number(timeout) and timeout < QUANTIZE_START_TIMEOUT_S:
            out.append(
                _origin_diag(
                    WARNING,
                    f"quantization = '{quant}' quantizes {model} while it loads, which adds "
                    "minutes to "
                    f"start-up: raise start_timeout_s (now {timeout:g}) to "
                    f"{QUANTIZE_START_TIMEOUT_S} or "
                    "more, or serve a pre-quantized checkpoint",
                    m,
                    "args",
                    m.arg_key("quantization") or "",
                )
            )
    # scheduler limits vLLM enforces at start-up
    seqs = _int_arg(m.arg("max-num-seqs")) if m.arg("max-num-seqs") is not None else None
    batched = (
        _int_arg(m.arg("max-num-batched-tokens"))
        if m.arg("max-num-batched-tokens") is not None
        else None
    )
    if seqs is not None and batched is not None and batched < seqs:
        out.append(
            _origin_diag(
                ERROR,
                f"max-num-batched-tokens ({batched}) is below max-num-seqs ({seqs}); vLLM refuses "
                "to start: "
                "raise max-num-batched-tokens or lower max-num-seqs",
                m,
                "args",
                m.arg_key("max-num-batched-tokens") or "",
            )
        )
    out += _kv_rules(m, info, gpus, effective_tp, seqs, gpu_memory_bytes)
    return out


def _kv_rules(
    m: MergedInstance,
    info: ModelInfo | None,
    gpus: list[int] | None,
    tp: int,
    seqs: int | None,
    gpu_memory_bytes: int | None,
) -> list[Diagnostic]:
    """KV capacity vs what the flags ask of it, where the capacity can be computed."""
    from vsup.layout.plan import estimate_kv_tokens

    out: list[Diagnostic] = []
    max_len_raw = m.arg("max-model-len")
    max_len = _int_arg(max_len_raw) if max_len_raw is not None else None
    if max_len is not None and max_len < 0:
        max_len = None  # -1 / "auto": vLLM fits it to the memory
    if max_len is None and info is not None:
        max_len = info.max_position_embeddings
    if max_len is None:
        return out
    blocks_raw = m.arg("num-gpu-blocks-override")
    block_raw = m.arg("block-size")
    block_size = _int_arg(block_raw) if block_raw is not None else (128 if gpus == [] else 16)
    capacity: int | None = None
    how = ""
    exact = False
    if blocks_raw is not None and _int_arg(blocks_raw) is not None and block_size:
        blocks = _int_arg(blocks_raw)
        # vLLM keeps one block aside (the null block): usable = (blocks - 1) x block size.
        capacity = max(0, (blocks - 1) * block_size)  # type: ignore[operator]
        how = (
            f"num-gpu-blocks-override {blocks} x block size {block_size}, "
            "less vLLM's reserved block"
        )
        exact = True
    elif info is not None:
        kv_dtype = m.arg("kv-cache-dtype")
        dtype = m.arg("dtype")
        per_token = info.kv_bytes_per_token(
            str(kv_dtype) if kv_dtype else None, tp, str(dtype) if dtype else None
        )
        if per_token:
            if gpus == []:
                space = m.env.get("VLLM_CPU_KVCACHE_SPACE")
                gib = (
                    float(space)
                    if is_number(space) or (isinstance(space, str) and _is_float(space))
                    else None
                )
                if gib:
                    capacity = int(gib * 1024**3 // per_token)
                    how = f"VLLM_CPU_KVCACHE_SPACE {gib:g} GiB / {per_token} bytes per token"
            elif gpus and gpu_memory_bytes:
                util = m.values.get("gpu_memory_utilization", VLLM_DEFAULT_GPU_MEMORY_UTILIZATION)
                weights, _ = info.weight_bytes(
                    str(dtype) if dtype else None, str(m.arg("quantization") or "") or None
                )
                if weights is not None:
                    capacity = estimate_kv_tokens(
                        gpu_memory_bytes, float(util), weights, tp, per_token
                    )
                    how = (
                        f"estimate: {float(util):g} of {gpu_memory_bytes / 1024**3:.0f} GiB, "
                        "less weights and overhead"
                    )
    if capacity is None:
        return out
    if capacity < max_len:
        severity = ERROR if exact else WARNING
        verb = "vLLM refuses to start" if exact else "vLLM will likely refuse to start"
        out.append(
            _origin_diag(
                severity,
                f"the KV cache holds {capacity} tokens ({how}) but max-model-len is {max_len}: "
                f"{verb}; "
                "lower max-model-len or give the instance more KV cache",
                m,
                "args",
                m.arg_key("max-model-len") or m.arg_key("num-gpu-blocks-override") or "",
            )
        )
    elif seqs is not None and seqs * max_len > capacity:
        out.append(
            _origin_diag(
                WARNING,
                f"max-num-seqs {seqs} x max-model-len {max_len} = {seqs * max_len} tokens, beyond "
                "the KV "
                f"cache's {capacity} ({how}): full-length requests will be preempted; lower "
                "max-num-seqs "
                f"to {max(1, capacity // max_len)} or max-model-len, or give it more KV cache",
                m,
                "args",
                m.arg_key("max-num-seqs") or "",
            )
        )
    return out


def _is_float(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


def validate_file(
    path: Path | str, node_gpus: int | None = None, profile_dirs: Sequence[Path] | None = None
) -> tuple[Layout, list[Diagnostic]]:
    """Load and validate a layout file: the layout and its diagnostics (errors first)."""
    from vsup.layout.model import load_layout

    layout = load_layout(path)
    return layout, validate(layout, node_gpus, profile_dirs)


def has_errors(diagnostics: Iterable[Diagnostic]) -> bool:
    return any(d.is_error for d in diagnostics)


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
