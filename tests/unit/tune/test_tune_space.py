"""The search space: defaults from the node and the model, the [tune] table over them, the
candidates' layouts, and pruning by validation, vLLM's start rules and the planner."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from vsup.layout.compiled import compile_layout
from vsup.layout.node import GIB, KNOWN_GPUS, NodeFacts, NodeGpu
from vsup.tune.space import (
    Base,
    SpaceError,
    build_space,
    default_space,
    make_candidates,
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


TINY = {**LLAMA_8B, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 2,
        "num_key_value_heads": 1, "num_hidden_layers": 2, "vocab_size": 512,
        "max_position_embeddings": 512}  # fmt: skip


def gpu_node(kind: str, count: int) -> NodeFacts:
    vendor, mem = KNOWN_GPUS[kind]
    return NodeFacts(
        tuple(NodeGpu(i, f"{vendor.upper()} {kind}", mem, vendor) for i in range(count))
    )


@pytest.fixture
def llama8b(tmp_path: Path) -> Path:
    d = tmp_path / "models" / "llama-8b"
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(LLAMA_8B))
    (d / "pytorch_model.bin").write_bytes(b"")
    return d


def base_of(tmp_path: Path, text: str, node: NodeFacts) -> Base:
    (tmp_path / "models" / "tiny").mkdir(parents=True, exist_ok=True)
    (tmp_path / "models" / "tiny" / "model.safetensors").write_bytes(b"")
    (tmp_path / "models" / "tiny" / "config.json").write_text(json.dumps(TINY))
    path = tmp_path / "base.toml"
    path.write_text(text)
    compiled, diags = compile_layout(text, path, node)
    assert compiled is not None, [d.format() for d in diags]
    return Base(path, text, tomllib.loads(text), list(compiled.specs), compiled.name)


CPU = """
[layout]
name = "cpu"

[defaults]
model = "./models/tiny"
host = "127.0.0.1"
args = { max-model-len = 512, max-num-seqs = 8, max-num-batched-tokens = 2048 }

[[instance]]
name = "cpu0"
gpus = []
port = 8100
"""


def gpu_layout(model: Path, max_len: int, gpus: int = 1) -> str:
    text = f"""
[layout]
name = "l8b"

