"""KV bytes per token that follow the model's layers, checked against vLLM's own figures.

The `MEASURED` figures are what the CPU build of vLLM 0.32 logged (`CPU KV cache size: N
tokens`) for tiny random-weight models of each kind, generated with transformers and run with
VLLM_CPU_KVCACHE_SPACE=1 (1 GiB), float32, max-model-len 2048, max-num-batched-tokens 2048,
block size 128 (the CPU default). To reproduce: `python -m benchmarks.kv_families`.
"""

from __future__ import annotations

import pytest

from vsup.layout.kvcache import FULL, LINEAR, MLA, SLIDING, in_flight_tokens, kv_layout, layer_kinds
from vsup.layout.modelinfo import ModelInfo

TINY = {
    "hidden_size": 128,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "torch_dtype": "float32",
}
GIB = 2**30

# (config, tokens vLLM logged); block size 128 (the CPU default) unless the family says
MEASURED = {
    "llama": ({**TINY, "model_type": "llama", "num_hidden_layers": 2}, 1_048_576),
    "gemma2": (
        {
            **TINY,
            "model_type": "gemma2",
            "num_hidden_layers": 4,
            "sliding_window": 256,
            "layer_types": ["sliding_attention", "full_attention"] * 2,
        },
        508_400,
    ),
    "gpt-oss": (
        {
            **TINY,
            "model_type": "gpt_oss",
            "num_hidden_layers": 4,
            "sliding_window": 128,
            "num_local_experts": 4,
            "layer_types": ["sliding_attention", "full_attention"] * 2,
        },
        508_400,
    ),
    # DeepSeek-V3-style MLA: the CPU MLA backend forces block size 16
    "deepseek-mla": (
        {
            **TINY,
            "model_type": "deepseek_v3",
            "num_hidden_layers": 2,
            "kv_lora_rank": 512,
            "qk_rope_head_dim": 64,
        },
        233_008,
    ),
    "mistral": (
        {**TINY, "model_type": "mistral", "num_hidden_layers": 4, "sliding_window": 256},
        493_447,
    ),
    "gemma3": (
        {
            **TINY,
            "model_type": "gemma3_text",
            "num_hidden_layers": 6,
            "sliding_window": 256,
            "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
        },
        332_222,
    ),
}


@pytest.mark.parametrize("family", sorted(MEASURED))
def test_tokens_match_what_vllm_logged(family):
    cfg, logged = MEASURED[family]
    kv = kv_layout(cfg, width=4)
    assert kv is not None
    block = 16 if "kv_lora_rank" in cfg else 128
    assert kv.tokens(GIB, max_len=2048, block_size=block, in_flight=2048) == logged


def test_the_window_pays_off_on_long_requests():
    # vLLM logged 883,011 for the tiny gpt-oss at max-model-len 4096, max-num-batched-tokens
    # 512: the sliding layers hold 639 tokens per request, not 4096. Every layer holding every
    # token would say 1 GiB / 2 KiB = 524,288.
    cfg = MEASURED["gpt-oss"][0]
    kv = kv_layout(cfg, width=4)
    assert kv.tokens(GIB, max_len=4096, block_size=128, in_flight=512) == 883_011
    assert GIB // kv.naive_bytes_per_token == 524_288


GPT_OSS_20B = {
    "model_type": "gpt_oss",
    "hidden_size": 2880,
    "head_dim": 64,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "num_hidden_layers": 24,
    "sliding_window": 128,
    "layer_types": ["sliding_attention", "full_attention"] * 12,
    "num_local_experts": 32,
    "torch_dtype": "bfloat16",
}


def test_gpt_oss_pays_for_half_its_layers_per_token():
    kv = kv_layout(GPT_OSS_20B, width=2)
    assert kv.naive_bytes_per_token == 48 * 1024  # every layer holding every token
    assert kv.bytes_per_token == 24 * 1024  # vLLM: 12 full + 12 sliding share 12-layer slots
    assert [(g.kind, g.size) for g in kv.groups] == [(SLIDING, 12), (FULL, 12)]
    # a long request holds its full-attention blocks plus the window's: ~1.9x the naive figure
    tokens = kv.tokens(10 * GIB, max_len=131072, block_size=16, in_flight=8192)
    assert 10 * GIB / (48 * 1024) * 1.85 < tokens < 10 * GIB / (24 * 1024)
    info = ModelInfo("openai/gpt-oss-20b", config=GPT_OSS_20B)
    assert info.kv_bytes_per_token() == 24 * 1024 and info.is_moe


