"""The compiled layout: one read of the TOML gives every value its consumers need, or the
diagnostics that say why not; and what differs between two specs of an instance."""

from __future__ import annotations

import dataclasses
import tomllib

import pytest

from vsup.layout.alertconfig import AlertConfig
from vsup.layout.changes import SpecChange, spec_changes
from vsup.layout.compiled import (
    LayoutSettings,
    RolloutSettings,
    compile_document,
    compile_file,
    compile_layout,
    layout_settings,
)
from vsup.layout.model import loads_layout
from vsup.layout.node import NodeFacts, NodeGpu
from vsup.layout.routerspec import RouterSpec

TEXT = """\
[layout]
name = "two"
metrics_listen = "127.0.0.1:9400"
max_unavailable = 2
drain_timeout_s = 5

[defaults]
model = "org/model"
host = "127.0.0.1"

[[instance]]
name = "a"
gpus = []
port = 8101

[[instance]]
name = "b"
gpus = []
port = 8102
args = { max-model-len = 4096 }

[router]
port = 8080
policy = "round_robin"

[alerts]
webhook_env = "VSUP_ALERT_WEBHOOK"
kinds = ["crash_loop"]
"""


def test_one_compile_gives_every_value(tmp_path):
    path = tmp_path / "two.toml"
    compiled, diagnostics = compile_layout(TEXT, path, profile_dirs=[])
    assert compiled is not None, [d.format() for d in diagnostics]
    assert compiled.name == "two" and compiled.path == str(path) and compiled.text == TEXT
    assert compiled.names == ("a", "b")
    assert compiled.spec("b").args == {"max-model-len": 4096} and compiled.spec("c") is None
    assert isinstance(compiled.router, RouterSpec) and compiled.router.policy == "round_robin"
    assert compiled.router.workers == {"a": "http://127.0.0.1:8101", "b": "http://127.0.0.1:8102"}
    assert compiled.alerts == AlertConfig(
        webhook_env="VSUP_ALERT_WEBHOOK", kinds=frozenset({"crash_loop"})
    )
    assert compiled.metrics_listen == ("127.0.0.1", 9400)
    assert compiled.rollout == RolloutSettings(max_unavailable=2, drain_timeout_s=5.0)
    # the source map, for diagnostics
    assert (
        compiled.line("instance", 1, "args")
        == TEXT.splitlines().index("args = { max-model-len = 4096 }") + 1
    )
    assert compiled.layout.instance("a") == {"name": "a", "gpus": [], "port": 8101}
    assert compiled.warnings == tuple(diagnostics)
    with pytest.raises(dataclasses.FrozenInstanceError):
        compiled.specs = ()  # type: ignore[misc]


def test_defaults_when_the_layout_sets_nothing(tmp_path):
    text = '[defaults]\nmodel = "org/m"\n[[instance]]\nname = "a"\ngpus = []\nport = 8101\n'
    compiled, _ = compile_layout(text, tmp_path / "plain.toml", profile_dirs=[])
    assert compiled is not None
    assert compiled.name == "plain" and compiled.router is None and compiled.alerts is None
    assert compiled.settings == LayoutSettings()


def test_errors_give_no_compiled_layout_and_say_where(tmp_path):
    text = TEXT.replace("port = 8102", "port = 8101")
    compiled, diagnostics = compile_layout(text, tmp_path / "two.toml", profile_dirs=[])
    assert compiled is None
    (e, *_) = [d for d in diagnostics if d.is_error]
    assert "8101" in e.message and e.file == str(tmp_path / "two.toml") and e.line
    syntax, diags = compile_layout("[layout\n", tmp_path / "x.toml")
    assert syntax is None and diags[0].line == 1 and "TOML syntax" in diags[0].message


def test_the_text_is_parsed_once(tmp_path, monkeypatch):
    seen: list[str] = []
    real = tomllib.loads
    monkeypatch.setattr(tomllib, "loads", lambda s, **kw: seen.append(s) or real(s, **kw))  # type: ignore[func-returns-value]  # a spy
    compiled, _ = compile_layout(TEXT, tmp_path / "two.toml", profile_dirs=[])
    assert compiled is not None and seen == [TEXT]


