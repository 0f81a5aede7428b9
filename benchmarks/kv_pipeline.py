"""vsup's pipeline parallel split against vLLM's own functions (no server started).

For each (layers, stages): the layers per stage from `vllm.distributed.utils.get_pp_indices`
against `vsup.layout.parallel.pp_stage_layers`; for each model shape (full attention, Gemma 3's
5:1, gpt-oss's alternation) and stage count, each stage's KV bytes per token slot as vLLM
0.32 forms them (the whole model's groups, `_get_kv_cache_groups_uniform_page_size`, each
projected onto a stage's layers, `_project_kv_cache_groups_to_worker`, the widest group's
pages: `_get_kv_cache_bytes_per_block` without its alignment rounding) against
`vsup.layout.kvcache.kv_layout(..., pp=N).stage_bytes`. Importing vLLM takes ~15 s.

    python -m benchmarks.kv_pipeline

Last line: `mismatches=N` (0: they agree).
"""

from __future__ import annotations

from typing import Any

from vsup.layout.kvcache import SLIDING, kv_layout, layer_kinds
from vsup.layout.parallel import pp_stage_layers

BLOCK = 16
BASE = {"hidden_size": 1024, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 128}
SHAPES: list[dict[str, Any]] = [
    {**BASE, "model_type": "llama", "num_hidden_layers": 61},
    {**BASE, "model_type": "gemma3_text", "num_hidden_layers": 48, "sliding_window": 512},
    {**BASE, "model_type": "gemma3_text", "num_hidden_layers": 34, "sliding_window": 512},
    {
        **BASE,
        "model_type": "gpt_oss",
        "num_hidden_layers": 24,
        "sliding_window": 128,
        "layer_types": ["sliding_attention", "full_attention"] * 12,
    },
    {
        **BASE,
        "model_type": "gpt_oss",
        "num_hidden_layers": 36,
        "sliding_window": 128,
        "layer_types": ["sliding_attention", "full_attention"] * 18,
    },
]


def vllm_stage_bytes(cfg: dict[str, Any], pp: int) -> tuple[int, ...]:
    import torch
    from vllm.v1.core import kv_cache_utils as u
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheSpec, SlidingWindowSpec

    layers = cfg["num_hidden_layers"]
    common = {
        "block_size": BLOCK,
        "num_kv_heads": cfg["num_key_value_heads"],
        "head_size": cfg["head_dim"],
        "dtype": torch.bfloat16,
    }
    specs: dict[str, KVCacheSpec] = {}
    for i, (kind, window) in enumerate(layer_kinds(cfg, layers) or []):
        specs[f"layers.{i}"] = (
            SlidingWindowSpec(**common, sliding_window=window)
            if kind == SLIDING and window is not None
            else FullAttentionSpec(**common)
        )
    groups = u._get_kv_cache_groups_uniform_page_size(specs)
    out, start = [], 0
    for n in pp_stage_layers(layers, pp):
        mine = {k: v for k, v in specs.items() if start <= int(k.split(".")[1]) < start + n}
        projected = u._project_kv_cache_groups_to_worker(groups, mine)
        out.append(
            max(sum(mine[name].page_size_bytes for name in g.layer_names) for g in projected)
            // BLOCK
        )
        start += n
    return tuple(out)


def main() -> int:
    from vllm.distributed.utils import get_pp_indices

    bad = 0
    for layers in range(1, 130):
        for pp in range(1, 9):
            theirs = tuple(e - s for s, e in (get_pp_indices(layers, r, pp) for r in range(pp)))
            if theirs != pp_stage_layers(layers, pp):
                bad += 1
                print(
                    f"split {layers} over {pp}: vLLM {theirs}, vsup {pp_stage_layers(layers, pp)}"
                )
    print("stage splits of 1-129 layers over 1-8 stages checked")
    for cfg in SHAPES:
        for pp in (2, 3, 4, 5):
            kv = kv_layout(cfg, width=2, pp=pp)
            theirs = vllm_stage_bytes(cfg, pp)
            ok = kv is not None and kv.stage_bytes == theirs
            bad += not ok
            print(
                f"{cfg['model_type']} {cfg['num_hidden_layers']} layers, PP{pp}: vLLM {theirs}, "
                f"vsup {kv.stage_bytes if kv else None} {'ok' if ok else 'MISMATCH'}"
            )
    print(f"mismatches={bad}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
