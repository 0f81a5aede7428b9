"""A `vsup` command imports what it needs (issue 35 item 8): `vsup --version` no command
module, `vsup status --json` with a daemon answering neither the control client (httpx) nor
the dashboard, the engine or the layout package. Which modules, never how long: the timings are
benchmarks/status_scale.py's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import outside_cwd, run_vsup

# What `vsup` runs, as `python -m vsup ARGS` does, and the modules it left imported.
PROBE = """
import json, runpy, sys
sys.argv = ["vsup", *sys.argv[1:]]
try:
    runpy.run_module("vsup", run_name="__main__", alter_sys=True)
except SystemExit as exc:
    code = exc.code
sys.stdout.flush()
sys.stderr.write("\\nMODULES " + json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""
HEAVY = ("textual", "httpx", "httpcore", "rich", "psutil", "asyncio", "tomllib", "tomlkit")
HEAVY_VSUP = ("vsup.tui", "vsup.control.client", "vsup.engine", "vsup.layout", "vsup.telemetry")


def imported(home: Path, *args: str) -> tuple[int, list[str], str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        env=dict(os.environ, VSUP_HOME=str(home)),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=outside_cwd(),
        stdin=subprocess.DEVNULL,
    )
    head, _, tail = done.stderr.rpartition("\nMODULES ")
    found = json.loads(tail)
    return found["code"], found["modules"], done.stdout + head


def heavy(modules: list[str]) -> list[str]:
    return [
        m
        for m in modules
        if m.split(".")[0] in HEAVY or any(m == h or m.startswith(h + ".") for h in HEAVY_VSUP)
    ]


def test_version_imports_no_command(vsup_home: Path):
    code, modules, out = imported(vsup_home, "--version")
    assert code in (0, None) and out.strip() == "vsup " + __import__("vsup").__version__
    assert [
        m for m in modules if m.startswith("vsup.commands.") and m != "vsup.commands.exits"
    ] == []
    assert heavy(modules) == []
    assert "argparse" not in modules


@pytest.fixture
def daemon(vsup_home: Path):
    """A real daemon with no layout for VSUP_HOME (`vsup daemon --detach`)."""
    started = run_vsup(vsup_home, "daemon", "--detach")
    assert started.returncode == 0, started.stderr
    yield vsup_home
    run_vsup(vsup_home, "down", "--yes")


def test_status_json_imports_only_the_status_command(daemon: Path):
    code, modules, out = imported(daemon, "status", "--json")
    assert code in (0, 1), out
    assert json.loads(out)["instances"] == []
    assert [m for m in modules if m.startswith("vsup.commands.")] == [
        "vsup.commands.exits",
        "vsup.commands.status",
    ]
    assert heavy(modules) == []


def test_each_command_module_registers_the_names_the_cli_maps_to_it():
    import argparse
    import importlib

    from vsup import cli

    for module in cli.COMMAND_MODULES:
        parser = argparse.ArgumentParser()
        sub = parser.add_subparsers()
        importlib.import_module(module).register(sub)
        mapped = [name for name, mod in cli.COMMANDS.items() if mod == module]
        assert list(sub.choices) == mapped, module
    full = cli.build_parser()
    sub = next(a for a in full._actions if isinstance(a, argparse._SubParsersAction))
    assert list(sub.choices) == list(cli.COMMANDS)


def test_help_and_an_unknown_command_still_name_every_command(vsup_home: Path):
    helped = run_vsup(vsup_home, "--help")
    assert helped.returncode == 0
    for name in ("plan", "status", "drain", "swap", "service"):
        assert name in helped.stdout
    wrong = run_vsup(vsup_home, "stauts")
    assert wrong.returncode == 2 and "invalid choice: 'stauts'" in wrong.stderr
    assert "service" in wrong.stderr
    one = run_vsup(vsup_home, "status", "--help")
    assert one.returncode == 0 and "--json" in one.stdout
