"""What every rule reads: the layout, its merged instances, the tables as written, the node;
plus the helpers rules share (a diagnostic pointed at where a merged value was set, flag
values read as vLLM reads them)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vsup.layout.diagnostics import Diagnostic
from vsup.layout.merge import MergedInstance, Origin
from vsup.layout.model import Layout
from vsup.layout.modelinfo import ModelInfo, model_info
from vsup.layout.modelpath import is_local_model, resolve_model_path
from vsup.layout.parallel import ParallelShape, parallel_shape
from vsup.layout.profiles import ProfileCache
from vsup.layout.schema import VLLM_DEFAULT_GPU_MEMORY_UTILIZATION, is_int, is_number
from vsup.layout.span import DATA, MODEL, model_sizes, read_span, span_shape_args
from vsup.layout.structure import WrittenTable
from vsup.layout.timeshare import Tenant
from vsup.layout.vllm_flags import FlagList, flags_for_command


@dataclass
class Context:
    """One validation's inputs. Model facts and flag lists are looked up once per validation."""

    layout: Layout
    cache: ProfileCache
    merged: Sequence[MergedInstance]
    tables: Sequence[WrittenTable]  # the tables of instance keys as written, lowest first
    node_gpus: int | None  # None: unknown (no GPU found and no --node-gpus)
    probed: bool  # node_gpus came from this node's probe, not from the caller
    gpu_memory_bytes: int | None
    host_memory_bytes: int | None = None  # the node's RAM; None: unknown (host RAM not checked)
    _models: dict[str, ModelInfo] = field(default_factory=dict, init=False, repr=False)
    _flags: dict[tuple, FlagList] = field(default_factory=dict, init=False, repr=False)

    def model_info(self, m: MergedInstance) -> ModelInfo | None:
        """What is known offline of the instance's model; None when it has no usable model
        (empty, or a local path that does not exist: rules of their own say so)."""
        model = m.values.get("model")
        if not isinstance(model, str) or not model.strip():
            return None
        if is_local_model(model) and not Path(self.local_model_path(model)).exists():
            return None
        if model not in self._models:
            self._models[model] = model_info(model, self.layout.base_dir)
        return self._models[model]

    def local_model_path(self, model: str) -> str:
        return resolve_model_path(model, self.layout.base_dir)

    def tenants(self) -> list[Tenant]:
        """The instances on GPUs as the GPU and host RAM accounting sees them
        (vsup.layout.timeshare); one whose share is out of range is left to its own rule."""
        out = []
        for m in self.merged:
            util = m.values.get("gpu_memory_utilization")
            share = VLLM_DEFAULT_GPU_MEMORY_UTILIZATION if util is None else util
            if not m.gpus or not is_number(share) or not 0 < share <= 1:
                continue
            sleep = m.values.get("sleep")
            level = sleep.get("level", 1) if isinstance(sleep, dict) else None
            group = m.values.get("swap_group") if level is not None else None
            out.append(
                Tenant(
                    m.label,
                    tuple(g for g in m.gpus if is_int(g)),
                    float(share),
                    util is not None,
                    group if isinstance(group, str) else None,
                    level if is_int(level) else None,
                    self.weight_bytes(m) if level == 1 else None,
                )
            )
        return out

    def weight_bytes(self, m: MergedInstance) -> int | None:
        """The weights the whole instance holds on its GPUs (every DP rank on this node has its
        own copy); None when the model's size is not known here."""
        info = self.model_info(m)
        if info is None:
            return None
        dtype = m.arg("dtype")
        quantization = m.arg("quantization")
        weights, _ = info.weight_bytes(
            str(dtype) if dtype else None, str(quantization) if quantization else None
        )
        if weights is None:
            return None
        return weights * parallelism(m).shape.dp_local

    def flags(self, m: MergedInstance) -> FlagList:
        """The `vllm serve` flags of the vLLM the instance's command runs."""
        command = m.values.get("command")
        key = tuple(command) if isinstance(command, list) else ()
        if key not in self._flags:
            self._flags[key] = flags_for_command(list(key) or None)
        return self._flags[key]


def origin_diag(severity: str, message: str, m: MergedInstance, *key: str) -> Diagnostic:
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


def int_arg(value: Any) -> int | None:
    """An integer flag value as vLLM reads it: 8192, "8192", "8k" (1000s), "8K" (1024s)."""
    if is_int(value):
        return value
    if isinstance(value, str):
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


def int_flag(m: MergedInstance, name: str) -> int | None:
    """`int_arg` of a flag's merged value; None when unset or not an integer."""
    value = m.arg(name)
    return int_arg(value) if value is not None else None


def env_flag_on(value: Any) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class Parallelism:
    """Tensor, pipeline and data parallel sizes as the flags give them (None: set but unusable)."""

    tp: int | None  # --tensor-parallel-size, None when unset or not an integer
    pp: int | None  # --pipeline-parallel-size (1 when unset), None when not a positive integer
    effective_tp: int  # the TP vLLM will run: the flag, else the GPUs / (PP x DP_local)
    shape: ParallelShape  # the whole shape as the instance runs it (unusable values as 1)
    effective_pp: int = 1  # the pipeline stages vLLM will run (unusable: 1)


def parallelism(m: MergedInstance) -> Parallelism:
    """The sizes of `m`; an instance with a usable `span` counts its data-parallel size and, as
    the GPUs `gpus` lists, the node with the most ranks (vsup.layout.span). A span of `nodes`
    runs one TP x PP group over them (span.model_sizes: TP and PP may be derived from the
    nodes and `gpus`, a node's share); sizes that do not agree are rules/span.py's, and count
    as the flags give them meanwhile."""
    tp_raw = m.arg("tensor-parallel-size")
    pp_raw = m.arg("pipeline-parallel-size")
    tp = int_arg(tp_raw) if tp_raw is not None else None
    pp = int_arg(pp_raw) if pp_raw is not None else 1
    if pp_raw is not None and (pp is None or pp < 1):
        pp = None
    span = read_span(m.values.get("span"))
    # a span of nodes: TP x PP as written is the whole group's (rules/span.py checks it)
    args = (
        span_shape_args(m.args, span, span.most_local) if span and span.across == DATA else m.args
    )
    shape = parallel_shape(args, len(m.gpus or ()))
    effective = tp if tp is not None else shape.tp
    effective_pp = shape.pp
    if span is not None and span.across == MODEL:
        sizes = model_sizes(m.args, len(m.gpus or ()), len(span.ranks))
        if sizes is not None:
            effective, effective_pp = sizes
    return Parallelism(tp, pp, effective, shape, effective_pp)
