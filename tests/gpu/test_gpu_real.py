"""vsup against real vLLM on a real NVIDIA GPU: benchmarks/gpu_real.py, every phase.

Needs an NVIDIA GPU with about 0.9 of its memory free, vLLM importable by this interpreter and a
local model directory in VSUP_GPU_MODEL (e.g. a random-weight 1B-shape Llama with its tokenizer).
Skipped when any of these is missing, so CI (no GPU) never runs it; select it with `-m gpu`.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_real.py"


def _why_not() -> str | None:
    if shutil.which("nvidia-smi") is None:
        return "no nvidia-smi on this machine"
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not importable here"
    model = os.environ.get("VSUP_GPU_MODEL")
    if not model or not Path(model, "config.json").exists():
        return "VSUP_GPU_MODEL does not name a local model directory"
    return None


@pytest.mark.skipif(_why_not() is not None, reason=str(_why_not()))
def test_every_gpu_phase_passes_against_real_vllm(tmp_path: Path) -> None:
    from tests.conftest import outside_cwd

    proc = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--model",
            os.environ["VSUP_GPU_MODEL"],
            "--out",
            str(tmp_path),
        ],
        cwd=outside_cwd(),
        capture_output=True,
        text=True,
        timeout=1800,
    )
    record = (tmp_path / "gpu_real.txt").read_text() if (tmp_path / "gpu_real.txt").exists() else ""
    assert proc.returncode == 0, record or proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "FAIL" not in record
