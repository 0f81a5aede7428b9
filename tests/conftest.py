"""Fixtures shared by every test directory."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
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

from tests.ports import free_port  # noqa: E402  (the one place tests get ports; re-exported)

_OUTSIDE: list[Path] = []


def outside_cwd() -> Path:
    """A working directory outside the checkout for every vsup or daemon a test starts."""
    if not _OUTSIDE:
        import tempfile

        _OUTSIDE.append(Path(tempfile.mkdtemp(prefix="vsup-cwd-")))
    return _OUTSIDE[0]


def pytest_unconfigure(config: pytest.Config) -> None:
    """The working directory `outside_cwd` made goes with the session."""
    import shutil

    for cwd in _OUTSIDE:
        shutil.rmtree(cwd, ignore_errors=True)


def run_vsup(
    home: Path,
    *args: str,
    timeout: float = 60,
    text: bool = True,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess:
    """`vsup ARGS` as a user runs it: the installed package (`python -m vsup` of this
    interpreter) with VSUP_HOME=home, from outside the checkout, with no terminal (stdin is
    /dev/null, so `vsup down` does not ask). `text=False` gives bytes; `env` is added to the
    environment (a daemon that `up` starts, and the instances it spawns, inherit it). A file
    that needs a longer default binds one: `vsup = partial(run_vsup, timeout=300)`."""
    return subprocess.run(
        [sys.executable, "-m", "vsup", *args],
        env=dict(os.environ, **(env or {}), VSUP_HOME=str(home)),
        capture_output=True,
        text=text,
        timeout=timeout,
        cwd=outside_cwd(),
        stdin=subprocess.DEVNULL,
    )


def daemon_status(home: Path, timeout: float = 60) -> dict:
    """The status document `vsup status --json` prints, from the daemon's control API in this
    process: for polls (a `vsup status --json` subprocess costs ~0.3 CPU-s each); the CLI is
    run where its own output or exit status is the point."""
    from vsup.control.client import JsonClient

    with JsonClient(home, timeout=timeout) as client:
        return client.status()


def until(pred, timeout: float, what: str, step: float = 0.25):
    """`pred()`'s first true value, asked every `step` s; fails with `what` after `timeout` s."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what} (waited {timeout} s)"
        time.sleep(step)


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
def vsup_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An isolated VSUP_HOME. Kept short: unix socket paths are limited to 107 bytes."""
    import tempfile

    home = Path(tempfile.mkdtemp(prefix="vsup-", dir="/tmp"))
    monkeypatch.setenv("VSUP_HOME", str(home))
    yield home
    import shutil

    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture(scope="session")
def vllm_command() -> list[str]:
    """How the CPU build of vLLM is launched here (its `vllm` console script is broken)."""
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]


# On PYTHONPATH of the one-process test servers: their EngineCore is forked, not spawned.
FORK_CORE = Path(__file__).parent / "support" / "forkcore"


def fork_core_env() -> dict[str, str]:
    """What a one-process test server's environment adds so that its EngineCore is forked, as
    on a GPU, not spawned (tests/support/forkcore says why); nothing with VSUP_TEST_SPAWN_CORE=1.
    SPT_NOENV: a forked EngineCore's title (setproctitle) overwrites its /proc/PID/environ, as
    on a GPU; the tests find a home's processes by their VSUP_HOME there."""
    if os.environ.get("VSUP_TEST_SPAWN_CORE") == "1":
        return {}
    return {"PYTHONPATH": str(FORK_CORE), "SPT_NOENV": "1"}


