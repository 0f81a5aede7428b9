"""Rules about the KV cache and the scheduler limits vLLM checks at start-up."""

from __future__ import annotations

from vsup.layout.budget import kv_budget_bytes, stage_weight_bytes
from vsup.layout.diagnostics import ERROR, WARNING, Diagnostic
from vsup.layout.kvcache import (
    CPU_BLOCK_SIZE,
    DEFAULT_BATCHED_TOKENS_CPU,
    DEFAULT_BATCHED_TOKENS_GPU,
    GPU_BLOCK_SIZE,
    KVLayout,
    in_flight_tokens,
)
from vsup.layout.merge import MergedInstance
from vsup.layout.modelinfo import ModelInfo
from vsup.layout.parallel import PP_PARTITION_ENV, read_pp_partition
from vsup.layout.rules.context import Context, int_arg, int_flag, origin_diag, parallelism
from vsup.layout.schema import VLLM_DEFAULT_GPU_MEMORY_UTILIZATION, is_number


def batched_below_seqs(ctx: Context, m: MergedInstance) -> list[Diagnostic]:
    seqs = int_flag(m, "max-num-seqs")
    batched = int_flag(m, "max-num-batched-tokens")
    if seqs is None or batched is None or batched >= seqs:
        return []
    return [
        origin_diag(
            ERROR,
            f"max-num-batched-tokens ({batched}) is below max-num-seqs ({seqs}); vLLM refuses to "
            "start: raise max-num-batched-tokens or lower max-num-seqs",
            m,
            "args",
            m.arg_key("max-num-batched-tokens") or "",
        )
    ]


