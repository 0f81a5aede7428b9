"""The memory budget of one instance on one GPU: what is left for the KV cache.

    budget   = utilization x GPU memory
    weights  = model weights / TP; with pipeline parallel (PP stages), a stage's weights / TP
               (`stage_weight_bytes`: its share of the layers, plus the embedding on the first
               stage and the LM head on the last)
    overhead = activations, CUDA/HIP graphs and allocator slack (an estimate, OVERHEAD_BYTES,
               plus COMM_OVERHEAD_BYTES for TP > 1)
    KV       = budget - weights - overhead;  KV tokens = KV / KV bytes per token (per GPU;
               with PP, of the stage's own layers, and every stage gets the fewest blocks any
               stage affords: vsup.layout.kvcache)

`vsup plan` sizes layouts with it and validation's KV rules estimate capacity with it.
"""

from __future__ import annotations

from collections.abc import Sequence

from vsup.layout.node import GIB

OVERHEAD_BYTES = 2 * GIB
COMM_OVERHEAD_BYTES = GIB // 2


def overhead_bytes(tp: int) -> int:
    """Memory an instance uses per GPU beyond weights and KV cache (estimate)."""
    return OVERHEAD_BYTES + (COMM_OVERHEAD_BYTES if tp > 1 else 0)


def kv_budget_bytes(gpu_memory_bytes: int, utilization: float, weight_bytes: int, tp: int) -> int:
    """Bytes left for the KV cache on one GPU of an instance (see the module docstring);
    `weight_bytes`: the weights of the GPU's TP group, the whole model or, with PP, its stage's
    (`stage_weight_bytes`)."""
    return int(utilization * gpu_memory_bytes - weight_bytes / max(1, tp) - overhead_bytes(tp))


def stage_weight_bytes(
    weight_bytes: int, stages: Sequence[int], vocab_bytes: int = 0, vocab_matrices: int = 0
) -> list[int]:
    """The weights each pipeline stage's TP group holds, `stages` giving each stage's layers
    (vsup.layout.parallel.pp_stage_layers): the layers' share of the weights less the
    vocabulary matrices (`vocab_matrices` of `vocab_bytes` each: the input embedding, and the
    LM head when not tied), split by layer count, plus one vocabulary matrix on the first stage
    (the embedding) and one on the last (the LM head, which vLLM builds there even when tied).
    Every layer counts the same (an MoE model's few dense layers, a model's odd sized ones are
    not told apart); unknown vocabulary matrices (0) split all the weights by layers."""
    if len(stages) <= 1:
        return [weight_bytes]
    layers = sum(stages)
    body = max(0, weight_bytes - vocab_bytes * vocab_matrices)
    out = []
    for i, n in enumerate(stages):
        share = body * n / layers if layers else body / len(stages)
        ends = (i == 0) + (i == len(stages) - 1)
        out.append(int(share + (vocab_bytes * ends if vocab_matrices else 0)))
    return out
