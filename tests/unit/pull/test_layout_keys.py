"""The layout keys of a hub model (docs/layout.md): `revision`, `hf_token_env`, `pull`."""

from __future__ import annotations

from vsup.layout import loads_layout
from vsup.layout.validate import validate


def errors(defaults: str) -> list[str]:
    text = f"""[layout]
name = "t"
[defaults]
model = "org/model"
{defaults}
[[instance]]
name = "a"
gpus = []
port = 9000
"""
    return [
        d.format() for d in validate(loads_layout(text, "/x/t.toml"), node_gpus=0) if d.is_error
    ]


def test_the_keys_are_checked_with_what_to_change():
    assert errors('revision = "main"\nhf_token_env = "HF_TOKEN"\npull = false') == []
    (bad,) = errors('hf_token_env = "hf_abc123 secret"')
    assert "/x/t.toml" in bad and "hf_token_env" in bad and "never the token itself" in bad
    (bad,) = errors("pull = 1")
    assert "'pull'" in bad and "boolean" in bad
    (bad,) = errors('revision = "two words"')
    assert "branch, tag or commit" in bad


def test_the_keys_reach_the_spec_and_an_instance_overrides_them():
    text = """[layout]
name = "t"
[defaults]
model = "org/model"
revision = "v1"
hf_token_env = "T"
[[instance]]
name = "a"
gpus = []
port = 9000
[[instance]]
name = "b"
gpus = []
port = 9001
revision = "v2"
pull = false
"""
    a, b = loads_layout(text).resolve()
    assert (a.revision, a.hf_token_env, a.pull) == ("v1", "T", True)
    assert (b.revision, b.pull) == ("v2", False)
