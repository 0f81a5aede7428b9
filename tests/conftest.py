"""Fixtures shared by every test directory."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"

# vsup itself is imported from the installed package, as users run it (`make test` installs it,
# non-editable, beside vLLM and supervisord). Only the test and benchmark helpers (`tests.*`,
# `benchmarks.*`) come from the checkout, so its root goes at the end of the path: it can never
# shadow an installed package.
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

_OUTSIDE: list[Path] = []


def outside_cwd() -> Path:
    """A working directory outside the checkout for every vsup or daemon a test starts."""
    if not _OUTSIDE:
        import tempfile

        _OUTSIDE.append(Path(tempfile.mkdtemp(prefix="vsup-cwd-")))
    return _OUTSIDE[0]


def run_vsup(
    home: Path, *args: str, timeout: float = 60, text: bool = True
) -> subprocess.CompletedProcess:
    """`vsup ARGS` as a user runs it: the installed package (`python -m vsup` of this
    interpreter) with VSUP_HOME=home, from outside the checkout, with no terminal (stdin is
    /dev/null, so `vsup down` does not ask). `text=False` gives bytes. A file that needs a
    longer default binds one: `vsup = partial(run_vsup, timeout=300)`."""
    return subprocess.run(
        [sys.executable, "-m", "vsup", *args],
        env=dict(os.environ, VSUP_HOME=str(home)),
        capture_output=True,
        text=text,
        timeout=timeout,
        cwd=outside_cwd(),
        stdin=subprocess.DEVNULL,
    )


def _interrupted(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config: pytest.Config) -> None:
    import signal

    import vsup

    # A run killed with SIGTERM (CI cancelling, `timeout`) ends like Ctrl-C: pytest then tears
    # fixtures down, so daemons and instances that tests started are stopped, not orphaned.
    signal.signal(signal.SIGTERM, _interrupted)

    where = Path(vsup.__file__).resolve()
    if "site-packages" not in where.parts:
        raise pytest.UsageError(
            f"vsup was imported from the checkout ({where}), not from the installed package: "
            "run the tests with `make test`, which installs it"
        )


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The generated tiny Llama (random weights, float32, head_dim 64) that vLLM CPU serves."""
    from vsup.demo.tinymodel import generate

    return generate(tmp_path_factory.mktemp("models") / "tiny-llama")


@pytest.fixture
def vsup_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An isolated VSUP_HOME. Kept short: unix socket paths are limited to 107 bytes."""
    import tempfile

    home = Path(tempfile.mkdtemp(prefix="vsup-", dir="/tmp"))
    monkeypatch.setenv("VSUP_HOME", str(home))
    yield home
    import shutil

    shutil.rmtree(home, ignore_errors=True)


def free_port() -> int:
    """A loopback TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture(scope="session")
def vllm_command() -> list[str]:
    """How the CPU build of vLLM is launched here (its `vllm` console script is broken)."""
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]


@pytest.fixture(scope="session")
def vllm_env() -> dict[str, str]:
    """Environment every test vLLM gets: offline, a small explicit KV cache."""
    return {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "TOKENIZERS_PARALLELISM": "false"}


os.environ.setdefault("HF_HUB_OFFLINE", "1")


# The slow lane: tests that start real vLLM servers (or build venvs, or drive tmux on real vLLM)
# cost 30-150 s of CPU per server start on a 2-core machine. Under pytest-xdist (`make test` runs
# `-n 2 --dist loadgroup`), they all go to one worker, in file order, first; every other test
# file is a unit of its own that the other worker takes (module fixtures stay in one process).
# So at most one real-vLLM module runs at a time, as without xdist, while the emulator, TUI and
# unit tests use the other core.
SLOW_LANE = ("vllm", "install", "tmux")


def slow_lane(item: pytest.Item) -> bool:
    return any(item.get_closest_marker(m) for m in SLOW_LANE)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.pluginmanager.hasplugin("xdist") or config.getoption("dist", "no") != "loadgroup":
        return
    slow = [item for item in items if slow_lane(item)]
    rest = [item for item in items if not slow_lane(item)]
    for item in slow:
        item.add_marker(pytest.mark.xdist_group("vllm"))
    for item in rest:
        item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
    items[:] = slow + rest
