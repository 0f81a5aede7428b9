"""`vsup plan` for another node (issue 35 item 12): from a directory holding only the model's
config.json, on a machine without GPUs, with and without `-o`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vsup.cli import main
from vsup.layout.model import load_layout
from vsup.layout.node import NodeFacts

LLAMA_8B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_hidden_layers": 32,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "torch_dtype": "bfloat16",
}


@pytest.fixture
def config_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """./m holds the model's config.json and no weights (copied from the node it is for); the
    working directory is its parent; this machine has no GPU."""
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(LLAMA_8B))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("VSUP_HOME", str(tmp_path / "home"))
    monkeypatch.setattr("vsup.telemetry.gpu.node_facts", lambda *a, **k: NodeFacts())
    return tmp_path


def test_a_config_only_directory_is_planned_and_the_layout_written(config_only, capsys):
    out = config_only / "plans" / "h200.toml"
    rc = main(["plan", "--model", "./m", "--gpus", "0-1", "--gpu", "H200", "-o", str(out)])
    stdout, stderr = capsys.readouterr()
    assert rc == 0, stderr
    assert "KV tokens" in stdout and f"wrote {out}" in stdout
    assert "no weights on this machine" in stderr and "warning" in stderr
    assert "error" not in stderr
    layout = load_layout(out)
    assert [i["name"] for i in layout.instances] == ["gpu0", "gpu1"]
    assert layout.defaults["model"] == "../m"  # still the same directory, seen from plans/


def test_a_config_only_directory_without_o_prints_the_layout(config_only, capsys):
    rc = main(["plan", "--model", "./m", "--gpus", "0", "--gpu", "H200"])
    stdout, stderr = capsys.readouterr()
    assert rc == 0, stderr
    assert stdout.startswith("[layout]") and 'model = "./m"' in stdout
    assert "KV tokens" in stderr


def test_without_o_an_error_names_no_file_that_does_not_exist(config_only, capsys):
    rc = main(["plan", "--model", "./m", "--gpus", "0", "--gpu", "H200", "--profile", "nosuch"])
    stdout, stderr = capsys.readouterr()
    assert rc == 2
    assert stdout == ""
    assert "unknown profile 'nosuch'" in stderr
    assert "plan.toml" not in stderr and "planned layout: error" in stderr
    assert not list(config_only.glob("*.toml"))


def test_with_o_a_refused_layout_says_nothing_was_written(config_only, capsys):
    out = config_only / "x.toml"
    rc = main(
        ["plan", "--model", "./m", "--gpus", "0", "--gpu", "H200", "--profile", "nosuch"]
        + ["-o", str(out)]
    )
    assert rc == 2
    assert f"nothing written to {out}" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("flag", [["--gpu", "H200"], ["--gpu-mem-gib", "80"]])
def test_gpus_all_for_another_node_on_a_machine_without_gpus(config_only, capsys, flag):
    out = config_only / "all.toml"
    rc = main(["plan", "--model", "./m", "--gpus", "all", *flag, "-o", str(out)])
    stdout, stderr = capsys.readouterr()
    assert rc == 0, stderr
    assert "planned for a node of 8 GPUs" in stdout
    assert [i["gpus"] for i in load_layout(out).instances] == [[g] for g in range(8)]


def test_gpus_all_without_a_gpu_named_still_asks_for_one(config_only, capsys):
    rc = main(["plan", "--model", "./m", "--gpus", "all"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "no GPU found on this node" in err and "--gpu H200" in err