@pytest.fixture(scope="session")
def vllm_tmp() -> Iterator[Path]:
    """The test servers' TMPDIR, removed with the session: vLLM leaves a `vllm_dist_<uuid>`
    file (its distributed init method, vllm/utils/network_utils.py) in the temp directory at
    every start; in /tmp, ~100 of them after a suite."""
    import shutil
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix="vsup-vt-", dir="/tmp"))
    yield tmp
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def vllm_env(request: pytest.FixtureRequest, vllm_tmp: Path) -> dict[str, str]:
    """Environment every test vLLM gets: offline, a small explicit KV cache, OpenMP threads
    that do not spin while they wait.

    A module that sets `VLLM_ONE_PROCESS = True` gets VLLM_ENABLE_V1_MULTIPROCESSING=0: the
    CPU build then runs its model worker inside the EngineCore instead of a third process
    (vllm/platforms/cpu.py forces the multiproc executor otherwise), which is the process tree
    a GPU server at TP1 has (API server + EngineCore) and one torch+vLLM import less per start:
    measured 40 s against 71 s to ready beside the suite. The modules that test vsup over
    vLLM's HTTP API use it (bench, tune, router, sleep, fleet, the dashboard, pull), data
    parallel (its ranks are the EngineCore_DP processes either way), stalls (the frozen
    EngineCore is the engine itself, as on a GPU at TP1) and re-adoption (the API server's
    group is still two levels with an orphanable child); those about the three-process tree
    (the engine's orphan sweep and engine death, CPU core binding, which needs the mp executor)
    run the CPU build as it comes.

    The one-process servers also get tests/support/forkcore on PYTHONPATH: their EngineCore is
    forked from the API server, as vLLM does on a GPU, instead of spawned (the CPU platform
    forces spawn), which saves the EngineCore's own import of torch and vLLM, ~9 of a start's
    ~22 CPU-s. A module that sets `VLLM_FORK_CORE = True` keeps the three processes and forks
    both children (engine/test_vllm.py: the orphan sweep and engine death are about the tree's
    shape, not how its children were started; test_cpu_node_vllm.py, whose daemons get this
    environment for the shipped demo layout's servers). `VSUP_TEST_SPAWN_CORE=1` runs them all
    as the CPU build comes."""
    env = {
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        # OpenMP threads that wait without spinning (configs/cpu.toml says why): a request to
        # the tiny model cost 1.3-4x the CPU with spinning threads beside other servers
        "OMP_WAIT_POLICY": "PASSIVE",
    }
    if request.node.get_closest_marker("multinode") is None:
        # not for the spans: with it, the tensor-parallel group across two local "nodes"
        # failed its first request in both runs (2026-12-06; not looked into yet)
        env["TMPDIR"] = str(vllm_tmp)
    if getattr(request.module, "VLLM_ONE_PROCESS", False):
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        env.update(fork_core_env())
    elif getattr(request.module, "VLLM_FORK_CORE", False):
        # the three-process tree (API server, EngineCore, worker), each child forked as on a
        # GPU node: engine/test_vllm.py, test_cpu_node_vllm.py
        env.update(fork_core_env())
    return env


os.environ.setdefault("HF_HUB_OFFLINE", "1")


# The slow lanes: tests that start real vLLM servers (or build venvs, or drive tmux on real vLLM)
# cost 30-150 s of CPU per server start on a 2-core machine. Under pytest-xdist (`make test` runs
# `-n N --dist loadgroup`), each slow module goes to one of VSUP_TEST_SLOW_LANES lanes (default:
# one per worker), balanced by its measured cost; a lane runs its modules one after the other,
# in file order, first. Every other test file is a unit of its own that the workers take once
# their lane is done (module fixtures stay in one process).
SLOW_MARKS = ("vllm", "install", "tmux")
# Seconds each slow module takes in a full run from a fresh clone on 2 cores (2026-12-06, a
# run at 11:04 UTC with OMP_WAIT_POLICY=PASSIVE, lanes 976/1108 s with the costs before: the sum
# of its tests' setup, call and teardown as `--durations=0` printed them; data parallel, which
# varied 199-300 s over earlier runs with its freeze retries, as it came); a module not listed
# counts as one vLLM start. Only the balance between the lanes depends on these.
SLOW_COST = {
    "test_router_vsup.py": 325,
    "test_bench.py": 282,
    "test_dataparallel_vllm.py": 261,
    "test_vllm.py": 110,  # its children forked since 2026-12-07: 98-110 s alone, 243 s spawned
    "test_span_vllm.py": 180,  # alone, 2026-12-06: 170-183 s (two vLLMs, each started twice)
    "test_cpu_node_vllm.py": 170,
    "test_tune_vllm.py": 157,
    "test_sleep_vllm.py": 142,
    "test_install.py": 75,  # 119 with the beside venv's own vLLM round trip, dropped since
    "test_stall_vllm.py": 77,
    "test_real_daemon.py": 76,
    "test_daemon_vllm.py": 69,
    "test_fault_disk_full_vllm.py": 69,
    "test_fleet_vllm.py": 46,
    "test_pull_vllm.py": 42,
    "test_vllm_flags.py": 10,
    "test_detach_message.py": 5,
}
DEFAULT_COST = 60
# Modules that must not run beside each other, so they share a lane (one after the other):
# cpu_node pins its two multi-process servers to the cores and loads them (the demo load, a
# preemption burst), and data parallel's check that a frozen rank is named needs rank 1 to get
# CPU under load. Side by side on 2 cores, the DP test failed three runs of three (2026-12-05);
# alone it passed.
SAME_LANE = (("test_cpu_node_vllm.py", "test_dataparallel_vllm.py"),)


