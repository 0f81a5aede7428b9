"""The candidates of a tune: the base layout with its knobs varied, pruned before anything runs.

A knob is one of
- `per_gpu`: instances per GPU (or per TP group), each with its share of the GPU's memory
  (`vsup plan`'s split: 0.90 / 2 -> 0.45);
- `tp`: GPUs per instance (tensor parallel), the base's GPUs regrouped: N TP1 replicas
  against TP-N;
- an `args` key: a vLLM flag set in `[defaults]` for every instance (max-num-batched-tokens,
  max-num-seqs, enforce-eager, compilation-config for the CUDA-graph mode, ...);
- an `env` key: a variable for every instance (the AITER switches on ROCm).

The defaults come from the node and the model (`default_space`); a `[tune]` table (in the base
layout or a `--space` file) overrides them knob by knob:

    [tune]
    per_gpu = [1, 2, 3]
    tp = [1]
    args = { max-num-batched-tokens = [8192, 32768] }   # replaces the default args knobs
    env = { VLLM_ROCM_USE_AITER = ["0", "1"] }          # replaces the default env knobs

Every combination is a candidate. Before anything starts each one is compiled and validated on
this node (vsup.layout.compile_layout), checked against the rules vLLM refuses at start (its
max-num-seqs above its max-num-batched-tokens), and for GPU shapes sized by the planner
(vsup.layout.plan): a candidate whose instances cannot hold one request of max-model-len is
pruned with the planner's words. A pruned candidate is reported with its reason, never started.
"""

from __future__ import annotations

import copy
import itertools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vsup.layout.flags import flag_name
from vsup.layout.model import dumps_document
from vsup.layout.modelpath import is_local_model, resolve_model_path
from vsup.layout.node import NodeFacts
from vsup.layout.plan import DEFAULT_UTILIZATION, split_utilization
from vsup.layout.spec import InstanceSpec

SHAPE_KNOBS = ("per_gpu", "tp")
TABLE_KEYS = (*SHAPE_KNOBS, "args", "env")
# The guides' sweep for max-num-batched-tokens on GPUs ("8k to 64k"): the two ends that
# matter most for the latency/throughput balance; a [tune] table widens it.
GPU_BATCHED_TOKENS = (8192, 32768)
CPU_BATCHED_TOKENS = (2048, 8192)
DEFAULT_PER_GPU = (1, 2, 3)
AITER_ENV = "VLLM_ROCM_USE_AITER"
# Flags a [tune] args knob may not vary: the shape knobs own them, or the candidate would no
# longer be the same service.
ARGS_NOT_TUNED = {
    "--tensor-parallel-size": "use the tp knob",
    "--tp": "use the tp knob",
    "--data-parallel-size": "data parallel is kept as the base layout has it",
    "--model": "a tune compares layouts of one model",
    "--served-model-name": "a tune compares layouts of one model",
    "--port": "vsup gives the ports",
    "--host": "vsup gives the address",
    "--gpu-memory-utilization": "the per_gpu knob splits the memory",
}


class SpaceError(ValueError):
    """A search space that cannot be built; the message names the file and key."""


@dataclass(frozen=True)
class SearchSpace:
    """The values of each knob, and where each came from (`why`: knob -> words)."""

    per_gpu: tuple[int, ...] = (1,)
    tp: tuple[int, ...] = ()  # () keeps the base layout's GPUs per instance
    args: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
    env: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    why: Mapping[str, str] = field(default_factory=dict)

    @property
    def size(self) -> int:
        n = len(self.per_gpu) * max(1, len(self.tp))
        for values in (*self.args.values(), *self.env.values()):
            n *= len(values)
        return n

    def to_json(self) -> dict[str, Any]:
        return {
            "per_gpu": list(self.per_gpu),
            "tp": list(self.tp),
            "args": {k: list(v) for k, v in self.args.items()},
            "env": {k: list(v) for k, v in self.env.items()},
            "why": dict(self.why),
            "size": self.size,
        }