def test_node_facts_decide_gpu_checks_and_estimates(tmp_path):
    text = TEXT.replace("gpus = []\nport = 8101", "gpus = [1]\nport = 8101")
    one = NodeFacts((NodeGpu(0, "NVIDIA H200", 150 * 2**30, "nvidia"),))
    compiled, diagnostics = compile_layout(text, tmp_path / "t.toml", one, profile_dirs=[])
    assert compiled is None
    assert any("this node has 1 GPU" in d.message for d in diagnostics if d.is_error)
    compiled, _ = compile_layout(text, tmp_path / "t.toml", NodeFacts.given(2), profile_dirs=[])
    assert compiled is not None and compiled.spec("a").gpus == (1,)


def test_a_file_and_an_edited_document_compile_alike(tmp_path):
    path = tmp_path / "two.toml"
    path.write_text(TEXT)
    from_file, _ = compile_file(path, profile_dirs=[])
    assert from_file is not None and from_file.text == TEXT
    edited = loads_layout(TEXT, path).with_instance({"name": "c", "gpus": [], "port": 8103})
    compiled, _ = compile_document(edited, profile_dirs=[])
    assert compiled is not None and compiled.names == ("a", "b", "c")
    # an edited document has no source text: its text is what saving would write
    assert loads_layout(compiled.text) == edited
    unreadable, diags = compile_file(tmp_path / "missing.toml")
    assert unreadable is None and "cannot read the layout" in diags[0].message


def test_settings_of_a_document_that_does_not_validate():
    layout = loads_layout(TEXT.replace("port = 8102", "port = 8101"))
    assert layout_settings(layout).alerts is not None
    with pytest.raises((TypeError, ValueError)):
        layout_settings(loads_layout('[layout]\nmax_unavailable = "x"\n'))


def spec(**kw):
    compiled, diagnostics = compile_layout(TEXT, "/tmp/two.toml", profile_dirs=[])
    assert compiled is not None, diagnostics
    b = compiled.spec("b")
    assert b is not None
    return dataclasses.replace(b, **kw)


def test_changes_name_each_key_with_old_and_new_values():
    old = spec()
    new = spec(
        model="org/other",
        gpus=(0, 1),
        args={"max-model-len": 8192, "enforce-eager": True},
        env={**old.env, "VLLM_LOGGING_LEVEL": "DEBUG"},  # the env vsup set (CPU cores) kept
        stop_grace_s=5.0,
    )
    assert [c.to_json() for c in spec_changes(old, new)] == [
        {"key": "model", "old": "org/model", "new": "org/other"},
        {"key": "gpus", "old": [], "new": [0, 1]},
        {"key": "args.max-model-len", "old": 4096, "new": 8192},
        {"key": "args.enforce-eager", "old": None, "new": True},
        {"key": "env.VLLM_LOGGING_LEVEL", "old": None, "new": "DEBUG"},
        {"key": "stop_grace_s", "old": 30.0, "new": 5.0},
    ]
    assert spec_changes(old, old) == []
    assert SpecChange("args.x", None, True).format() == "args.x: (unset) -> true"
    assert SpecChange("env.X", "a b", "\x1b[31m").format() == "env.X: 'a b' -> '\\x1b[31m'"


def test_changes_never_show_a_secret():
    token = "hf_" + "aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3z"
    old = spec(env={"HF_TOKEN": "one"}, args={"api-key": "abc"})
    new = spec(env={"HF_TOKEN": "two", "NOTE": token}, args={"api-key": "def"})
    shown = [c.to_json() for c in spec_changes(old, new)]
    assert shown == [
        {"key": "args.api-key", "old": "***", "new": "***"},
        {"key": "env.HF_TOKEN", "old": "***", "new": "***"},
        {"key": "env.NOTE", "old": None, "new": "***"},
    ]
