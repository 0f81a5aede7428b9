"""The parallel shape of one instance: tensor x pipeline x data parallel, and its GPUs.

One vsup instance is one `vllm serve` process group on one node. With data parallel
(`--data-parallel-size N`) that group runs N engine cores ("DP ranks") behind one API server and
one port, each rank with its own `TP x PP` GPUs and its own copy of the weights (its share of the
experts with `--enable-expert-parallel`). So the GPUs an instance lists are

    len(gpus) = TP x PP x DP_local

where DP_local is `--data-parallel-size-local` when set (ranks on this node of a group that spans
nodes), else the whole `--data-parallel-size`. When `args` does not give the TP size, vsup
derives it from the GPUs: `len(gpus) / (PP x DP_local)`.

Flag values are read as vLLM reads them (an int, or a string like "8"); `tp`, `pp`, `dp` are the
short keys a layout may use.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vsup.layout.flags import flag_name

TP_FLAG = "--tensor-parallel-size"
PP_FLAG = "--pipeline-parallel-size"
DP_FLAG = "--data-parallel-size"
DP_LOCAL_FLAG = "--data-parallel-size-local"

# vLLM's short options (`-tp 2`) as a layout may write them (`tp = 2`).
_ALIASES = {"--tp": TP_FLAG, "--pp": PP_FLAG, "--dp": DP_FLAG, "--dpl": DP_LOCAL_FLAG}


def canonical_flag(key: str) -> str:
    """The long flag an `args` key means: `tp`, `tensor_parallel_size` -> --tensor-parallel-size."""
    flag = flag_name(key)
    return _ALIASES.get(flag, flag)


def find_arg(args: Mapping[str, Any], flag: str) -> tuple[str, Any] | None:
    """(key as written, value) of the `args` entry that sets `flag` (written `--x-y`, `x-y` or
    `x_y`), or None."""
    flag = canonical_flag(flag)
    for key, value in args.items():
        # `false` removes a flag a profile set (vsup.layout.flags): it sets nothing
        if canonical_flag(key) == flag and value is not False and value is not None:
            return key, value
    return None


def positive_int(value: Any) -> int | None:
    """A size flag's value as vLLM's int() reads it; None when it is not a positive integer."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 1 else None
    if isinstance(value, str) and value.strip().isdigit():
        n = int(value)
        return n if n >= 1 else None
    return None


@dataclass(frozen=True)
class ParallelShape:
    """Sizes as the instance will run them. `*_set` say whether `args` gave the flag."""

    tp: int
    pp: int
    dp: int
    dp_local: int
    tp_set: bool
    dp_set: bool
    gpus: int  # len(gpus) as listed

    @property
    def gpus_needed(self) -> int:
        """GPUs this node's part of the instance runs on: TP x PP x DP_local."""
        return self.tp * self.pp * self.dp_local

    @property
    def spans_nodes(self) -> bool:
        """A DP group with ranks on other nodes (`--data-parallel-size-local` < size)."""
        return self.dp_local < self.dp

    def describe(self) -> str:
        parts = [f"TP{self.tp}"]
        if self.pp > 1:
            parts.append(f"PP{self.pp}")
        if self.dp > 1:
            parts.append(f"DP{self.dp}" + (f" ({self.dp_local} here)" if self.spans_nodes else ""))
        return " x ".join(parts)


def parallel_shape(args: Mapping[str, Any], gpus: int) -> ParallelShape:
    """The shape `args` and `gpus` GPUs give; unusable values count as 1 (validation says so)."""
    tp_arg = find_arg(args, TP_FLAG)
    pp_arg = find_arg(args, PP_FLAG)
    dp_arg = find_arg(args, DP_FLAG)
    dpl_arg = find_arg(args, DP_LOCAL_FLAG)
    pp = (positive_int(pp_arg[1]) if pp_arg else None) or 1
    dp = (positive_int(dp_arg[1]) if dp_arg else None) or 1
    dp_local = (positive_int(dpl_arg[1]) if dpl_arg else None) or dp
    tp_given = positive_int(tp_arg[1]) if tp_arg else None
    # Without the flag: one TP group per (PP stage x local DP rank); a GPU count that does not
    # divide is a validation error, and the floor keeps argv sane meanwhile.
    derived = max(1, gpus // (pp * dp_local)) if gpus else 1
    tp = tp_given if tp_given is not None else derived
    return ParallelShape(
        tp=tp,
        pp=pp,
        dp=dp,
        dp_local=dp_local,
        tp_set=tp_arg is not None,
        dp_set=dp_arg is not None,
        gpus=gpus,
    )


# vLLM's override of how layers split over pipeline stages: "20,21,20,19", one count per stage
PP_PARTITION_ENV = "VLLM_PP_LAYER_PARTITION"


def read_pp_partition(value: Any) -> tuple[int, ...] | None:
    """`VLLM_PP_LAYER_PARTITION` as vLLM reads it (comma-separated integers); None when unset
    or not integers. vLLM also refuses one that is not one count per stage summing to the
    layers: `pp_stage_layers` then ignores it."""
    if value is None or value is False:
        return None
    try:
        return tuple(int(p) for p in str(value).split(","))
    except ValueError:
        return None


def pp_stage_layers(
    layers: int, pp: int, partition: tuple[int, ...] | None = None
) -> tuple[int, ...]:
    """The layers each of `pp` pipeline stages holds, as vLLM splits them
    (vllm/distributed/utils.py `get_pp_indices`): `partition` (VLLM_PP_LAYER_PARTITION) when
    given, else `layers // pp` each, the remainder one more each on the stages before the last,
    counting back from the second-to-last (61 over 4: 15, 15, 16, 15; the last stage also holds
    the final norm and the LM head)."""
    pp = max(1, pp)
    if (
        partition is not None
        and len(partition) == pp
        and sum(partition) == layers
        and min(partition) >= 0
    ):
        return partition
    stages = [layers // pp] * pp
    for i in range(2, layers % pp + 2):
        stages[-i] += 1
    return tuple(stages)
