"""Splitting one workload across a layout's serving instances, in proportion to their weight.

The weight of an instance is what it can hold at once: its KV-cache capacity in tokens when
vsup knows it for every instance, else its number of GPUs (1 for a CPU instance). Equal
replicas get equal shares; a TP2 instance beside a TP1 gets twice the prompts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from vsup.snapshot import InstanceStatus


def split_prompts(total: int, weights: Sequence[float]) -> list[int]:
    """`total` prompts in proportion to `weights` (largest remainder; ties go to the earlier
    instance), every instance at least one prompt when there are enough. Sums to `total`."""
    n = len(weights)
    if n == 0:
        return []
    if total < 0:
        raise ValueError(f"total must be >= 0, not {total}")
    w = [max(0.0, float(x)) for x in weights]
    if not any(w) or any(math.isnan(x) or math.isinf(x) for x in w):
        w = [1.0] * n
    s = sum(w)
    exact = [total * x / s for x in w]
    shares = [math.floor(e) for e in exact]
    order = sorted(range(n), key=lambda i: (-(exact[i] - shares[i]), i))
    for i in order[: total - sum(shares)]:
        shares[i] += 1
    # An instance with no prompt would have no client and no figures: give it one from the
    # largest share (only when there are at least as many prompts as instances).
    if total >= n:
        for i in range(n):
            if shares[i] == 0:
                j = max(range(n), key=lambda k: (shares[k], -k))
                shares[j] -= 1
                shares[i] += 1
    return shares


def split_rate(rate: float, shares: Sequence[int]) -> list[float]:
    """The layout's request rate split like its prompts (inf stays inf for every client)."""
    if math.isinf(rate):
        return [math.inf] * len(shares)
    total = sum(shares)
    return [rate * s / total if total else 0.0 for s in shares]


def weights_for(instances: Sequence[InstanceStatus]) -> tuple[list[float], str]:
    """(weights, basis) for the instances' status entries: KV capacity when every one has it,
    else GPU count."""
    kv = [i.telemetry.kv_capacity_tokens for i in instances]
    capacities = [float(k) for k in kv if isinstance(k, int | float) and k > 0]
    if instances and len(capacities) == len(instances):
        return capacities, "kv_capacity_tokens"
    return [float(max(1, len(i.gpus))) for i in instances], "gpus"
