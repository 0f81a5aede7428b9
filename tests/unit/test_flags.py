"""Layout `args` -> vLLM argv, and the InstanceSpec's command line and environment."""

from __future__ import annotations

import json
from functools import partial

import pytest

from vsup.layout.flags import args_to_flags, flag_name

from tests.factories import instance_spec


@pytest.mark.parametrize(
    ("args", "argv"),
    [
        ({"max-model-len": 8192}, ["--max-model-len", "8192"]),
        ({"max_model_len": 8192}, ["--max-model-len", "8192"]),
        ({"enforce-eager": True}, ["--enforce-eager"]),
        ({"enforce-eager": False}, []),
        ({"x": None}, []),
        ({"gpu-memory-utilization": 0.9}, ["--gpu-memory-utilization", "0.9"]),
        ({"scale": 2.0}, ["--scale", "2.0"]),
        ({"dtype": "float32"}, ["--dtype", "float32"]),
        ({"cudagraph-capture-sizes": [1, 2, 4]}, ["--cudagraph-capture-sizes", "1", "2", "4"]),
        ({"served-model-name": ["a", "b"]}, ["--served-model-name", "a", "b"]),
        ({"empty": []}, []),
        (
            {"compilation-config": {"cudagraph_mode": "FULL_AND_PIECEWISE"}},
            ["--compilation-config", '{"cudagraph_mode":"FULL_AND_PIECEWISE"}'],
        ),
        ({"x": [{"a": 1}, [1, 2], True]}, ["--x", '{"a":1}', "[1,2]", "true"]),
        ({"b": 1, "a": 2}, ["--b", "1", "--a", "2"]),
    ],
)
def test_args_to_flags(args, argv):
    assert args_to_flags(args) == argv


def test_nested_tables_become_json_vllm_can_read():
    cc = {"cudagraph_mode": "FULL", "pass_config": {"fuse_norm_quant": True}, "sizes": [1, 2]}
    (flag, value) = args_to_flags({"compilation-config": cc})
    assert flag == "--compilation-config" and json.loads(value) == cc


def test_flag_name():
    assert flag_name("max_model_len") == flag_name("--max-model-len") == "--max-model-len"


_spec = partial(instance_spec, host="0.0.0.0", gpus=(0, 1), gpu_memory_utilization=0.45)


def test_argv_sets_model_host_port_utilization_and_tp():
    assert _spec(args={"max-model-len": 4096}).argv() == [
        "vllm",
        "serve",
        "--model",
        "/m",
        "--host",
        "0.0.0.0",
        "--port",
        "8000",
        "--gpu-memory-utilization",
        "0.45",
        "--max-model-len",
        "4096",
        "--tensor-parallel-size",
        "2",
    ]
    assert "--tensor-parallel-size" not in _spec(gpus=(0,)).argv()
    cpu = _spec(gpus=(), gpu_memory_utilization=0.5).argv()
    assert "--gpu-memory-utilization" not in cpu


def test_child_env_pins_gpus_and_passes_the_key_by_name():
    spec = _spec(env={"A": "1", "HIP_VISIBLE_DEVICES": "3"}, api_key_env="MY_KEY")
    env = spec.child_env({"MY_KEY": "secret", "HIP_VISIBLE_DEVICES": "1", "PATH": "/bin"})
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1" and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert "HIP_VISIBLE_DEVICES" not in env and env["A"] == "1" and env["VLLM_API_KEY"] == "secret"
    assert "secret" not in spec.argv()