@dataclass(frozen=True)
class Knobs:
    """One candidate's settings."""

    per_gpu: int
    tp: int | None  # None: the base layout's grouping
    args: tuple[tuple[str, Any], ...] = ()
    env: tuple[tuple[str, str], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "per_gpu": self.per_gpu,
            "tp": self.tp,
            "args": dict(self.args),
            "env": dict(self.env),
        }

    def words(self) -> str:
        """`per_gpu 2, max-num-seqs 8`: for tables and the chosen layout's comment."""
        parts = [f"per_gpu {self.per_gpu}"]
        if self.tp is not None:
            parts.append(f"tp {self.tp}")
        parts += [f"{k} {_value_words(v)}" for k, v in self.args]
        parts += [f"{k}={v}" for k, v in self.env]
        return ", ".join(parts)


@dataclass
class Base:
    """The base layout: its file, text, parsed document and compiled specs."""

    path: Path
    text: str
    document: dict[str, Any]
    specs: list[InstanceSpec]
    name: str

    @property
    def gpus(self) -> list[int]:
        return sorted({g for s in self.specs for g in s.gpus})

    @property
    def on_gpus(self) -> bool:
        return bool(self.specs) and all(s.gpus for s in self.specs)

    @property
    def group_size(self) -> int:
        return len(self.specs[0].gpus) if self.specs else 0

    @property
    def base_per_gpu(self) -> int:
        """Instances sharing the first instance's GPUs in the base layout."""
        if not self.on_gpus:
            return 1
        first = set(self.specs[0].gpus)
        return sum(1 for s in self.specs if set(s.gpus) == first)

    def shape_problem(self) -> str | None:
        """Why the shape knobs cannot regroup this layout, or None."""
        if not self.on_gpus:
            return "its instances run on CPUs (gpus = [])"
        if len({s.model for s in self.specs}) > 1:
            return "it serves more than one model"
        if len({len(s.gpus) for s in self.specs}) > 1:
            return "its instances have different numbers of GPUs"
        if any(s.arg("data-parallel-size") not in (None, 1, "1") for s in self.specs):
            return "it uses data parallel"
        return None


@dataclass
class Candidate:
    index: int  # 1-based, in run order
    name: str  # the candidate layout's name
    knobs: Knobs
    toml: str
    specs: list[InstanceSpec] = field(default_factory=list)
    pruned: str | None = None  # why it is not run
    notes: list[str] = field(default_factory=list)
    same_as_base: bool = False  # the base layout's instances unchanged: no restart

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "name": self.name,
            "knobs": self.knobs.to_json(),
            "words": self.knobs.words(),
            "instances": [s.name for s in self.specs],
            "pruned": self.pruned,
            "notes": list(self.notes),
            "same_as_base": self.same_as_base,
        }


# -- the space ---------------------------------------------------------------------------------


def default_space(base: Base, node: NodeFacts) -> SearchSpace:
    """The knobs worth trying on this node for this model (see the module doc)."""
    why: dict[str, str] = {}
    per_gpu: tuple[int, ...]
    if base.on_gpus and base.shape_problem() is None:
        per_gpu = DEFAULT_PER_GPU
        why["per_gpu"] = "default: 1-3 instances per GPU; the planner prunes those that do not fit"
        n, group = len(base.gpus), base.group_size
        tp: tuple[int, ...] = (group,)
        if group == 1 and n in (2, 4, 8):
            tp = (1, n)
            why["tp"] = f"default: {n} TP1 replicas against one TP{n} instance"
        args: dict[str, tuple[Any, ...]] = {"max-num-batched-tokens": GPU_BATCHED_TOKENS}
        why["max-num-batched-tokens"] = "default: the guides' latency/throughput sweep (8k, 32k)"
    else:
        per_gpu, tp = (1,), ()
        args = {"max-num-batched-tokens": CPU_BATCHED_TOKENS}
        why["max-num-batched-tokens"] = "default on CPU instances: 2k, 8k"
    env: dict[str, tuple[str, ...]] = {}
    rocm = node.vendor == "amd" or any(p.startswith("rocm") for s in base.specs for p in s.profiles)
    if rocm and base.on_gpus:
        env[AITER_ENV] = ("0", "1")
        why[AITER_ENV] = "default on ROCm: AITER kernels off and on"
    return SearchSpace(per_gpu, tp, args, env, why)


