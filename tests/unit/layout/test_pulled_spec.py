"""An instance started from a pulled snapshot (`model_path`, docs/pull.md): clients ask for the
layout's `served-model-name` when it has one (else the hub id), and the model's process holds
no hub token, neither the variable `hf_token_env` names nor HF_TOKEN (issue 35, items 1 and 3)."""

from __future__ import annotations

import pytest

from vsup.bench.client import client_flags
from vsup.engine.spawn import child_env
from vsup.layout.compiled import compile_layout
from vsup.layout.model import loads_layout
from vsup.layout.node import NodeFacts
from vsup.layout.parallel import find_arg
from vsup.pull.targets import pulled_spec

SNAPSHOT = "/cache/models--org--model/snapshots/" + "c" * 40


def one_spec(extra: str = "", model: str = "org/model"):
    text = (
        f'[layout]\nname = "t"\n[defaults]\nmodel = "{model}"\n{extra}\n'
        '[[instance]]\nname = "r0"\ngpus = []\nport = 9000\n'
    )
    (spec,) = loads_layout(text).resolve()
    return spec


def served_flags(argv: list[str]) -> list[list[str]]:
    """The values after each --served-model-name (up to the next flag)."""
    out = []
    for i, item in enumerate(argv):
        if item == "--served-model-name":
            values = []
            for v in argv[i + 1 :]:
                if v.startswith("--"):
                    break
                values.append(v)
            out.append(values)
    return out


@pytest.mark.parametrize(
    "args, names",
    [
        ('args = { served-model-name = "tiny" }', ["tiny"]),
        ('args = { served_model_name = "tiny" }', ["tiny"]),
        ('args = { served-model-name = ["tiny", "tiny-alias"] }', ["tiny", "tiny-alias"]),
        ("", ["org/model"]),
    ],
)
def test_a_pulled_model_is_served_under_the_layouts_name(args, names):
    spec = pulled_spec(one_spec(args), SNAPSHOT)
    argv = spec.argv()
    assert argv[argv.index("--model") + 1] == SNAPSHOT
    # one --served-model-name, the layout's when it has one: clients asking for it get 200
    assert served_flags(argv) == [names]
    assert spec.served_model_name == names[0]
    assert spec.client_model_name == names[0]


def test_the_name_clients_ask_for_without_a_pull():
    assert one_spec().client_model_name == "org/model"
    assert one_spec().served_model_name is None
    named = one_spec('args = { served-model-name = "tiny" }')
    assert named.client_model_name == "tiny"
    # a model vLLM downloads itself keeps its revision flag as the layout wrote it
    rev = one_spec('args = { revision = "v3" }\npull = false')
    assert served_flags(rev.argv()) == []
    assert rev.argv()[rev.argv().index("--revision") + 1] == "v3"


def test_find_arg_reads_a_flag_however_it_is_spelled():
    args = {"served_model_name": "tiny"}
    for flag in ("--served-model-name", "served-model-name", "served_model_name"):
        assert find_arg(args, flag) == ("served_model_name", "tiny"), flag


def test_the_bench_client_asks_a_pulled_instance_for_its_served_name(tmp_path):
    spec = pulled_spec(one_spec('args = { served-model-name = "tiny" }'), SNAPSHOT)
    flags = client_flags(spec, [], tmp_path, "r.json")
    assert flags[flags.index("--served-model-name") + 1] == "tiny"
    plain = pulled_spec(one_spec(), SNAPSHOT)
    flags = client_flags(plain, [], tmp_path, "r.json")
    assert flags[flags.index("--served-model-name") + 1] == "org/model"


ROUTED = """\
[layout]
name = "t"

[defaults]
model = "org/model"
command = ["python", "-m", "vllm.entrypoints.openai.api_server"]

[[instance]]
name = "a"
gpus = [0]
port = 8000
args = {{ served-model-name = "{a}" }}

[[instance]]
name = "b"
gpus = [1]
port = 8001
args = {{ served-model-name = "{b}" }}

[router]
port = 8080
{router}
"""


def router_errors(text: str) -> tuple[list, list[str]]:
    """(the errors, the instances the router routes to when the layout compiles)."""
    compiled, diags = compile_layout(text, "/tmp/l.toml", NodeFacts.given(2))
    workers = list(compiled.router.workers) if compiled and compiled.router else []
    return [d for d in diags if d.is_error], workers


def test_a_router_fronts_the_name_clients_ask_for():
    # one model written, two names served: the router is a gateway over both names, each
    # request going to the instances served under the name it asks for
    errors, workers = router_errors(ROUTED.format(a="tiny", b="other", router=""))
    assert errors == [] and workers == ["a", "b"]
    compiled, _ = compile_layout(
        ROUTED.format(a="tiny", b="other", router=""), "/tmp/l.toml", NodeFacts.given(2)
    )
    assert compiled.router.models == {"a": "tiny", "b": "other"} and compiled.router.igw
    # the router's model may name the served name: it picks the instances served under it
    errors, workers = router_errors(ROUTED.format(a="tiny", b="other", router='model = "tiny"'))
    assert errors == [] and workers == ["a"]
    # the same name served by both: one service, whatever `model` says
    errors, workers = router_errors(ROUTED.format(a="tiny", b="tiny", router='model = "tiny"'))
    assert errors == [] and workers == ["a", "b"]
    errors, workers = router_errors(ROUTED.format(a="tiny", b="tiny", router='model = "org/model"'))
    assert errors == [] and workers == ["a", "b"]


HUB_ENV = {
    "PATH": "/usr/bin",
    "MY_HUB_TOKEN": "hf_secret_for_the_pull",
    "HF_TOKEN": "hf_daemon_default",
    "HUGGING_FACE_HUB_TOKEN": "hf_legacy_name",
}


def test_a_pulled_instance_gets_no_hub_token():
    spec = one_spec('hf_token_env = "MY_HUB_TOKEN"')
    pulled = pulled_spec(spec, SNAPSHOT)
    for env in (pulled.child_env(HUB_ENV), child_env(pulled, HUB_ENV)):
        assert env["HF_HUB_OFFLINE"] == "1"
        for name in ("MY_HUB_TOKEN", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
            assert name not in env, name
        assert not [v for v in env.values() if v.startswith("hf_")], env
    # the token variable is also HF_TOKEN itself
    same = pulled_spec(one_spec('hf_token_env = "HF_TOKEN"'), SNAPSHOT)
    assert "HF_TOKEN" not in same.child_env(HUB_ENV)
    # without hf_token_env the pull used huggingface_hub's HF_TOKEN: not for vLLM either
    anonymous = pulled_spec(one_spec(), SNAPSHOT)
    assert not {"HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"} & set(anonymous.child_env(HUB_ENV))


def test_a_model_vllm_downloads_itself_gets_the_token_as_hf_token():
    spec = one_spec('hf_token_env = "MY_HUB_TOKEN"\npull = false')
    env = spec.child_env(HUB_ENV)
    assert env["HF_TOKEN"] == "hf_secret_for_the_pull" and "HF_HUB_OFFLINE" not in env