[defaults]
model = "{model}"
args = {{ max-model-len = {max_len} }}
"""
    for g in range(gpus):
        text += f'\n[[instance]]\nname = "g{g}"\ngpus = [{g}]\nport = {8000 + g}\n'
    return text


def test_cpu_defaults_vary_batched_tokens_only(tmp_path):
    base = base_of(tmp_path, CPU, NodeFacts())
    space = default_space(base, NodeFacts())
    assert space.per_gpu == (1,) and space.tp == ()
    assert space.args == {"max-num-batched-tokens": (2048, 8192)}
    assert space.size == 2


def test_gpu_defaults_from_node_and_model(tmp_path, llama8b):
    node = gpu_node("H200", 2)
    base = base_of(tmp_path, gpu_layout(llama8b, 8192, gpus=2), node)
    space = default_space(base, node)
    assert space.per_gpu == (1, 2, 3)
    assert space.tp == (1, 2)  # 2 TP1 replicas against one TP2
    assert space.args == {"max-num-batched-tokens": (8192, 32768)}
    assert space.env == {}
    assert "planner" in space.why["per_gpu"]
    rocm = gpu_node("MI300X", 1)
    space = default_space(base_of(tmp_path, gpu_layout(llama8b, 8192), rocm), rocm)
    assert space.env == {"VLLM_ROCM_USE_AITER": ("0", "1")}


def test_the_tune_table_replaces_knobs_and_names_file_and_key(tmp_path):
    base = base_of(tmp_path, CPU, NodeFacts())
    space = build_space(base, NodeFacts(), [("a.toml", {"args": {"max-num-seqs": [1, 8, 16]}})])
    assert space.args == {"max-num-seqs": (1, 8, 16)}  # the default args knob is replaced
    assert space.why["max-num-seqs"] == "a.toml [tune]"
    bad = [
        ({"per_gpu": [2]}, r"a.toml: \[tune\] key 'per_gpu': the base layout .* cannot be regrouped: "
         "its instances run on CPUs"),
        ({"sizes": [1]}, r"a.toml: \[tune\] key 'sizes': unknown; use one of per_gpu, tp, args, env"),
        ({"args": {"max-num-seqs": 8}}, r"\[tune.args\] key 'max-num-seqs': must be a non-empty "
         "list"),
        ({"args": {"port": [1, 2]}}, "not a tune knob .vsup gives the ports"),
        ({"env": {"X": [1]}}, "environment values are strings"),
        ({"args": {"max-num-seqs": [8, 8]}}, "given twice"),
        ({"per_gpu": [0]}, "0 is not an integer of 1 or more"),
    ]  # fmt: skip
    for table, says in bad:
        with pytest.raises(SpaceError, match=says):
            build_space(base, NodeFacts(), [("a.toml", table)])


def test_candidates_apply_the_knobs_and_prune_what_vllm_refuses(tmp_path):
    base = base_of(tmp_path, CPU, NodeFacts())
    space = build_space(base, NodeFacts(), [("t", {"args": {"max-num-seqs": [8, 2, 4096]}})])
    cands = make_candidates(base, space, NodeFacts())
    assert [c.name for c in cands] == ["cpu-mns8", "cpu-mns2", "cpu-mns4k"]
    first, second, third = cands
    assert first.pruned is None and first.same_as_base  # the base's own value: no restart
    assert second.pruned is None and not second.same_as_base
    assert second.specs[0].arg("max-num-seqs") == 2
    doc = tomllib.loads(second.toml)
    assert doc["layout"]["name"] == "cpu-mns2" and "tune" not in doc
    # a relative model resolves against the base file, wherever the candidate is written
    assert doc["defaults"]["model"] == str(tmp_path / "models" / "tiny")
    # 4096 sequences do not fit in 2048 batched tokens: validation says so
    assert third.pruned and "max-num-seqs" in third.pruned and "does not validate" in third.pruned


def test_duplicates_are_pruned_once(tmp_path):
    base = base_of(tmp_path, CPU, NodeFacts())
    space = build_space(
        base, NodeFacts(), [("t", {"args": {"max-num-seqs": [8, 16]}, "env": {"A": ["1"]}})]
    )
    assert [c.pruned for c in make_candidates(base, space, NodeFacts())] == [None, None]
    space = build_space(base, NodeFacts(), [("t", {"args": {"max-num-seqs": [8, "8"]}})])
    cands = make_candidates(base, space, NodeFacts())
    assert cands[1].pruned is None or "the same layout as" in cands[1].pruned


def test_gpu_shapes_regroup_and_the_planner_prunes_what_does_not_fit(tmp_path, llama8b):
    # an H100 holds one or two 8B instances at 131072 tokens, not three (vsup plan's figures)
    node = gpu_node("H100", 2)
    base = base_of(tmp_path, gpu_layout(llama8b, 131072, gpus=2), node)
    space = build_space(
        base,
        node,
        [("t", {"per_gpu": [1, 2, 3], "tp": [1], "args": {"max-num-batched-tokens": [8192]}})],
    )
    cands = make_candidates(base, space, node)
    by = {c.knobs.per_gpu: c for c in cands}
    assert by[1].pruned is None and [s.name for s in by[1].specs] == ["g0", "g1"]
    assert by[2].pruned is None
    assert [(s.name, s.gpus, s.gpu_memory_utilization) for s in by[2].specs] == [
        ("gpu0a", (0,), 0.45), ("gpu0b", (0,), 0.45), ("gpu1a", (1,), 0.45), ("gpu1b", (1,), 0.45)
    ]  # fmt: skip
    assert len({s.port for s in by[2].specs}) == 4
    assert by[3].pruned and by[3].pruned.startswith("the planner says it does not fit")
    assert "max-model-len 131072" in by[3].pruned
    tp2 = make_candidates(base, build_space(base, node, [("t", {"tp": [2], "per_gpu": [1]})]), node)
    assert {tuple(s.gpus) for c in tp2 for s in c.specs} == {(0, 1)}
    with pytest.raises(SpaceError, match="3 does not divide the base layout's 2 GPUs"):
        build_space(base, node, [("t", {"tp": [3]})])


def test_an_invalid_knob_value_is_pruned_with_the_validation_error(tmp_path, llama8b):
    node = gpu_node("H200", 1)
    base = base_of(tmp_path, gpu_layout(llama8b, 8192), node)
    space = build_space(
        base,
        node,
        [("t", {"per_gpu": [1], "args": {"max-num-batched-tokens": [1024, 8192],
                                         "max-num-seqs": [2048]}})],
    )  # fmt: skip
    bad, good = make_candidates(base, space, node)
    assert bad.pruned and "does not validate" in bad.pruned and good.pruned is None
    assert GIB  # the node's memory is what the planner sized against
