"""`vsup pull LAYOUT` where an instance's env sets HF_HUB_OFFLINE (the `cpu` profile does):
vsup leaves its model out, and says why - the setting, where it was set, the layout file, the
instance and the key - and what to do (issue 35, item 9)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_vsup

pytestmark = pytest.mark.timeout(240)


def cpu_layout(path: Path, second: str = "") -> Path:
    path.write_text(
        """[layout]
name = "offline"
profiles = ["cpu"]

[defaults]
model = "tiny/llama"

[[instance]]
name = "cpu0"
gpus = []
port = 8500
"""
        + second
    )
    return path


def test_a_layout_whose_instances_run_offline_says_why_nothing_is_pulled(tmp_path, vsup_home):
    path = cpu_layout(tmp_path / "cpu.toml")
    res = run_vsup(vsup_home, "pull", str(path), timeout=120)
    assert res.returncode == 2, (res.stdout, res.stderr)
    (line,) = [x for x in res.stderr.splitlines() if "HF_HUB_OFFLINE = " in x]
    assert line.startswith(f"{path}: error: instance 'cpu0': key 'env.HF_HUB_OFFLINE': ")
    assert "HF_HUB_OFFLINE = \"1\" (set in profile 'cpu': " in line
    assert "configs/cpu.toml)" in line
    # what to do: pull it by hand, or let vsup pull it
    assert "`vsup pull --model tiny/llama --cache-dir " in line
    assert 'write env = { HF_HUB_OFFLINE = "0" } in [defaults] or the instance' in line
    assert "names no hub model to pull" in res.stderr
    assert "HF_HUB_OFFLINE are left out" in res.stderr


def test_an_instance_back_online_is_pulled_and_the_offline_one_is_named(
    tmp_path, vsup_home, hub, hf_cache
):
    path = cpu_layout(
        tmp_path / "mixed.toml",
        '\n[[instance]]\nname = "cpu1"\ngpus = []\nport = 8501\nenv = { HF_HUB_OFFLINE = "0" }\n',
    )
    res = run_vsup(vsup_home, "pull", str(path), "--dry-run", timeout=120)
    assert res.returncode == 0, (res.stdout, res.stderr)
    (line,) = [x for x in res.stderr.splitlines() if "HF_HUB_OFFLINE = " in x]
    assert line.startswith(f"{path}: warning: instance 'cpu0': key 'env.HF_HUB_OFFLINE': ")
    assert "for cpu1" in res.stderr and "cpu1'" not in line
    assert hub.requests, "the dry run asked the hub for cpu1's model"