def _is_float(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


def _kv_capacity(ctx: Context, m: MergedInstance) -> tuple[int, str, bool] | None:
    """(tokens the KV cache holds, how that was found, exact) where it can be computed: the
    block override, the CPU KV space, or an estimate from this node's GPU memory. Tokens are
    the figure vLLM logs (`KV cache size: N tokens`): for sliding-window models more than the
    bytes / bytes-per-token of full attention (vsup.layout.kvcache)."""
    info = ctx.model_info(m)
    gpus = m.gpus
    block_raw = m.arg("block-size")
    default_block = CPU_BLOCK_SIZE if gpus == [] else GPU_BLOCK_SIZE
    block_size = int_arg(block_raw) if block_raw is not None else default_block
    blocks = int_flag(m, "num-gpu-blocks-override")
    if blocks is not None and block_size:
        # vLLM keeps one block aside (the null block): usable = (blocks - 1) x block size.
        how = (
            f"num-gpu-blocks-override {blocks} x block size {block_size}, less vLLM's reserved "
            "block"
        )
        return max(0, (blocks - 1) * block_size), how, True
    if info is None or not block_size:
        return None
    kv_dtype = m.arg("kv-cache-dtype")
    dtype = m.arg("dtype")
    p = parallelism(m)
    pp = p.effective_pp
    partition = read_pp_partition(m.env.get(PP_PARTITION_ENV)) if pp > 1 else None
    # each GPU holds its pipeline stage's layers only: the KV of those (and, in _gpu_kv_space,
    # their weights), for every stage; vLLM gives each the fewest blocks any stage affords
    layout = info.kv_layout(
        str(kv_dtype) if kv_dtype else None,
        p.effective_tp,
        str(dtype) if dtype else None,
        hybrid_manager=not m.arg("disable-hybrid-kv-cache-manager", False),
        pp=pp,
        partition=partition,
    )
    max_len = _max_model_len(ctx, m)
    if layout is None or not layout.bytes_per_token or not max_len:
        return None
    batched = int_flag(m, "max-num-batched-tokens") or (
        DEFAULT_BATCHED_TOKENS_CPU if gpus == [] else DEFAULT_BATCHED_TOKENS_GPU
    )
    in_flight = in_flight_tokens(batched, gpu=gpus != [], pp=pp)
    space = (
        _cpu_kv_space(m, layout.bytes_per_token)
        if gpus == []
        else _gpu_kv_space(ctx, m, info, layout)
    )
    if space is None:
        return None
    kv_bytes, how = space
    return layout.tokens(kv_bytes, max_len, block_size, in_flight), how, False


def _cpu_kv_space(m: MergedInstance, per_token: int) -> tuple[float, str] | None:
    """A CPU instance's KV bytes: VLLM_CPU_KVCACHE_SPACE (GiB)."""
    space = m.env.get("VLLM_CPU_KVCACHE_SPACE")
    gib = (
        float(space) if is_number(space) or (isinstance(space, str) and _is_float(space)) else None
    )
    if not gib:
        return None
    return gib * 1024**3, f"VLLM_CPU_KVCACHE_SPACE {gib:g} GiB / {per_token} bytes per token"


def _gpu_kv_space(
    ctx: Context, m: MergedInstance, info: ModelInfo, layout: KVLayout
) -> tuple[list[int], str] | None:
    """A GPU instance's KV bytes on one GPU of each pipeline stage (one figure without PP),
    estimated from this node's GPU memory, the utilization and the weights of its stage.

    A stage's weights: its share of the layers, plus the embedding on the first stage and the
    LM head on the last (budget.stage_weight_bytes); of a span of `nodes`, every node's GPUs are
    as large as this node's."""
    memory = ctx.gpu_memory_bytes
    if not m.gpus or not memory:
        return None
    util = m.values.get("gpu_memory_utilization", VLLM_DEFAULT_GPU_MEMORY_UTILIZATION)
    dtype = m.arg("dtype")
    weights, _ = info.weight_bytes(
        str(dtype) if dtype else None, str(m.arg("quantization") or "") or None
    )
    if weights is None:
        return None
    how = f"estimate: {float(util):g} of {memory / 1024**3:.0f} GiB, less weights and overhead"
    tp = parallelism(m).effective_tp
    if layout.stages:
        stages = layout.stages
        how += (
            f"; {len(stages)} pipeline stages of {'/'.join(map(str, stages))} layers, each GPU "
            "holding its stage's weights and KV cache, every stage the blocks of the one that "
            "affords the fewest"
        )
        weights_of = stage_weight_bytes(weights, stages, *info.vocab_bytes(weights))
        return [kv_budget_bytes(memory, float(util), w, tp) for w in weights_of], how
    return [kv_budget_bytes(memory, float(util), weights, tp)], how


def _max_model_len(ctx: Context, m: MergedInstance) -> int | None:
    max_len = int_flag(m, "max-model-len")
    if max_len is not None and max_len < 0:
        max_len = None  # -1 / "auto": vLLM fits it to the memory
    if max_len is None:
        info = ctx.model_info(m)
        max_len = info.max_position_embeddings if info is not None else None
    return max_len


def kv_below_max_model_len(ctx: Context, m: MergedInstance) -> list[Diagnostic]:
    """A KV cache that cannot hold one full-length request: vLLM refuses to start."""
    max_len = _max_model_len(ctx, m)
    found = _kv_capacity(ctx, m) if max_len is not None else None
    if found is None or found[0] >= max_len:  # type: ignore[operator]
        return []
    capacity, how, exact = found
    verb = "vLLM refuses to start" if exact else "vLLM will likely refuse to start"
    return [
        origin_diag(
            ERROR if exact else WARNING,
            f"the KV cache holds {capacity} tokens ({how}) but max-model-len is {max_len}: "
            f"{verb}; lower max-model-len or give the instance more KV cache",
            m,
            "args",
            m.arg_key("max-model-len") or m.arg_key("num-gpu-blocks-override") or "",
        )
    ]


def kv_below_concurrency(ctx: Context, m: MergedInstance) -> list[Diagnostic]:
    """max-num-seqs full-length requests beyond the KV capacity: they will be preempted."""
    max_len = _max_model_len(ctx, m)
    seqs = int_flag(m, "max-num-seqs")
    if max_len is None or seqs is None:  # neither known: nothing to compare
        return []
    found = _kv_capacity(ctx, m)
    if found is None:
        return []
    capacity, how, _ = found
    if capacity < max_len or seqs * max_len <= capacity:
        return []
    return [
        origin_diag(
            WARNING,
            f"max-num-seqs {seqs} x max-model-len {max_len} = {seqs * max_len} tokens, beyond the "
            f"KV cache's {capacity} ({how}): full-length requests will be preempted; lower "
            f"max-num-seqs to {max(1, capacity // max_len)} or max-model-len, or give it more KV "
            "cache",
            m,
            "args",
            m.arg_key("max-num-seqs") or "",
        )
    ]
