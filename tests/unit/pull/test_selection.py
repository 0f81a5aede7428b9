"""Which files a pull fetches: the ones vLLM 0.32 loads (vsup.pull.selection's docstring)."""

from __future__ import annotations

import json
from collections.abc import Callable

from vsup.pull.selection import RepoFile, select_files

SUPPORT = ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"]


def repo(*names: str, index: dict | None = None) -> tuple[list[RepoFile], Callable[[str], object]]:
    files = [RepoFile(n, 10) for n in names]

    def read_json(name: str) -> object:
        return {"weight_map": index} if index is not None else None

    return files, read_json


def names(sel) -> set[str]:
    return {f.name for f in sel.files}


def test_safetensors_win_over_duplicate_bin_weights_and_original_checkpoints():
    files, rj = repo(
        *SUPPORT,
        "model.safetensors",
        "pytorch_model.bin",
        "original/consolidated.00.pth",
        "original/params.json",
        "README.md",
        ".gitattributes",
        "LICENSE",
        "figure.png",
    )
    sel = select_files(files, rj)
    assert sel.weights == "safetensors"
    assert names(sel) == {*SUPPORT, "model.safetensors"}
    assert "pytorch_model.bin" in sel.left_out and "original/params.json" in sel.left_out


def test_an_index_names_the_shards_and_a_consolidated_file_beside_them_is_mistral():
    shards = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    files, rj = repo(*SUPPORT, *shards, "model.safetensors.index.json", "extra.safetensors")
    sel = select_files(files, lambda n: {"weight_map": {"a": shards[0], "b": shards[1]}})
    assert names(sel) == {*SUPPORT, *shards, "model.safetensors.index.json"}
    # Mistral-7B-v0.3 ships both: vLLM's auto format picks the consolidated file
    files, _ = repo(*SUPPORT, *shards, "model.safetensors.index.json", "consolidated.safetensors")
    sel = select_files(files, lambda n: None)
    assert sel.weights == "mistral"
    assert names(sel) == {*SUPPORT, "consolidated.safetensors"}
    # --load-format safetensors: the sharded files, never the consolidated one
    sel = select_files(
        files, lambda n: {"weight_map": {"a": shards[0], "b": shards[1]}}, "safetensors"
    )
    assert names(sel) == {*SUPPORT, *shards, "model.safetensors.index.json"}


def test_bin_weights_without_training_state_when_there_are_no_safetensors():
    files, rj = repo(
        *SUPPORT,
        "pytorch_model-00001-of-00002.bin",
        "pytorch_model-00002-of-00002.bin",
        "pytorch_model.bin.index.json",
        "training_args.bin",
        "optimizer.pt",
    )
    sel = select_files(files, rj)
    assert sel.weights == "bin"
    assert names(sel) == {
        *SUPPORT,
        "pytorch_model-00001-of-00002.bin",
        "pytorch_model-00002-of-00002.bin",
        "pytorch_model.bin.index.json",
    }


def test_tokenizers_templates_remote_code_and_pooling_configs_come_along():
    files, rj = repo(
        "config.json",
        "model.safetensors",
        "tokenizer.model.v3",
        "tekken.json",
        "chat_template.jinja",
        "merges.txt",
        "vocab.json",
        "modeling_custom.py",
        "1_Pooling/config.json",
        "preprocessor_config.json",
        "subdir/model.safetensors",
    )
    sel = select_files(files, rj)
    assert "subdir/model.safetensors" in sel.left_out  # vLLM globs the top level only
    assert names(sel) == {f.name for f in files} - {"subdir/model.safetensors"}


def test_dummy_loads_no_weights_and_an_unknown_format_takes_everything_but_original():
    files, rj = repo(*SUPPORT, "model.safetensors", "model.gguf", "original/x.pth")
    assert names(select_files(files, rj, "dummy")) == set(SUPPORT)
    sel = select_files(files, rj, "gguf")
    assert sel.weights == "all" and "does not know which files" in (sel.note or "")
    assert names(sel) == {*SUPPORT, "model.safetensors", "model.gguf"}


def test_an_index_naming_missing_files_says_so():
    files, _ = repo(*SUPPORT, "a.safetensors", "model.safetensors.index.json")
    sel = select_files(
        files, lambda n: json.loads('{"weight_map": {"x": "a.safetensors", "y": "b.safetensors"}}')
    )
    assert "b.safetensors" in (sel.note or "")
    assert "a.safetensors" in names(sel)