def is_slow(item: pytest.Item) -> bool:
    return any(item.get_closest_marker(m) for m in SLOW_MARKS)


def slow_lanes(config: pytest.Config) -> int:
    # Collection happens in the workers, where xdist sets `numprocesses` to None and `dist` to
    # "no": the worker count comes from `workerinput` there.
    workers = config.getoption("numprocesses", 0) or 0
    workerinput = getattr(config, "workerinput", None)
    if not workers and workerinput is not None:
        workers = int(workerinput.get("workercount", 0) or 0)
    wanted = os.environ.get("VSUP_TEST_SLOW_LANES")
    lanes = int(wanted) if wanted else int(workers)
    return max(1, lanes)


def _loadgroup(config: pytest.Config) -> bool:
    """`--dist loadgroup`, in the controller (`dist`) or in a worker (xdist sets `dist` to
    "no" there and `loadgroup` to True). A test with no group is a scope of its own, so a
    module's tests would be spread over workers, each with its own module fixtures, and tests
    that build on the one before (test_bench's) would run on a fresh node."""
    if not config.pluginmanager.hasplugin("xdist"):
        return False
    return config.getoption("dist", "no") == "loadgroup" or bool(
        getattr(config.option, "loadgroup", False)
    )


def _selected_by_mark(config: pytest.Config):
    """Whether `-m` keeps an item. This hook runs first (xdist's own, which names each test
    after its group, must see the groups), so before pytest deselects by mark: a module that
    `-m` leaves out (`multinode`: the span tests, 240 s of cost) was counted in a lane, which
    then ran ~120 s short of the other (a fresh clone, 2026-12-06: lanes 1202 and 1083 s)."""
    expr = config.getoption("markexpr", "") or ""
    if not expr:
        return lambda item: True
    from _pytest.mark import MarkMatcher
    from _pytest.mark.expression import Expression

    compiled = Expression.compile(expr)
    return lambda item: compiled.evaluate(MarkMatcher.from_markers(item.iter_markers()))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not _loadgroup(config):
        return
    modules: dict[str, list[pytest.Item]] = {}
    rest: list[pytest.Item] = []
    selected = _selected_by_mark(config)
    left_out: list[pytest.Item] = []
    for item in items:
        if not selected(item):
            left_out.append(item)  # `-m` deselects it after this hook: counted in no lane
            continue
        if is_slow(item):
            modules.setdefault(item.nodeid.split("::")[0], []).append(item)
        else:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
            rest.append(item)
    # longest first onto the least loaded lane; each lane keeps file order
    lanes: list[list[str]] = [[] for _ in range(slow_lanes(config))]
    load = [0] * len(lanes)
    cost = {m: SLOW_COST.get(m.rsplit("/", 1)[-1], DEFAULT_COST) for m in modules}
    # a unit is a module, or the modules of a SAME_LANE group that are collected
    units: list[list[str]] = []
    for group in SAME_LANE:
        members = [m for m in modules if m.rsplit("/", 1)[-1] in group]
        if members:
            units.append(members)
    grouped = {m for unit in units for m in unit}
    units += [[m] for m in modules if m not in grouped]
    for unit in sorted(units, key=lambda u: -sum(cost[m] for m in u)):
        lane = load.index(min(load))
        lanes[lane] += unit
        load[lane] += sum(cost[m] for m in unit)
    slow: list[pytest.Item] = []
    for n, lane_modules in enumerate(lanes):
        for module in sorted(lane_modules, key=list(modules).index):
            for item in modules[module]:
                item.add_marker(pytest.mark.xdist_group(f"vllm-lane-{n}"))
                slow.append(item)
    items[:] = slow + rest + left_out
