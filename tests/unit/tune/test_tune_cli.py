"""`vsup tune` refuses bad input before it changes anything, and `--dry-run` lists the
candidates and the rungs without starting a daemon (a hub model id: nothing is loaded)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import outside_cwd

BASE = """[layout]
name = "base"

[defaults]
model = "org/model"
host = "127.0.0.1"
args = { max-model-len = 512, max-num-seqs = 8, max-num-batched-tokens = 512 }

[[instance]]
name = "cpu0"
gpus = []
port = 8100

[tune]
args = { max-num-seqs = [8, 2, 1024] }
"""


def tune(home: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "vsup", "tune", *args],
        env=dict(os.environ, VSUP_HOME=str(home)),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=outside_cwd(),
        stdin=subprocess.DEVNULL,
    )


@pytest.fixture
def base(tmp_path: Path) -> Path:
    p = tmp_path / "base.toml"
    p.write_text(BASE)
    return p


def test_dry_run_lists_candidates_pruning_and_rungs(vsup_home, base):
    proc = tune(vsup_home, str(base), "--dry-run", "--num-prompts", "64", "--slo", "ttft_p99<=2s")
    assert proc.returncode == 0, proc.stderr
    err = proc.stderr
    assert "search space: 3 candidate(s); 2 to run, rungs [32, 64] prompts" in err
    assert "base-mns8: per_gpu 1, max-num-seqs 8 - runs (the base layout's instances" in err
    assert "base-mns1k: per_gpu 1, max-num-seqs 1024 - pruned: does not validate" in err
    assert not (vsup_home / "vsup.sock").exists()


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--slo", "ttft_p99<=2"], "needs a unit: 2s or 2ms"),
        (["--budget", "ten minutes"], "not a duration"),
        (["--plot", "x.jpg"], "name a .svg or .png file"),
        (["--eta", "1"], "--eta must be 2 or more"),
        (["--num-prompts", "0"], "num_prompts must be at least 1"),
        (["-o", "/nonexistent/dir/best.toml"], "its directory does not exist"),
    ],
)
def test_bad_input_exits_2_and_starts_nothing(vsup_home, base, extra, says):
    proc = tune(vsup_home, str(base), "--dry-run", *extra)
    assert proc.returncode == 2, proc.stderr
    assert says in proc.stderr
    assert not (vsup_home / "vsup.sock").exists()


def test_a_bad_tune_table_names_the_file_and_key(vsup_home, base, tmp_path):
    space = tmp_path / "space.toml"
    space.write_text("[tune]\nper_gpu = [1, 2]\n")
    proc = tune(vsup_home, str(base), "--dry-run", "--space", str(space))
    assert proc.returncode == 2
    assert f"{space}: [tune] key 'per_gpu'" in proc.stderr and "run on CPUs" in proc.stderr
    broken = tmp_path / "broken.toml"
    broken.write_text(BASE.replace("port = 8100", "port = 0"))
    proc = tune(vsup_home, str(broken), "--dry-run")
    assert proc.returncode == 2 and "the base layout does not validate" in proc.stderr
    assert "broken.toml" in proc.stderr


def test_a_png_plot_needs_matplotlib_where_it_is_missing(vsup_home, base, tmp_path):
    from vsup.tune.report import has_matplotlib

    proc = tune(vsup_home, str(base), "--dry-run", "--plot", str(tmp_path / "p.png"))
    if has_matplotlib():
        assert proc.returncode == 0, proc.stderr
    else:
        assert proc.returncode == 2 and "a PNG needs matplotlib" in proc.stderr
        assert "name a .svg file instead" in proc.stderr
