"""`vsup bench` refuses bad input before it changes anything (no daemon is even started)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import outside_cwd


def bench(home: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "vsup", "bench", *args],
        env=dict(os.environ, VSUP_HOME=str(home)),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=outside_cwd(),
        stdin=subprocess.DEVNULL,
    )


def test_no_valid_layout_exits_2_naming_each_file_and_starts_nothing(vsup_home, tmp_path):
    clash = tmp_path / "clash.toml"
    clash.write_text(
        '[defaults]\nmodel = "org/m"\n'
        '[[instance]]\nname = "a"\ngpus = []\nport = 8000\n'
        '[[instance]]\nname = "b"\ngpus = []\nport = 8000\n'
    )
    missing = tmp_path / "missing.toml"
    proc = bench(vsup_home, str(clash), str(missing))
    assert proc.returncode == 2, proc.stderr
    assert "layout clash.toml does not validate" in proc.stderr and "8000" in proc.stderr
    assert f"cannot read {missing}" in proc.stderr
    assert "no layout is valid; nothing was changed" in proc.stderr
    assert not (vsup_home / "vsup.sock").exists()


def test_a_bad_workload_exits_2_before_anything(vsup_home, tmp_path):
    w = tmp_path / "w.toml"
    w.write_text("[bench]\nnum_prompts = 0\n")
    proc = bench(vsup_home, str(tmp_path / "a.toml"), "--workload", str(w))
    assert proc.returncode == 2
    assert f"{w}: [bench]: num_prompts must be at least 1" in proc.stderr
    proc = bench(vsup_home)
    assert proc.returncode == 2 and "name one or more layout files" in proc.stderr
    assert not (vsup_home / "vsup.sock").exists()
