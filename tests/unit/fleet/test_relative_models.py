"""`vsup fleet up` of a layout naming a model by a relative path: the nodes get the layout as
text, so there is no layout directory there to start from. It says so before asking any node:
fleet layouts need absolute paths or hub ids (issue 35, item 13)."""

from __future__ import annotations

from pathlib import Path

from vsup.layout.model import load_layout

from tests.conftest import run_vsup

FLEET = """\
[[node]]
name = "n1"
ssh = "ssh://nobody@127.0.0.1:9"
"""


def layout(path: Path, defaults_model: str, instance_model: str | None = None) -> Path:
    extra = f'model = "{instance_model}"\n' if instance_model else ""
    path.write_text(
        f'[layout]\nname = "rel"\n\n[defaults]\nmodel = "{defaults_model}"\n\n'
        f'[[instance]]\nname = "a"\ngpus = []\nport = 8100\n{extra}'
    )
    return path


def test_fleet_up_refuses_a_relative_model_path_before_asking_the_nodes(tmp_path):
    path = layout(tmp_path / "rel.toml", "org/model", "./models/tiny")
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(FLEET)
    res = run_vsup(tmp_path / "home", "fleet", "up", "--fleet", str(fleet), str(path), "--yes")
    assert res.returncode == 2, (res.stdout, res.stderr)
    (line,) = [x for x in res.stderr.splitlines() if "model './models/tiny'" in x]
    assert line.startswith(f"{path}:11: error: instance 'a': key 'model': ")
    assert "a fleet layout needs absolute paths (the same on every node) or hub ids" in line
    assert "names models by relative paths; nothing was changed" in res.stderr
    assert "n1" not in res.stderr  # no node was asked


def test_what_a_fleet_layout_may_name(tmp_path):
    from vsup.commands.fleet import relative_models

    def found(defaults_model: str, instance_model: str | None = None) -> list[str]:
        path = layout(tmp_path / "l.toml", defaults_model, instance_model)
        return [d.format() for d in relative_models(load_layout(path))]

    assert found("org/model") == []
    assert found("/srv/models/tiny") == []
    assert found("~/models/tiny") == []  # the node's own home: the same path on every node
    (d,) = found("../models/tiny")
    assert "[defaults]: key 'model': model '../models/tiny'" in d
    # without `./`, but naming a directory beside the layout here: a path too
    (tmp_path / "models" / "tiny").mkdir(parents=True)
    (d,) = found("org/model", "models/tiny")
    assert "instance 'a': key 'model': model 'models/tiny' is a path relative" in d
