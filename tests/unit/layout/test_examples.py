"""The shipped examples and profiles: every layout validates, every profile is clean."""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

import pytest

from vsup.cli import main
from vsup.layout.model import load_layout
from vsup.layout.profiles import read_profile, search_dirs
from vsup.layout.sourcemap import SourceMap
from vsup.layout.validate import check_profile_document, validate
from vsup.paths import builtin_configs_dir

REPO = Path(__file__).resolve().parents[3]
GPU_EXAMPLES = sorted(p for p in (REPO / "layouts").glob("*.toml") if p.name != "cpu-demo.toml")
PROFILES = sorted((REPO / "configs").glob("*.toml"))


def test_there_are_examples_and_profiles():
    assert len(GPU_EXAMPLES) >= 3
    assert {p.stem for p in PROFILES} >= {
        "rocm-mi300x",
        "rocm-mi355x",
        "nvidia-h200",
        "cpu",
        "latency",
        "streaming",
        "throughput",
    }
    # the installed package carries the checkout's profiles, file for file
    shipped = builtin_configs_dir()
    assert "site-packages" in shipped.parts
    assert {p.name: p.read_bytes() for p in shipped.glob("*.toml")} == {
        p.name: p.read_bytes() for p in (REPO / "configs").glob("*.toml")
    }


@pytest.mark.parametrize("path", GPU_EXAMPLES, ids=[p.name for p in GPU_EXAMPLES])
def test_gpu_example_validates_on_an_8_gpu_node(path):
    layout = load_layout(path)
    diagnostics = validate(layout, node_gpus=8)
    assert not [d for d in diagnostics if d.is_error], [d.format() for d in diagnostics]
    # Only the "vllm is not installed here" warning is acceptable for a GPU layout on this machine.
    assert all("not found on this node" in d.message for d in diagnostics), [
        d.format() for d in diagnostics
    ]
    assert main(["validate", str(path), "--node-gpus", "8"]) == 0
    specs = layout.resolve()
    assert all(s.gpus for s in specs)


def test_shapes_of_the_gpu_examples():
    by_name = {p.name: load_layout(p) for p in GPU_EXAMPLES}
    replicas = by_name["llama8b-8xtp1-mi300x.toml"].resolve()
    assert [s.gpus for s in replicas] == [(g,) for g in range(8)]
    assert all(s.env["VLLM_ROCM_USE_AITER"] == "1" for s in replicas)
    shared = by_name["two-models-per-gpu-mi300x.toml"].resolve()
    assert len(shared) == 16 and {s.gpu_memory_utilization for s in shared} == {0.45}
    assert len({s.model for s in shared}) == 2
    big = by_name["llama405b-fp8-2xtp4-mi300x.toml"].resolve()
    assert [s.gpus for s in big] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert all("FP8" in s.model and s.tensor_parallel_size == 4 for s in big)
    (dp,) = by_name["qwen3-moe-dp8-ep-h200.toml"].resolve()
    assert dp.gpus == tuple(range(8)) and dp.data_parallel_size == 8
    assert dp.tensor_parallel_size == 1 and "--tensor-parallel-size" not in dp.argv()


def test_cpu_demo_validates_with_the_generated_model(tiny_model, tmp_path):
    copy = tmp_path / "repo"
    (copy / "layouts").mkdir(parents=True)
    shutil.copy(REPO / "layouts" / "cpu-demo.toml", copy / "layouts")
    (copy / ".demo" / "models").mkdir(parents=True)
    (copy / ".demo" / "models" / "tiny-llama").symlink_to(tiny_model)
    layout = load_layout(copy / "layouts" / "cpu-demo.toml")
    assert validate(layout, node_gpus=0) == []
    cpu0, cpu1 = layout.resolve()
    assert (cpu0.port, cpu1.port) == (8101, 8102) and cpu0.gpus == cpu1.gpus == ()
    assert cpu0.model == str(copy / ".demo" / "models" / "tiny-llama")
    assert cpu0.command == ("python", "-m", "vllm.entrypoints.openai.api_server")
    assert cpu1.argv()[-2:] == ["--num-gpu-blocks-override", "6"]
    assert cpu0.argv()[-2:] == ["--num-gpu-blocks-override", "24"]
    for spec in (cpu0, cpu1):
        argv = spec.argv()
        assert argv[argv.index("--max-model-len") + 1] == "512"
        assert argv[argv.index("--dtype") + 1] == "float32" and "--enforce-eager" in argv
        env = spec.child_env({})
        assert env["VLLM_CPU_KVCACHE_SPACE"] == "1" and env["HF_HUB_OFFLINE"] == "1"
        assert env["CUDA_VISIBLE_DEVICES"] == ""


def test_cpu_demo_without_the_model_says_how_to_get_it(tmp_path):
    copy = tmp_path / "layouts"
    copy.mkdir()
    shutil.copy(REPO / "layouts" / "cpu-demo.toml", copy)
    (e,) = [d for d in validate(load_layout(copy / "cpu-demo.toml"), node_gpus=0) if d.is_error]
    lines = (copy / "cpu-demo.toml").read_text().splitlines()
    assert e.key == "model" and "does not exist" in e.message
    assert e.line is not None
    assert (
        lines[e.line - 1].startswith("model = ") and e.instance == "cpu0" and e.others == ("cpu1",)
    )


@pytest.mark.parametrize("path", PROFILES, ids=[p.name for p in PROFILES])
def test_profile_is_clean(path):
    profile = read_profile(path.stem, path)
    assert not profile.load_errors
    assert profile.description, "every profile says what it is for"
    assert (
        check_profile_document(profile.document, str(path), SourceMap(profile.source), path.stem)
        == []
    )
    assert tomllib.loads(path.read_text())["defaults"]


def test_builtin_profiles_are_always_found(tmp_path):
    assert search_dirs(tmp_path / "x.toml", env={})[-1] == builtin_configs_dir()
