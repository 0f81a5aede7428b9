"""Repositories the fake hub serves in tests and benchmarks."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from tests.fakehub.server import FakeRepo


def noise(n: int, seed: str) -> bytes:
    """`n` bytes that do not compress and are the same every run."""
    out = bytearray()
    counter = 0
    while len(out) < n:
        out += hashlib.sha256(f"{seed}:{counter}".encode()).digest() * 64
        counter += 1
    return bytes(out[:n])


def tiny_repo(model: str, model_dir: Path, extras: bool = True, **kw: object) -> FakeRepo:
    """The generated tiny Llama as a hub repository; with `extras`, what real repositories
    carry beside it and vLLM never loads: duplicate .bin weights, Meta's `original/`
    checkpoint, a README and an image."""
    repo = FakeRepo.from_dir(model, model_dir, **kw)
    if extras:
        repo.files["pytorch_model.bin"] = noise(256 * 1024, "bin")
        repo.files["original/consolidated.00.pth"] = noise(256 * 1024, "pth")
        repo.files["original/params.json"] = b'{"dim": 128}'
        repo.files["README.md"] = b"# a tiny model\n"
        repo.files["figure.png"] = noise(4096, "png")
    return repo


def sharded_repo(model: str, shard_sizes: list[int], **kw: object) -> FakeRepo:
    """A model in len(shard_sizes) safetensors shards with an index, a config and a tokenizer
    (the shards are noise: for pulls, not for vLLM)."""
    n = len(shard_sizes)
    names = [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
    files = {name: noise(size, name) for name, size in zip(names, shard_sizes, strict=True)}
    files["model.safetensors.index.json"] = json.dumps(
        {"metadata": {}, "weight_map": {f"layer{i}.weight": name for i, name in enumerate(names)}}
    ).encode()
    files["config.json"] = b'{"architectures": ["LlamaForCausalLM"], "model_type": "llama"}'
    files["tokenizer.json"] = b'{"version": "1.0"}'
    files["tokenizer_config.json"] = b"{}"
    return FakeRepo(model, files, **kw)  # type: ignore[arg-type]
