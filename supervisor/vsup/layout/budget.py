"""The memory budget of one instance on one GPU: what is left for the KV cache.

    budget   = utilization x GPU memory
    weights  = model weights / TP
    overhead = activations, CUDA/HIP graphs and allocator slack (an estimate, OVERHEAD_BYTES,
               plus COMM_OVERHEAD_BYTES for TP > 1)
    KV       = budget - weights - overhead;  KV tokens = KV / KV bytes per token (per GPU)

`vsup plan` sizes layouts with it and validation's KV rules estimate capacity with it.
"""

from __future__ import annotations

from vsup.layout.node import GIB

OVERHEAD_BYTES = 2 * GIB
COMM_OVERHEAD_BYTES = GIB // 2


def overhead_bytes(tp: int) -> int:
    """Memory an instance uses per GPU beyond weights and KV cache (estimate)."""
    return OVERHEAD_BYTES + (COMM_OVERHEAD_BYTES if tp > 1 else 0)


def kv_budget_bytes(gpu_memory_bytes: int, utilization: float, weight_bytes: int, tp: int) -> int:
    """Bytes left for the KV cache on one GPU of an instance (see the module docstring)."""
    return int(utilization * gpu_memory_bytes - weight_bytes / max(1, tp) - overhead_bytes(tp))
