"""What the fault-injection tests share: the CLI as operators run it, a real detached daemon,
vLLM emulators (tests/programs/vllm_emulator.py) where the fault is about vsup's own files and
socket, and a cleanup that leaves no process behind whatever the test did."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from tests.conftest import run_vsup as vsup


def daemons_of(home: Path) -> list[psutil.Process]:
    """Live daemon processes serving `home` (a spawned daemon runs with cwd VSUP_HOME)."""
    out = []
    for p in psutil.process_iter(["cmdline", "cwd", "status"]):
        cmd = p.info["cmdline"] or []
        if (
            cmd[-3:] == ["-m", "vsup", "daemon"]
            and p.info["cwd"] == str(home)
            and p.info["status"] != psutil.STATUS_ZOMBIE
        ):
            out.append(p)
    return out


def alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def status(home: Path) -> dict[str, Any]:
    res = vsup(home, "status", "--json")
    assert res.stdout, res.stderr
    return json.loads(res.stdout)


def instance(home: Path, name: str) -> dict[str, Any]:
    return {i["name"]: i for i in status(home)["instances"]}[name]


def wait_for(check: Callable[..., Any], timeout: float, what: str, interval: float = 0.2) -> Any:
    """Poll `check` until it returns something true; its value. Fails naming `what`."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what} (last: {last!r})")


def cleanup(home: Path) -> None:
    """End the daemon of `home` and every process group its journal shows it spawned."""
    if daemons_of(home):
        with contextlib.suppress(subprocess.TimeoutExpired):
            vsup(home, "down", "--yes", timeout=60)
    for p in daemons_of(home):
        with contextlib.suppress(psutil.Error):
            p.kill()
    for name in ("journal.jsonl", "journal.jsonl.1"):
        journal = home / name
        if not journal.exists():
            continue
        for line in journal.read_bytes().splitlines():
            with contextlib.suppress(ValueError, KeyError, TypeError, AttributeError):
                ev = json.loads(line)
                if ev.get("kind") == "spawn" and ev.get("pgid"):
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(ev["pgid"], signal.SIGKILL)