def test_layer_patterns_from_configs_without_layer_types():
    gemma2 = {"model_type": "gemma2", "sliding_window": 4096}
    assert layer_kinds(gemma2, 4) == [(SLIDING, 4096), (FULL, None)] * 2
    gemma3 = {"model_type": "gemma3_text", "sliding_window": 1024, "sliding_window_pattern": 6}
    assert [k for k, _ in layer_kinds(gemma3, 12)] == ([SLIDING] * 5 + [FULL]) * 2
    qwen2 = {"model_type": "qwen2", "sliding_window": 32768, "use_sliding_window": False}
    assert layer_kinds(qwen2, 2) == [(FULL, None)] * 2
    llama4 = {"attention_chunk_size": 8192, "no_rope_layers": [1, 1, 1, 0]}
    assert [k for k, _ in layer_kinds(llama4, 4)] == [SLIDING, SLIDING, SLIDING, FULL]
    nemotron_h = {"hybrid_override_pattern": "M-M*"}  # "-": an MLP block, no cache
    assert [k for k, _ in layer_kinds(nemotron_h, 4)] == [LINEAR, LINEAR, FULL]


def test_gemma3_groups_of_one_layer():
    cfg = {**TINY, "model_type": "gemma3_text", "num_hidden_layers": 12, "sliding_window": 512}
    kv = kv_layout(cfg, width=2)
    # 10 sliding + 2 full: groups of 2 layers (the fewest type), 5 sliding groups + 1 full
    assert kv.kinds == {SLIDING: 10, FULL: 2}
    assert sorted((g.kind, g.size) for g in kv.groups) == [(FULL, 2)] + [(SLIDING, 2)] * 5
    assert kv.bytes_per_token == 2 * 64 * 2 * 2


def test_hybrid_linear_attention_keeps_state_not_tokens():
    qwen3_next = {
        "model_type": "qwen3_next",
        "hidden_size": 2048,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "num_hidden_layers": 48,
        "full_attention_interval": 4,
        "linear_num_value_heads": 32,
        "linear_num_key_heads": 16,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4,
    }
    kv = kv_layout(qwen3_next, width=2)
    assert kv.kinds == {LINEAR: 36, FULL: 12}
    assert kv.bytes_per_token == 12 * 2 * 256 * 2 * 2  # only the 12 attention layers
    ssm = 32 * 128 * 128
    conv = (2 * 16 * 128 + 32 * 128) * 3
    assert kv.state_bytes_per_sequence == 36 * (ssm + conv) * 2


def test_mla_and_per_layer_kv_heads():
    mla = {
        "model_type": "deepseek_v3",
        "hidden_size": 7168,
        "num_attention_heads": 128,
        "num_hidden_layers": 61,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
    }
    kv = kv_layout(mla, width=2, tp=8)
    assert kv.kinds == {MLA: 61} and kv.bytes_per_token == 61 * 576 * 2  # not split over TP
    per_layer = {**TINY, "num_hidden_layers": 3, "num_key_value_heads": [1, 2, 4]}
    assert kv_layout(per_layer, width=2).bytes_per_token == (1 + 2 + 4) * 64 * 2 * 2
    # TP splits KV heads; fewer heads than ranks: each rank keeps one
    assert kv_layout({**per_layer, "num_key_value_heads": 8}, width=2, tp=4).bytes_per_token == (
        3 * 2 * 64 * 2 * 2
    )
    assert kv_layout({**per_layer, "num_key_value_heads": 2}, width=2, tp=8).bytes_per_token == (
        3 * 1 * 64 * 2 * 2
    )


def test_disabling_the_hybrid_manager_makes_windows_full():
    kv = kv_layout(GPT_OSS_20B, width=2, hybrid_manager=False)
    assert kv.kinds == {FULL: 24} and kv.bytes_per_token == 48 * 1024


def test_gpu_schedules_two_batches_ahead():
    # vLLM 0.26 on the H200 (async scheduling): a Mistral-shaped model (16 layers, 8 KV heads x
    # 64, bf16, window 1024) at 0.45, max-model-len 32768, max-num-batched-tokens 8192 logged
    # "Available KV cache memory: 59.39 GiB" and "GPU KV cache size: 3,659,755 tokens"
    cfg = {
        "model_type": "mistral",
        "hidden_size": 2048,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "num_hidden_layers": 16,
        "sliding_window": 1024,
    }
    kv = kv_layout(cfg, width=2)
    in_flight = in_flight_tokens(8192, gpu=True)
    assert in_flight == 16384 and in_flight_tokens(2048, gpu=False) == 2048
    tokens = kv.tokens(59.39 * GIB, max_len=32768, block_size=16, in_flight=in_flight)
    assert tokens == pytest.approx(3_659_755, rel=1e-4)  # the log rounds the GiB
