"""Rules about tensor and pipeline parallelism and the GPUs they need."""

from __future__ import annotations

from vsup.layout.diagnostics import ERROR, WARNING, Diagnostic
from vsup.layout.merge import MergedInstance
from vsup.layout.parallel import PP_PARTITION_ENV, ParallelShape, read_pp_partition
from vsup.layout.rules.context import Context, int_arg, origin_diag, parallelism
from vsup.layout.span import MODEL, read_span

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


def pp_partition_mismatch(ctx: Context, m: MergedInstance) -> list[Diagnostic]:
    """`VLLM_PP_LAYER_PARTITION` in `env`: vLLM (get_pp_indices) refuses to start unless it is
    integers, one per pipeline stage, summing to the model's layers."""
    raw = m.env.get(PP_PARTITION_ENV)
    if raw is None or raw is False:
        return []
    p = parallelism(m)
    if p.pp is None:
        return []  # pipeline-parallel-size unusable: pp_not_positive says so
    parts = read_pp_partition(raw)
    pp = p.effective_pp
    info = ctx.model_info(m)
    layers = info.num_layers if info is not None else None
    if parts is None:
        problem = "is not comma-separated integers"
    elif len(parts) != pp:
        problem = f"gives {len(parts)} stage(s) but the instance runs {pp} pipeline stage(s)"
    elif layers is not None and sum(parts) != layers:
        problem = f"sums to {sum(parts)} layers but the model has {layers}"
    else:
        return []
    example = ",".join(["N"] * pp)
    return [
        origin_diag(
            ERROR,
            f"{PP_PARTITION_ENV} {str(raw)!r} {problem}: vLLM refuses to start; give one layer "
            f"count per pipeline stage ({example}) summing to the model's layers, or remove it "
            "(vLLM then splits them evenly)",
            m,
            "env",
            PP_PARTITION_ENV,
        )
    ]


def tp_gpus_mismatch(ctx: Context, m: MergedInstance) -> list[Diagnostic]:
    """TP x PP x DP_local must use exactly the GPUs listed: vLLM would look for more GPUs than
    the instance may see, or leave some idle."""
    p = parallelism(m)
    gpus = m.gpus
    shape = p.shape
    span = read_span(m.values.get("span"))
    if span is not None and span.across == MODEL:
        return []  # one group over the nodes: gpus is one node's share (span_model_shape)
    if not gpus or p.pp is None or (p.tp is None and m.arg("tensor-parallel-size") is not None):
        return []
    if p.tp is None:
        # TP derived from the GPUs: they must split evenly over the PP stages and DP ranks.
        per = shape.pp * shape.dp_local
        if per <= 1 or len(gpus) % per == 0:
            return []
        return [
            origin_diag(
                ERROR,
                f"gpus lists {len(gpus)} GPU(s), which do not split into {_ranks(shape)}: list "
                f"a multiple of {per} GPUs (each rank gets len(gpus) / {per} for its TP)",
                m,
                "gpus",
            )
        ]
    if p.tp * p.pp * shape.dp_local == len(gpus):
        return []
    what = f"tensor-parallel-size {p.tp}"
    if p.pp != 1:
        what += f" x pipeline-parallel-size {p.pp}"
    if shape.dp_local != 1:
        what += f" x {'data-parallel-size-local' if shape.spans_nodes else 'data-parallel-size'} "
        what += str(shape.dp_local)
    return [
        origin_diag(
            ERROR,
            f"{what} needs {p.tp * p.pp * shape.dp_local} GPU(s) but gpus lists {len(gpus)}: make "
            "them match (or drop tensor-parallel-size: vsup sets it from gpus)",
            m,
            "args",
            m.arg_key("tensor-parallel-size") or "",
        )
    ]


def _ranks(shape: ParallelShape) -> str:
    parts = []
    if shape.dp_local > 1:
        parts.append(f"{shape.dp_local} data-parallel ranks")
    if shape.pp > 1:
        parts.append(f"{shape.pp} pipeline stages")
    return " x ".join(parts)


def tp_for_small_model(ctx: Context, m: MergedInstance) -> list[Diagnostic]:
    """The tuning guides: N TP1 replicas beat one TP-N instance for a model that fits."""
    tp = parallelism(m).effective_tp
    info = ctx.model_info(m) if tp > 1 else None
    if info is None:  # already TP1, or the model is unknown
        return []
    params = info.params
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
