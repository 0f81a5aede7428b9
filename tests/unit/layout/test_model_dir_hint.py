"""`model = "models/tiny"` (no `./`) reads as a hub id; when `./models/tiny` is a directory beside
the layout, validation says "did you mean ./models/tiny?" instead of letting `up` fail 13 s later
with model_not_found (issue 35, item 10)."""

from __future__ import annotations

from pathlib import Path

from vsup.layout.model import load_layout, loads_layout
from vsup.layout.validate import validate

VLLM = '["python", "-m", "vllm.entrypoints.openai.api_server"]'


def text(model: str) -> str:
    return (
        f'[defaults]\nmodel = "{model}"\ncommand = {VLLM}\n'
        '\n[[instance]]\nname = "cpu0"\ngpus = []\nport = 8101\n'
    )


def errors(path: Path, model: str) -> list:
    path.write_text(text(model))
    return [d for d in validate(load_layout(path), node_gpus=0) if d.is_error]


def tiny_model(root: Path) -> Path:
    d = root / "models" / "tiny"
    d.mkdir(parents=True)
    (d / "config.json").write_text('{"model_type": "llama"}')
    (d / "model.safetensors").write_bytes(b"")
    return d


def test_a_hub_id_that_names_a_directory_beside_the_layout_asks_for_dot_slash(tmp_path):
    tiny_model(tmp_path)
    path = tmp_path / "layout.toml"
    (d,) = errors(path, "models/tiny")
    assert d.file == str(path) and d.instance == "cpu0" and d.key == "model"
    assert "did you mean ./models/tiny?" in d.message
    assert str(tmp_path / "models" / "tiny") in d.message
    assert d.format().startswith(f"{path}:")
    # written as a path, it validates
    assert errors(path, "./models/tiny") == []


def test_a_hub_id_without_such_a_directory_stays_a_hub_id(tmp_path):
    path = tmp_path / "layout.toml"
    assert errors(path, "models/tiny") == []
    # a directory elsewhere (not beside the layout) is no reason either
    tiny_model(tmp_path / "elsewhere")
    assert errors(path, "models/tiny") == []
    # nor the current directory of a layout that has no file
    diags = validate(loads_layout(text("models/tiny")), node_gpus=0)
    assert [d for d in diags if d.is_error] == []
