"""Generate a tiny random-weight Llama model that the CPU build of vLLM can serve.

The model is what the demo and the integration tests run: no network, under 1 MB, float32
(bfloat16 dies with SIGILL on the CPUs here), head_dim 64 (16 is refused by the CPU attention
kernel). Weights come from a seeded generator, so the same directory is produced every time.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

HIDDEN = 128
HEADS = 2
KV_HEADS = 1
LAYERS = 2
INTERMEDIATE = 256
VOCAB = 512
MAX_POSITIONS = 2048

_CORPUS = """\
The supervisor starts every server, watches it and restarts it when it crashes.
Operators read the dashboard at night: the cache is full, the queue is long, a server preempts.
A layout names each instance, its port, its devices and the flags it runs with.
one two three four five six seven eight nine ten eleven twelve
the quick brown fox jumps over the lazy dog while the tiny model answers in random words.
"""

CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}"
)


def _config() -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HIDDEN // HEADS,
        "num_hidden_layers": LAYERS,
        "vocab_size": VOCAB,
        "max_position_embeddings": MAX_POSITIONS,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
    }


def _weights(seed: int) -> dict:
    import numpy as np

    rng = np.random.default_rng(seed)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    head_dim = HIDDEN // HEADS
    tensors = {
        "model.embed_tokens.weight": w(VOCAB, HIDDEN),
        "model.norm.weight": np.ones(HIDDEN, dtype=np.float32),
        "lm_head.weight": w(VOCAB, HIDDEN),
    }
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        tensors[p + "self_attn.q_proj.weight"] = w(HEADS * head_dim, HIDDEN)
        tensors[p + "self_attn.k_proj.weight"] = w(KV_HEADS * head_dim, HIDDEN)
        tensors[p + "self_attn.v_proj.weight"] = w(KV_HEADS * head_dim, HIDDEN)
        tensors[p + "self_attn.o_proj.weight"] = w(HIDDEN, HEADS * head_dim)
        tensors[p + "mlp.gate_proj.weight"] = w(INTERMEDIATE, HIDDEN)
        tensors[p + "mlp.up_proj.weight"] = w(INTERMEDIATE, HIDDEN)
        tensors[p + "mlp.down_proj.weight"] = w(HIDDEN, INTERMEDIATE)
        tensors[p + "input_layernorm.weight"] = np.ones(HIDDEN, dtype=np.float32)
        tensors[p + "post_attention_layernorm.weight"] = np.ones(HIDDEN, dtype=np.float32)
    return tensors


def _tokenizer_files(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=["<pad>", "<s>", "</s>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS.splitlines() * 4, trainer=trainer)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "pad_token": "<pad>",
                "model_max_length": MAX_POSITIONS,
                "chat_template": CHAT_TEMPLATE,
            },
            indent=2,
        )
    )


def generate(out: Path, seed: int = 0) -> Path:
    """Write the model into `out` (created; replaced atomically if it exists) and return it."""
    from safetensors.numpy import save_file

    out = Path(out)
    if (out / "model.safetensors").exists() and (out / "config.json").exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tinymodel-", dir=out.parent))
    (tmp / "config.json").write_text(json.dumps(_config(), indent=2))
    (tmp / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}, indent=2)
    )
    save_file(_weights(seed), str(tmp / "model.safetensors"), metadata={"format": "pt"})
    _tokenizer_files(tmp)
    try:
        os.rename(tmp, out)
    except OSError:
        # Another process generated it meanwhile; theirs is identical.
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="directory to write the model into")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(generate(args.out, args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
