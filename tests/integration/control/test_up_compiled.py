"""`vsup up` over the compiled layout, as operators run it (real subprocesses, a real detached
daemon, vLLM emulators): it compiles the layout without importing the daemon, parses the TOML
once in each process per request, and `--dry-run` says what changes per instance."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from hashlib import sha256
from pathlib import Path

import pytest

from tests.conftest import outside_cwd
from tests.integration.control.test_cli import cli_home, vsup  # noqa: F401 (fixture)
from tests.unit.control.helpers import emulator_layout, free_port

pytestmark = pytest.mark.timeout(180)

# Imported into every Python started with it on PYTHONPATH (the CLI, and the daemon the CLI
# spawns, which inherits the environment): each tomllib.loads call appends "pid sha256".
COUNTING = """
import hashlib, os, tomllib

_log = os.environ.get("VSUP_TEST_PARSE_LOG")
if _log:
    _real = tomllib.loads

    def loads(text, **kw):
        with open(_log, "a") as fh:
            fh.write(f"{os.getpid()} {hashlib.sha256(text.encode()).hexdigest()}\\n")
        return _real(text, **kw)

    tomllib.loads = loads
"""

DAEMON_MODULES = ("vsup.control.daemon", "vsup.control.service", "vsup.engine")


def imported_modules(stderr: str) -> set[str]:
    """Module names from `python -X importtime` output."""
    out = set()
    for line in stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            out.add(line.rsplit("|", 1)[1].strip())
    return out


def run(home: Path, *args: str, env: dict[str, str] | None = None, flags: tuple[str, ...] = ()):
    return subprocess.run(
        [sys.executable, *flags, "-m", "vsup", *args],
        env=dict(os.environ, VSUP_HOME=str(home), **(env or {})),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=outside_cwd(),
        stdin=subprocess.DEVNULL,
    )


def test_up_compiles_the_layout_without_importing_the_daemon(cli_home, tmp_path):  # noqa: F811
    bad = tmp_path / "bad.toml"
    bad.write_text(emulator_layout({"a": 8000, "b": 8000}))
    refused = run(cli_home, "up", str(bad), "--detach", flags=("-X", "importtime"))
    assert refused.returncode == 2, refused.stderr
    assert "8000" in refused.stderr and "nothing was changed" in refused.stderr
    modules = imported_modules(refused.stderr)
    assert "vsup.layout.compiled" in modules and "vsup.telemetry.gpu" in modules
    assert not {m for m in modules if m.startswith(DAEMON_MODULES)}, modules
    assert not (cli_home / "vsup.sock").exists()  # refused before any daemon started

    good = tmp_path / "good.toml"
    good.write_text(emulator_layout({"a": free_port()}))
    dry = run(cli_home, "up", str(good), "--detach", "--dry-run", flags=("-X", "importtime"))
    assert dry.returncode == 0, dry.stderr
    assert "start: a" in dry.stdout
    # the daemon it started is another process: this one compiled and asked it
    assert not {m for m in imported_modules(dry.stderr) if m.startswith(DAEMON_MODULES)}


def test_up_parses_the_layout_once_per_process_and_request(cli_home, tmp_path):  # noqa: F811
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(COUNTING)
    log = tmp_path / "parses.log"
    env = {"PYTHONPATH": str(hook), "VSUP_TEST_PARSE_LOG": str(log)}
    layout = tmp_path / "once.toml"
    text = emulator_layout({"a": free_port()})
    layout.write_text(text)
    res = run(cli_home, "up", str(layout), "--detach", "--wait", "--timeout", "60", env=env)
    assert res.returncode == 0, res.stderr
    digest = sha256(text.encode()).hexdigest()
    by_pid = Counter(line.split()[0] for line in log.read_text().splitlines() if digest in line)
    daemon_pid = (cli_home / "daemon.lock").read_text().strip()
    # the CLI compiled it once; the daemon once for the dry run and once for the apply
    assert by_pid.pop(daemon_pid) == 2, by_pid
    assert list(by_pid.values()) == [1], by_pid


def test_dry_run_prints_what_changes_per_instance(cli_home, tmp_path):  # noqa: F811
    ports = {"a": free_port(), "b": free_port()}
    first = tmp_path / "first.toml"
    first.write_text(emulator_layout(ports))
    assert vsup(cli_home, "up", str(first), "--detach", "--wait", "--timeout", "60").returncode == 0
    changed = tmp_path / "changed.toml"
    text = emulator_layout(ports, args='args = { say = "v2" }')
    changed.write_text(text.replace('model = "test/fake"', 'model = "test/other"', 1))
    dry = vsup(cli_home, "up", str(changed), "--detach", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    lines = dry.stdout.splitlines()
    assert "restart (changed, rolling): a, b" in lines
    start = lines.index("changes:")
    assert lines[start + 1 : start + 5] == [
        "  a: model: test/fake -> test/other",
        "  a: args.say: (unset) -> v2",
        "  b: model: test/fake -> test/other",
        "  b: args.say: (unset) -> v2",
    ]
    again = vsup(cli_home, "up", str(first), "--detach", "--dry-run")
    assert "unchanged: a, b" in again.stdout and "changes:" not in again.stdout