def read_table(table: Any, where: str) -> dict[str, Any]:
    """A `[tune]` table checked: {knob: values}; SpaceError naming `where` and the key."""
    if not isinstance(table, Mapping):
        raise SpaceError(f"{where}: [tune] must be a table")
    out: dict[str, Any] = {}
    for key, value in table.items():
        at = f"{where}: [tune] key '{key}'"
        if key not in TABLE_KEYS:
            raise SpaceError(f"{at}: unknown; use one of {', '.join(TABLE_KEYS)}")
        if key in SHAPE_KNOBS:
            out[key] = _int_list(value, at)
            continue
        if not isinstance(value, Mapping) or not value:
            raise SpaceError(f"{at}: must be a table of lists, e.g. {key} = {{ NAME = [a, b] }}")
        knobs: dict[str, tuple[Any, ...]] = {}
        for name, values in value.items():
            kat = f"{where}: [tune.{key}] key '{name}'"
            if key == "args" and flag_name(name) in ARGS_NOT_TUNED:
                raise SpaceError(f"{kat}: not a tune knob ({ARGS_NOT_TUNED[flag_name(name)]})")
            if not isinstance(values, list) or not values:
                raise SpaceError(f"{kat}: must be a non-empty list of values, e.g. [a, b]")
            if key == "env" and not all(isinstance(v, str) for v in values):
                raise SpaceError(f'{kat}: environment values are strings, e.g. ["0", "1"]')
            if len({repr(v) for v in values}) != len(values):
                raise SpaceError(f"{kat}: a value is given twice")
            knobs[name] = tuple(values)
        out[key] = knobs
    return out


def build_space(base: Base, node: NodeFacts, overrides: Sequence[tuple[str, Any]]) -> SearchSpace:
    """The defaults with each `[tune]` table (where, table) laid over them in order."""
    space = default_space(base, node)
    per_gpu, tp = space.per_gpu, space.tp
    args, env, why = dict(space.args), dict(space.env), dict(space.why)
    for where, table in overrides:
        knobs = read_table(table, where)
        for key in SHAPE_KNOBS:
            if key in knobs:
                problem = base.shape_problem()
                if problem and knobs[key] != [1]:
                    raise SpaceError(
                        f"{where}: [tune] key '{key}': the base layout {base.path} cannot be "
                        f"regrouped: {problem}"
                    )
                why[key] = f"{where} [tune]"
        if "per_gpu" in knobs:
            per_gpu = tuple(knobs["per_gpu"])
        if "tp" in knobs:
            tp = tuple(knobs["tp"]) if base.on_gpus else ()
            for t in tp:
                if len(base.gpus) % t:
                    raise SpaceError(
                        f"{where}: [tune] key 'tp': {t} does not divide the base layout's "
                        f"{len(base.gpus)} GPUs ({base.gpus})"
                    )
        for key, target in (("args", args), ("env", env)):
            if key in knobs:
                for old in list(target):
                    target.pop(old)
                    why.pop(old, None)
                for name, values in knobs[key].items():
                    target[name] = values
                    why[name] = f"{where} [tune]"
    return SearchSpace(per_gpu, tp, args, env, why)


# -- the candidates ----------------------------------------------------------------------------


def enumerate_knobs(space: SearchSpace) -> list[Knobs]:
    """Every combination, shapes outermost: candidates of one shape run one after another
    (fewer instances restarted between them; vLLM's compile cache stays warm for them)."""
    tps: list[int | None] = list(space.tp) or [None]
    arg_names, env_names = list(space.args), list(space.env)
    out = []
    for tp, per in itertools.product(tps, space.per_gpu):
        for arg_values in itertools.product(*(space.args[n] for n in arg_names)):
            for env_values in itertools.product(*(space.env[n] for n in env_names)):
                out.append(
                    Knobs(
                        per_gpu=per,
                        tp=tp,
                        args=tuple(zip(arg_names, arg_values, strict=True)),
                        env=tuple(zip(env_names, env_values, strict=True)),
                    )
                )
    return out


