"""From a layout's instances to the pulls they need; the specs that start from a snapshot."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from vsup.layout import loads_layout
from vsup.pull import cache, targets
from vsup.pull.errors import PullError

COMMIT = "b" * 40


def specs(defaults: str = "", n: int = 8, model: str = "org/model") -> list:
    text = f'[layout]\nname = "t"\n[defaults]\nmodel = "{model}"\n{defaults}\n'
    for i in range(n):
        text += f'[[instance]]\nname = "r{i}"\ngpus = []\nport = {9000 + i}\n'
    return loads_layout(text).resolve()


def complete(root: Path, model: str = "org/model") -> Path:
    repo = cache.repo_dir(root, model)
    snap = repo / "snapshots" / COMMIT
    snap.mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (snap / name).write_text("x")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    return snap


def test_eight_replicas_of_one_model_are_one_pull(tmp_path):
    env = {"HF_HUB_CACHE": str(tmp_path)}
    res = targets.resolve(specs(), env, home=tmp_path)
    (pull,) = res.pulls
    assert pull.model == "org/model" and pull.cache_dir == tmp_path
    assert pull.instances == tuple(f"r{i}" for i in range(8))
    assert all(s.model_path is None for s in res.specs)
    # a different revision or cache is another pull
    mixed = specs('revision = "v2"', n=2) + specs(n=1)
    assert len(targets.resolve(mixed, env, home=tmp_path).pulls) == 2


def test_a_model_complete_in_the_cache_starts_from_its_snapshot_offline(tmp_path):
    snap = complete(tmp_path)
    res = targets.resolve(specs(n=2), {"HF_HUB_CACHE": str(tmp_path)}, home=tmp_path)
    assert res.pulls == ()
    for s in res.specs:
        assert s.model_path == str(snap)
        argv = s.argv()
        assert argv[argv.index("--model") + 1] == str(snap)
        assert argv[argv.index("--served-model-name") + 1] == "org/model"
        assert s.child_env({})["HF_HUB_OFFLINE"] == "1"


def test_what_is_not_pulled(tmp_path):
    env = {"HF_HUB_CACHE": str(tmp_path)}
    # HF_HUB_OFFLINE (the daemon's or the layout's), `pull = false`, a local path
    assert targets.resolve(specs(n=1), {**env, "HF_HUB_OFFLINE": "1"}).pulls == ()
    assert targets.resolve(specs('env = { HF_HUB_OFFLINE = "1" }', n=1), env).pulls == ()
    assert targets.resolve(specs("pull = false", n=1), env).pulls == ()
    assert targets.resolve(specs(n=1, model=str(tmp_path)), env).pulls == ()
    # --no-pull: none are pulled, a complete one still starts from the cache
    assert targets.resolve(specs(n=1), env, allow_pull=False).pulls == ()
    snap = complete(tmp_path)
    (s,) = targets.resolve(specs(n=1), env, allow_pull=False, home=tmp_path).specs
    assert s.model_path == str(snap)


def test_the_layouts_cache_and_download_dir_are_where_the_pull_goes(tmp_path):
    (s,) = specs(f'env = {{ HF_HOME = "{tmp_path}/h" }}', n=1)
    assert targets.target_of(s, {}).cache_dir == tmp_path / "h" / "hub"
    (s,) = specs(f'args = {{ download-dir = "{tmp_path}/d" }}', n=1)
    assert targets.target_of(s, {"HF_HUB_CACHE": "/elsewhere"}).cache_dir == tmp_path / "d"


def test_without_a_pull_the_revision_and_token_go_to_vllm():
    (s,) = specs('revision = "v2"\nhf_token_env = "MY_TOKEN"\npull = false', n=1)
    argv = s.argv()
    assert argv[argv.index("--revision") + 1] == "v2"
    env = s.child_env({"MY_TOKEN": "hf_secret"})
    assert env["HF_TOKEN"] == "hf_secret" and "HF_HUB_OFFLINE" not in env
    assert "hf_secret" not in " ".join(argv)
    # pulled: offline, and no token for vLLM
    pulled = targets.pulled_spec(s, "/snap")
    assert "HF_TOKEN" not in pulled.child_env({"MY_TOKEN": "hf_secret"})
    assert "--revision" not in pulled.argv()


def test_the_token_comes_from_the_variable_the_layout_names():
    (pull,) = targets.resolve(specs('hf_token_env = "MY_TOKEN"', n=1), {}).pulls
    assert targets.token_for(pull, {"MY_TOKEN": "hf_x"}) == "hf_x"
    with pytest.raises(PullError) as err:
        targets.token_for(pull, {})
    assert err.value.reason == "no_token" and "MY_TOKEN" in err.value.message
    (anon,) = targets.resolve(specs(n=1), {}).pulls
    assert targets.token_for(anon, {}) is None  # huggingface_hub's own HF_TOKEN / login
    assert os.environ.get("MY_TOKEN") is None
