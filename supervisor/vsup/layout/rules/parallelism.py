"""Rules about tensor and pipeline parallelism and the GPUs they need."""

from __future__ import annotations

from vsup.layout.diagnostics import ERROR, WARNING, Diagnostic
from vsup.layout.merge import MergedInstance
from vsup.layout.rules.context import Context, int_arg, origin_diag, parallelism

# A model this small runs fastest as TP1 replicas (AMD's MI300X guide: <= 30B in TP1).
TP1_PARAMS_LIMIT = 30e9


def tp_not_positive(ctx: Context, m: MergedInstance) -> list[Diagnostic]:
    raw = m.arg("tensor-parallel-size")
    tp = int_arg(raw) if raw is not None else None
    if raw is None or (tp is not None and tp >= 1):
        return []
    return [
        origin_diag(
            ERROR,
            f"tensor-parallel-size must be a positive integer, not {raw!r}",
            m,
            "args",
            m.arg_key("tensor-parallel-size") or "",
        )
    ]


def pp_not_positive(ctx: Context, m: MergedInstance) -> list[Diagnostic]:
    raw = m.arg("pipeline-parallel-size")
    if raw is None or parallelism(m).pp is not None:
        return []
    return [
        origin_diag(
            ERROR,
            f"pipeline-parallel-size must be a positive integer, not {raw!r}",
            m,
            "args",
            m.arg_key("pipeline-parallel-size") or "",
        )
    ]


def tp_gpus_mismatch(ctx: Context, m: MergedInstance) -> list[Diagnostic]:
    p = parallelism(m)
    gpus = m.gpus
    if not gpus or p.tp is None or p.pp is None or p.tp * p.pp == len(gpus):
        return []
    what = f"tensor-parallel-size {p.tp}" + (
        f" x pipeline-parallel-size {p.pp}" if p.pp != 1 else ""
    )
    return [
        origin_diag(
            ERROR,
            f"{what} needs {p.tp * p.pp} GPU(s) but gpus lists {len(gpus)}: make them match "
            "(or drop tensor-parallel-size: vsup sets it from gpus)",
            m,
            "args",
            m.arg_key("tensor-parallel-size") or "",
        )
    ]


def tp_for_small_model(ctx: Context, m: MergedInstance) -> list[Diagnostic]:
    """The tuning guides: N TP1 replicas beat one TP-N instance for a model that fits."""
    tp = parallelism(m).effective_tp
    info = ctx.model_info(m) if tp > 1 else None
    params = info.params if info is not None else None
    if params is None or params > TP1_PARAMS_LIMIT:
        return []
    return [
        origin_diag(
            WARNING,
            f"the model has about {params / 1e9:.1f}B parameters ({info.params_source}): up to "
            f"30B, {tp} TP1 replicas (one per GPU) usually serve more than one TP{tp} instance",
            m,
            "gpus",
        )
    ]