def candidate_document(base: Base, knobs: Knobs, name: str) -> dict[str, Any]:
    """The base layout's document with `knobs` applied (a new document; the base is kept)."""
    doc = copy.deepcopy(base.document)
    doc.pop("tune", None)
    header = doc.setdefault("layout", {})
    header["name"] = name
    defaults = doc.setdefault("defaults", {})
    # a local model path relative to the base file would not resolve from the out dir
    for table in (defaults, *doc.get("instance", ())):
        model = table.get("model")
        if isinstance(model, str) and is_local_model(model):
            table["model"] = resolve_model_path(model, base.path.parent)
    if knobs.args:
        d_args = defaults.setdefault("args", {})
        for key, value in knobs.args:
            _drop_flag(d_args, key)
            d_args[key] = value
            for inst in doc.get("instance", ()):
                _drop_flag(inst.get("args") or {}, key)
    if knobs.env:
        d_env = defaults.setdefault("env", {})
        for key, value in knobs.env:
            d_env[key] = value
            for inst in doc.get("instance", ()):
                (inst.get("env") or {}).pop(key, None)
    if knobs.per_gpu != base.base_per_gpu or (knobs.tp is not None and knobs.tp != base.group_size):
        doc["instance"] = _regrouped(base, doc["instance"], knobs)
    return doc


def _regrouped(base: Base, instances: list[dict[str, Any]], knobs: Knobs) -> list[dict[str, Any]]:
    """The base's GPUs in groups of `tp`, `per_gpu` instances each, from the first instance's
    table; the memory share of each GPU split as `vsup plan` splits it."""
    template = {k: v for k, v in instances[0].items() if k not in ("name", "gpus", "port")}
    for key in ("tp", "tensor-parallel-size", "tensor_parallel_size"):
        (template.get("args") or {}).pop(key, None)
    first = base.specs[0]
    total = (first.gpu_memory_utilization or DEFAULT_UTILIZATION) * base.base_per_gpu
    total = min(round(total, 2), DEFAULT_UTILIZATION if total > 0.95 else total)
    share = split_utilization(total, knobs.per_gpu)
    tp = knobs.tp or base.group_size
    gpus = base.gpus
    port = min(s.port for s in base.specs)
    out = []
    for g in range(0, len(gpus), tp):
        group = gpus[g : g + tp]
        for j in range(knobs.per_gpu):
            suffix = chr(ord("a") + j) if knobs.per_gpu > 1 else ""
            name = f"gpu{group[0]}" + (f"-tp{tp}" if tp > 1 else "") + suffix
            table = copy.deepcopy(template)
            table = {"name": name, "gpus": list(group), "port": port, **table}
            table["gpu_memory_utilization"] = share
            port += 1
            out.append(table)
    return out


def _drop_flag(args: dict[str, Any], key: str) -> None:
    want = flag_name(key)
    for k in [k for k in args if flag_name(k) == want]:
        args.pop(k)


def label(knobs: Knobs, space: SearchSpace) -> str:
    """A short name of what varies: `pg2-mnbt8k`, `mns16`; `base` when nothing does."""
    parts = []
    if len(space.per_gpu) > 1:
        parts.append(f"pg{knobs.per_gpu}")
    if len(space.tp) > 1 and knobs.tp is not None:
        parts.append(f"tp{knobs.tp}")
    for key, value in knobs.args:
        if len(space.args[key]) > 1:
            parts.append(_abbrev(key) + _value_label(value))
    for key, value in knobs.env:
        if len(space.env[key]) > 1:
            parts.append(_abbrev(key.removeprefix("VLLM_").lower()) + _value_label(value))
    return "-".join(parts) or "base"


def _abbrev(key: str) -> str:
    words = [w for w in re.split(r"[-_]", key.lstrip("-")) if w]
    return "".join(w[0] for w in words).lower()


def _value_label(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, int) and value >= 1024 and value % 1024 == 0:
        return f"{value // 1024}k"
    text = re.sub(r"[^a-zA-Z0-9]+", "", str(value)).lower()
    return text[:12] or "x"


