"""vsup's KV figure against the one the CPU build of vLLM logs, per attention family.

Generates tiny random-weight models with transformers (Llama: full attention; Mistral: every
layer windowed; Gemma 2: alternating; Gemma 3: 5 windowed to 1 full; gpt-oss: alternating with
experts; DeepSeek-V3: MLA), starts vLLM on each in turn just long enough to build its KV cache
(VLLM_CPU_KVCACHE_SPACE=1, float32, eager), reads `CPU KV cache size: N tokens` and compares it
with `vsup.layout.kvcache`. One vLLM at a time, ~30-60 s each on a 2-core machine.

    python -m benchmarks.kv_families [--keep DIR] [FAMILY ...]

Last line: `family=error_pct ...`.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

MAX_LEN, BATCHED, BLOCK = 2048, 2048, 128
TINY = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "vocab_size": 512,
    "max_position_embeddings": 4096,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}


def families() -> dict[str, tuple]:
    import transformers as t

    return {
        "mistral": (
            t.MistralConfig,
            t.MistralForCausalLM,
            {"num_hidden_layers": 4, "sliding_window": 256},
        ),
        "gemma2": (
            t.Gemma2Config,
            t.Gemma2ForCausalLM,
            {"num_hidden_layers": 4, "sliding_window": 256, "tie_word_embeddings": True},
        ),
        "gemma3": (
            t.Gemma3TextConfig,
            t.Gemma3ForCausalLM,
            {"num_hidden_layers": 6, "sliding_window": 256},
        ),
        "gptoss": (
            t.GptOssConfig,
            t.GptOssForCausalLM,
            {
                "num_hidden_layers": 4,
                "sliding_window": 128,
                "num_local_experts": 4,
                "num_experts_per_tok": 2,
            },
        ),
        "deepseek-mla": (
            t.DeepseekV3Config,
            t.DeepseekV3ForCausalLM,
            {
                "num_hidden_layers": 2,
                "kv_lora_rank": 512,
                "q_lora_rank": None,
                "qk_rope_head_dim": 64,
                "qk_nope_head_dim": 128,
                "v_head_dim": 128,
                "first_k_dense_replace": 2,
                "n_routed_experts": 4,
                "num_experts_per_tok": 2,
                "moe_intermediate_size": 64,
                "n_group": 1,
                "topk_group": 1,
            },
        ),
    }


def generate(root: Path, names: list[str]) -> dict[str, Path]:
    import torch

    from vsup.demo.tinymodel import generate as tiny_llama

    llama = tiny_llama(root / "llama")
    out = {"llama": llama}
    table = families()
    for name in names:
        if name == "llama":
            continue
        cfg_cls, model_cls, extra = table[name]
        kw = {**TINY, "torch_dtype": "float32", "tie_word_embeddings": False, **extra}
        torch.manual_seed(0)
        model = model_cls(cfg_cls(**kw)).to(torch.float32)
        d = root / name
        model.save_pretrained(d, safe_serialization=True)
        for f in ("tokenizer.json", "tokenizer_config.json"):
            if (llama / f).exists():
                shutil.copy(llama / f, d / f)
        out[name] = d
    return out


def logged_tokens(model: Path) -> int | None:
    code = (
        f"from vllm import LLM; LLM(model={str(model)!r}, dtype='float32', enforce_eager=True, "
        f"max_model_len={MAX_LEN}, max_num_batched_tokens={BATCHED}, max_num_seqs=16)"
    )
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    m = re.search(r"KV cache size: ([\d,]+) tokens", r.stdout + r.stderr)
    return int(m.group(1).replace(",", "")) if m else None


def predicted_tokens(model: Path) -> int | None:
    from vsup.layout.modelinfo import model_info

    info = model_info(str(model))
    kv = info.kv_layout()
    if kv is None:
        return None
    block = 16 if info.is_mla else BLOCK  # the CPU MLA backend forces 16
    return kv.tokens(2**30, MAX_LEN, block, BATCHED)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("families", nargs="*", default=["llama", *families()])
    p.add_argument("--keep", type=Path, help="generate the models here and keep them")
    args = p.parse_args(argv)
    root = args.keep or Path(tempfile.mkdtemp(prefix="vsup-kv-"))
    try:
        models = generate(root, args.families)
        results = []
        for name in args.families:
            logged, predicted = logged_tokens(models[name]), predicted_tokens(models[name])
            err = (
                None
                if not logged or predicted is None
                else round(100 * (predicted - logged) / logged, 3)
            )
            print(f"{name:14} vLLM {logged!s:>10}  vsup {predicted!s:>10}  error {err}%")
            results.append(f"{name}={err}")
        print(" ".join(results))
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
