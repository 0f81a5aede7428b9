"""Mistakes a person makes in a layout (issue 25): a misspelt vLLM flag, a model path that is
neither a hub id nor a directory, a model directory without weights, the demo hint only for the
demo's own model, and CPU instances on too few cores."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vsup.layout.cpubind import BIND_ENV, core_plan
from vsup.layout.model import load_layout
from vsup.layout.spec import InstanceSpec
from vsup.layout.validate import validate

VLLM = '["python", "-m", "vllm.entrypoints.openai.api_server"]'


def check(tmp_path: Path, text: str, node_gpus: int = 0):
    path = tmp_path / "layouts" / "l.toml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return validate(load_layout(path), node_gpus=node_gpus)


def layout(model: str = "org/model", command: str = VLLM, extra: str = "", n: int = 1) -> str:
    text = f'[defaults]\nmodel = "{model}"\ncommand = {command}\n{extra}\n'
    for i in range(n):
        text += f'\n[[instance]]\nname = "c{i}"\ngpus = []\nport = {8101 + i}\n'
    return text


def model_dir(tmp_path: Path, *files: str) -> Path:
    d = tmp_path / "models" / "m"
    d.mkdir(parents=True)
    for name in files:
        body = json.dumps({"model_type": "llama"}).encode() if name.endswith(".json") else b""
        (d / name).write_bytes(body)
    return d


# -- flags ----------------------------------------------------------------------------------


def test_a_misspelt_flag_is_an_error_against_the_installed_vllm(tmp_path):
    (d,) = [x for x in check(tmp_path, layout(extra="args = { max-modle-len = 512 }")) if x.key]
    assert d.severity == "error" and d.key == "args.max-modle-len"
    assert "the installed vLLM" in d.message and "did you mean 'max-model-len'" in d.message
    assert 'unchecked_args = ["max-modle-len"]' in d.message


def test_unchecked_args_opts_one_flag_out(tmp_path):
    text = layout(
        extra='args = { my-plugin-flag = 1, max-modle-len = 512 }\nunchecked_args = ["my-plugin-flag"]'
    )
    diags = check(tmp_path, text)
    assert [d.key for d in diags if d.is_error] == ["args.max-modle-len"]


def test_unchecked_args_in_one_instance_opts_out_only_there(tmp_path):
    text = layout(extra="args = { my-plugin-flag = 1 }", n=2).replace(
        'name = "c1"', 'name = "c1"\nunchecked_args = ["my_plugin_flag"]'
    )
    (d,) = [x for x in check(tmp_path, text) if x.is_error]
    assert "for instance c0" in d.message and "c1" not in d.message


def test_a_wrapper_command_is_only_warned(tmp_path):
    wrapper = tmp_path / "launch.py"
    wrapper.write_text("")
    text = layout(
        command=json.dumps(["python", str(wrapper)]), extra="args = { max-modle-len = 512 }"
    )
    (d,) = [x for x in check(tmp_path, text) if x.key == "args.max-modle-len"]
    assert d.severity == "warning" and "did you mean 'max-model-len'" in d.message


def test_unchecked_args_must_be_a_list_of_strings(tmp_path):
    (d,) = [x for x in check(tmp_path, layout(extra="unchecked_args = 3")) if x.is_error]
    assert d.key == "unchecked_args" and "array of strings" in d.message


def test_a_vllm_drain_longer_than_the_stop_grace_is_warned(tmp_path):
    text = layout(extra="args = { shutdown-timeout = 30 }\nstop_grace_s = 20")
    (d,) = [x for x in check(tmp_path, text) if x.key == "args.shutdown-timeout"]
    assert d.severity == "warning" and "stop_grace_s = 20" in d.message
    assert not check(tmp_path, layout(extra="args = { shutdown-timeout = 15 }"))


# -- model paths ----------------------------------------------------------------------------


def test_a_model_that_is_neither_a_hub_id_nor_a_local_path_is_an_error(tmp_path):
    (d,) = [x for x in check(tmp_path, layout(model="tmp/x/model")) if x.is_error]
    assert d.key == "model" and "neither a hub id (org/name) nor a local path" in d.message


def test_such_a_model_that_names_a_directory_says_to_write_dot_slash(tmp_path):
    (tmp_path / "layouts" / "tmp" / "x" / "model").mkdir(parents=True)
    (d,) = [x for x in check(tmp_path, layout(model="tmp/x/model")) if x.is_error]
    assert 'write model = "./tmp/x/model"' in d.message


@pytest.mark.parametrize("model", ["org/name", "gpt2", "meta-llama/Llama-3.1-8B-Instruct"])
def test_hub_ids_are_fine_offline(tmp_path, model):
    assert not [x for x in check(tmp_path, layout(model=model)) if x.is_error]


def test_a_directory_with_only_a_config_has_no_weights(tmp_path):
    d = model_dir(tmp_path, "config.json")
    (e,) = [x for x in check(tmp_path, layout(model=str(d))) if x.is_error]
    assert e.key == "model" and "has no weights" in e.message and "*.safetensors" in e.message
    assert "make demo" not in e.message


def test_a_directory_with_weights_and_no_config_says_so(tmp_path):
    d = model_dir(tmp_path, "model.safetensors")
    (e,) = [x for x in check(tmp_path, layout(model=str(d))) if x.is_error]
    assert "has no config.json" in e.message and "no weights" not in e.message


@pytest.mark.parametrize("weights", ["model.safetensors", "pytorch_model.bin", "m.gguf"])
def test_a_directory_with_config_and_weights_is_fine(tmp_path, weights):
    d = model_dir(tmp_path, "config.json", weights)
    assert not [x for x in check(tmp_path, layout(model=str(d))) if x.is_error]


def test_the_make_demo_hint_is_only_for_the_demos_own_model(tmp_path):
    other = check(tmp_path, layout(model="../.demo/models/other-model"))
    (e,) = [x for x in other if x.is_error]
    assert "does not exist" in e.message and "make demo" not in e.message
    demo = check(tmp_path, layout(model="../.demo/models/tiny-llama"))
    (e,) = [x for x in demo if x.is_error]
    assert "`make demo` generates" in e.message


# -- CPU cores ------------------------------------------------------------------------------


def cpu_spec(name: str, **kw) -> InstanceSpec:
    return InstanceSpec(name, "org/m", ("vllm", "serve"), "127.0.0.1", 8000, (), None, **kw)


def test_cpu_instances_get_cores_of_their_own_in_layout_order():
    specs = [cpu_spec("c0"), cpu_spec("c1"), cpu_spec("c2")]
    plan = core_plan(specs, cpus=[0, 1, 2, 3, 4, 5])
    assert plan == {"c0": "0-1", "c1": "2-3", "c2": "4-5"}
    assert core_plan(specs, cpus=[0, 1, 2, 3, 4, 5]) == plan  # the same layout, the same cores
    # more instances than cores: they share, round robin (validation warns)
    assert core_plan(specs, cpus=[0, 1]) == {"c0": "0", "c1": "1", "c2": "0"}


def test_the_layouts_own_binding_wins_and_its_cores_are_left_to_it():
    specs = [cpu_spec("c0", env={BIND_ENV: "0-1"}), cpu_spec("c1")]
    assert core_plan(specs, cpus=[0, 1, 2, 3]) == {"c1": "2-3"}


def test_a_data_parallel_cpu_instance_gets_a_core_list_per_rank():
    specs = [cpu_spec("c0"), cpu_spec("c1", args={"data-parallel-size": 2})]
    assert core_plan(specs, cpus=[0, 1, 2, 3, 4, 5]) == {"c0": "0-1", "c1": "2-3|4-5"}


def test_gpu_instances_are_left_alone():
    gpu = InstanceSpec("g0", "org/m", ("vllm", "serve"), "127.0.0.1", 8000, (0,), 0.9)
    assert core_plan([gpu, cpu_spec("c0"), cpu_spec("c1")], cpus=[0, 1]) == {"c0": "0", "c1": "1"}


def test_one_cpu_instance_keeps_vllms_own_binding(tmp_path):
    path = tmp_path / "l.toml"
    path.write_text(layout(n=1))
    (spec,) = load_layout(path).resolve()
    assert BIND_ENV not in spec.env and core_plan([spec], cpus=[0, 1]) == {}


def test_resolved_specs_carry_the_binding_into_the_childs_env(tmp_path):
    import os

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("this process may run on one core only")
    path = tmp_path / "l.toml"
    path.write_text(layout(n=2))
    specs = load_layout(path).resolve()
    binds = [s.child_env({})[BIND_ENV] for s in specs]
    assert len(set(binds)) == 2, binds


def test_more_cpu_instances_than_cores_is_warned(tmp_path):
    import os

    n = len(os.sched_getaffinity(0)) + 1
    (d,) = [x for x in check(tmp_path, layout(n=n)) if "core" in x.message]
    assert d.severity == "warning" and f"need {n} core sets" in d.message and BIND_ENV in d.message