def _value_words(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _int_list(value: Any, where: str) -> list[int]:
    if not isinstance(value, list) or not value:
        raise SpaceError(f"{where}: must be a non-empty list of integers, e.g. [1, 2]")
    for v in value:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise SpaceError(f"{where}: {v!r} is not an integer of 1 or more")
    if len(set(value)) != len(value):
        raise SpaceError(f"{where}: a value is given twice")
    return list(value)


def _int_arg(spec: InstanceSpec, key: str) -> int | None:
    value = spec.arg(key)
    try:
        return None if value is None or isinstance(value, bool) else int(value)
    except (TypeError, ValueError):
        return None


# -- build and prune ---------------------------------------------------------------------------


def make_candidates(
    base: Base,
    space: SearchSpace,
    node: NodeFacts,
    *,
    plan: bool = True,
) -> list[Candidate]:
    """Every candidate of `space`, compiled on `node`; the invalid ones carry `pruned`.

    `plan`: size GPU shapes with the planner (tests of the space alone turn it off)."""
    from vsup.layout.compiled import compile_layout

    out: list[Candidate] = []
    seen: dict[str, str] = {}
    names: set[str] = set()
    planned: dict[tuple[int, int], str | None] = {}
    for knobs in enumerate_knobs(space):
        short = label(knobs, space)
        name = f"{base.name}-{short}"
        while name in names:
            name += "x"
        names.add(name)
        doc = candidate_document(base, knobs, name)
        text = dumps_document(doc)
        cand = Candidate(len(out) + 1, name, knobs, text)
        out.append(cand)
        body = dumps_document({k: v for k, v in doc.items() if k != "layout"})
        if body in seen:
            cand.pruned = f"the same layout as {seen[body]}"
            continue
        seen[body] = name
        compiled, diagnostics = compile_layout(text, base.path.parent / f"{name}.toml", node)
        if compiled is None:
            errors = [d.format() for d in diagnostics if d.is_error]
            cand.pruned = "does not validate: " + "; ".join(errors[:3])
            continue
        cand.specs = list(compiled.specs)
        cand.same_as_base = [s for s in cand.specs] == list(base.specs)
        cand.pruned = _vllm_refusal(cand.specs)
        if cand.pruned is None and plan and base.on_gpus and compiled.specs[0].gpus:
            key = (knobs.per_gpu, knobs.tp or base.group_size)
            if key not in planned:
                planned[key] = _planner_says(base, knobs, node, cand.notes)
            cand.pruned = planned[key]
    return out


def _vllm_refusal(specs: Sequence[InstanceSpec]) -> str | None:
    """What vLLM would refuse at start, said before anything starts."""
    for spec in specs:
        seqs = _int_arg(spec, "max-num-seqs")
        batched = _int_arg(spec, "max-num-batched-tokens")
        if seqs is not None and batched is not None and batched < seqs:
            return (
                f"{spec.name}: max-num-batched-tokens {batched} is below max-num-seqs {seqs} "
                "(vLLM refuses to start)"
            )
        model_len = _int_arg(spec, "max-model-len")
        chunked = spec.arg("enable-chunked-prefill")
        if chunked is False and batched is not None and model_len and batched < model_len:
            return (
                f"{spec.name}: max-num-batched-tokens {batched} is below max-model-len "
                f"{model_len} with chunked prefill off (vLLM refuses to start)"
            )
    return None


def _planner_says(base: Base, knobs: Knobs, node: NodeFacts, notes: list[str]) -> str | None:
    """The planner's refusal of this shape on this node, or None (fits, or it cannot tell:
    then a note says why and the candidate runs)."""
    from vsup.layout.plan import PlanError, PlanRequest, make_plan

    first = base.specs[0]
    total = (first.gpu_memory_utilization or DEFAULT_UTILIZATION) * base.base_per_gpu
    req = PlanRequest(
        model=first.model,
        gpus=base.gpus,
        per_gpu=knobs.per_gpu,
        tp=knobs.tp or base.group_size,
        utilization=min(round(total, 2), 0.95),
        max_model_len=_int_arg(first, "max-model-len"),
        kv_cache_dtype=first.arg("kv-cache-dtype"),
        node=node,
        hub=False,  # never ask the hub mid-tune: the cache, or the model's local files
    )
    try:
        plan = make_plan(req, base_dir=base.path.parent)
    except (PlanError, OSError, ValueError) as exc:
        notes.append(f"the planner could not size it ({exc}); it runs and shows")
        return None
    if not plan.ok:
        return "the planner says it does not fit: " + "; ".join(plan.problems)
    return None
