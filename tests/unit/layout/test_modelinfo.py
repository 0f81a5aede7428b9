"""Model sizes from configs and safetensors headers, KV bytes per token, the HF cache."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

from vsup.layout.modelinfo import (
    estimate_params,
    hub_snapshot,
    model_info,
    params_from_name,
    read_safetensors_header,
    summarize_safetensors,
)

LLAMA_8B = {
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_hidden_layers": 32,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
LLAMA_405B = {
    **LLAMA_8B,
    "hidden_size": 16384,
    "intermediate_size": 53248,
    "num_attention_heads": 128,
    "num_hidden_layers": 126,
}
DEEPSEEK_V3 = {
    "model_type": "deepseek_v3",
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "num_hidden_layers": 61,
    "vocab_size": 129280,
    "kv_lora_rank": 512,
    "q_lora_rank": 1536,
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 128,
    "v_head_dim": 128,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "first_k_dense_replace": 3,
    "torch_dtype": "bfloat16",
}
MIXTRAL = {
    "model_type": "mixtral",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_hidden_layers": 32,
    "vocab_size": 32000,
    "num_local_experts": 8,
    "torch_dtype": "bfloat16",
}


def model_dir(tmp_path: Path, config: dict, name: str = "m") -> Path:
    d = tmp_path / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(config))
    return d


@pytest.mark.parametrize(
    ("config", "expected", "tolerance"),
    [
        (LLAMA_8B, 8_030_261_248, 0),  # Meta's published count
        (LLAMA_405B, 405.85e9, 0.01),
        (DEEPSEEK_V3, 671e9, 0.01),  # without the MTP module
        (MIXTRAL, 46.7e9, 0.01),
    ],
    ids=["llama-8b", "llama-405b", "deepseek-v3", "mixtral-8x7b"],
)
def test_parameter_count_from_config(config, expected, tolerance):
    got = estimate_params(config)
    assert abs(got - expected) <= tolerance * expected, got


def test_kv_bytes_per_token_gqa_tp_and_mla(tmp_path):
    llama = model_info(str(model_dir(tmp_path, LLAMA_8B, "l")), read_weights=False)
    assert llama.kv_bytes_per_token() == 32 * 8 * 128 * 2 * 2
    assert llama.kv_bytes_per_token(tp=2) == 32 * 4 * 128 * 2 * 2
    assert llama.kv_bytes_per_token(tp=16) == 32 * 1 * 128 * 2 * 2  # fewer heads than ranks
    assert llama.kv_bytes_per_token("fp8") == 32 * 8 * 128 * 2 * 1
    ds = model_info(str(model_dir(tmp_path, DEEPSEEK_V3, "d")), read_weights=False)
    assert ds.is_mla and ds.kv_bytes_per_token() == (512 + 64) * 61 * 2
    assert ds.kv_bytes_per_token(tp=8) == (512 + 64) * 61 * 2  # latent cache is not split


def test_weight_bytes_from_config_is_quantization_aware(tmp_path):
    bf16 = model_info(str(model_dir(tmp_path, LLAMA_8B, "a")), read_weights=False)
    assert bf16.weight_bytes()[0] == 8_030_261_248 * 2
    assert bf16.weight_bytes("float32")[0] == 8_030_261_248 * 4
    embed = 2 * 128256 * 4096
    fly = bf16.weight_bytes(quantization="fp8")[0]
    assert fly == (8_030_261_248 - embed) * 1 + embed * 2
    fp8 = model_info(
        str(model_dir(tmp_path, {**LLAMA_8B, "quantization_config": {"quant_method": "fp8"}}, "b"))
    )
    assert fp8.quantization == "fp8" and fp8.weight_bytes()[0] == fly
    awq = model_info(
        str(
            model_dir(
                tmp_path,
                {**LLAMA_8B, "quantization_config": {"quant_method": "awq", "bits": 4}},
                "c",
            )
        )
    )
    assert awq.weight_bytes()[0] == int((8_030_261_248 - embed) * 0.53 + embed * 2)
    ct = {
        "quant_method": "compressed-tensors",
        "config_groups": {"g": {"weights": {"num_bits": 4, "type": "int"}}},
    }
    w4 = model_info(str(model_dir(tmp_path, {**LLAMA_8B, "quantization_config": ct}, "e")))
    assert w4.quantization == "int4"


def test_safetensors_bytes_come_from_headers_only(tmp_path):
    d = tmp_path / "st"
    d.mkdir()
    a: dict[str, Any] = {"w1": np.zeros((64, 32), np.float16), "w2": np.zeros((10,), np.float32)}
    b: dict[str, Any] = {"w3": np.zeros((7, 3), np.int8)}
    save_file(a, str(d / "model-00001-of-00002.safetensors"))
    save_file(b, str(d / "model-00002-of-00002.safetensors"))
    (d / "model.safetensors.index.json").write_text(
        json.dumps(
            {
                "weight_map": {
                    "w1": "model-00001-of-00002.safetensors",
                    "w2": "model-00001-of-00002.safetensors",
                    "w3": "model-00002-of-00002.safetensors",
                }
            }
        )
    )
    # Cut the tensor data off: only the headers are needed.
    for f in d.glob("*.safetensors"):
        raw = f.read_bytes()
        (n,) = struct.unpack("<Q", raw[:8])
        f.write_bytes(raw[: 8 + n])
    summary = summarize_safetensors(d)
    assert summary.files == 2
    assert summary.bytes == 64 * 32 * 2 + 10 * 4 + 7 * 3
    assert summary.params == 64 * 32 + 10 + 21
    assert summary.dominant_dtype == "F16"
    info = model_info(str(d))
    assert info.weight_bytes()[0] == summary.bytes


def test_bad_safetensors_header_is_a_problem_not_a_crash(tmp_path):
    d = tmp_path / "bad"
    d.mkdir()
    (d / "model.safetensors").write_bytes(struct.pack("<Q", 2**40) + b"{}")
    with pytest.raises(ValueError):
        read_safetensors_header(d / "model.safetensors")
    info = model_info(str(d))
    assert info.safetensors is None and info.problems


def test_tiny_model_sizes(tiny_model):
    info = model_info(str(tiny_model))
    assert info.torch_dtype == "float32"
    assert info.kv_bytes_per_token() == 2 * 1 * 64 * 2 * 4
    st = info.safetensors
    assert st is not None and info.weight_bytes()[0] == st.bytes == st.params * 4


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("meta-llama/Llama-3.1-8B-Instruct", 8e9),
        ("meta-llama/Llama-3.1-405B-Instruct-FP8", 405e9),
        ("mistralai/Mixtral-8x7B-v0.1", 56e9),
        ("Qwen/Qwen3-30B-A3B", 30e9),
        ("openai/gpt-oss-120b", 120e9),
        ("Qwen/Qwen2.5-0.5B", 0.5e9),
        ("org/no-size-here", None),
    ],
)
def test_parameters_from_the_name(name, params):
    assert params_from_name(name) == params


def test_hub_id_found_in_the_hf_cache(tmp_path, monkeypatch):
    snap = tmp_path / "hub" / "models--org--name" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps(LLAMA_8B))
    (tmp_path / "hub" / "models--org--name" / "refs").mkdir()
    (tmp_path / "hub" / "models--org--name" / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert hub_snapshot("org/name") == snap
    info = model_info("org/name")
    assert info.local_dir == snap and info.params == 8_030_261_248
    assert model_info("org/other").config is None


@pytest.mark.parametrize(
    ("qc", "name"),
    [
        ({"quant_method": "fp8"}, "fp8"),
        ({"quant_method": "fbgemm_fp8"}, "fp8"),  # meta-llama/Llama-3.1-405B-Instruct-FP8
        ({"quant_method": "modelopt", "quant_algo": "FP8"}, "fp8"),
        ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, "nvfp4"),
        ({"quant_method": "mxfp4"}, "mxfp4"),
        ({"quant_method": "awq", "bits": 4}, "awq"),
        ({"quant_method": "gptq", "bits": 8}, "int8"),
        ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "int4"),
        (
            {
                "quant_method": "compressed-tensors",
                "config_groups": {"g": {"weights": {"num_bits": 8, "type": "float"}}},
            },
            "fp8",
        ),
        ({"quant_method": "something-new"}, "something-new"),
    ],
)
def test_quantization_configs_map_to_a_known_width(qc, name):
    from vsup.layout.modelinfo import canonical_quantization

    assert canonical_quantization(qc) == name


def test_fbgemm_fp8_405b_weighs_one_byte_per_parameter(tmp_path):
    cfg = {**LLAMA_405B, "quantization_config": {"quant_method": "fbgemm_fp8"}}
    info = model_info(str(model_dir(tmp_path, cfg)), read_weights=False)
    weights, source = info.weight_bytes()
    embed = 2 * 128256 * 16384  # embeddings and LM head stay 16-bit
    assert info.params is not None
    assert weights == info.params - embed + 2 * embed and "fp8" in source
    assert weights / 4 < 0.9 * 192 * 2**30  # a quarter fits one MI300X: the 2 x TP4 example
