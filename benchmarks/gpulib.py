"""Helpers shared by the runs on a real NVIDIA node (gpu_verify.py, gpu_all_tp1.py): the vsup
CLI as a subprocess, nvidia-smi queries, the journal, process trees and PASS/FAIL checks.
Stdlib and psutil only, so they run on a bare GPU machine."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EMULATOR = REPO / "tests" / "programs" / "vllm_emulator.py"
MiB = 1 << 20

results: list[tuple[str, bool, str]] = []


def check(name: str, ok: bool, detail: str) -> bool:
    results.append((name, ok, detail))
    print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)
    return ok


def vsup(
    *args: str, check_rc: bool = True, timeout: float = 600, quiet: bool = False
) -> subprocess.CompletedProcess:
    """Run the vsup CLI with this interpreter; print the command and (unless quiet) its output."""
    cmd = [sys.executable, "-m", "vsup", *args]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=timeout)
    if quiet and proc.returncode in (0, 1):
        return proc
    print(f"$ vsup {' '.join(args)}  (rc={proc.returncode}, {time.monotonic() - t0:.1f}s)")
    if proc.stdout.strip():
        print(proc.stdout.rstrip())
    if proc.stderr.strip():
        print(proc.stderr.rstrip())
    if check_rc and proc.returncode not in (0,):
        raise SystemExit(f"vsup {' '.join(args)} failed with {proc.returncode}")
    return proc


def smi(query: str, kind: str = "gpu") -> list[list[str]]:
    flag = "--query-gpu" if kind == "gpu" else "--query-compute-apps"
    out = subprocess.run(
        ["nvidia-smi", f"{flag}={query}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [[c.strip() for c in line.split(",")] for line in out.splitlines() if line.strip()]


def smi_gpus() -> dict[str, dict]:
    rows = smi("index,uuid,memory.used,memory.total")
    return {r[1]: {"index": int(r[0]), "used_mib": int(r[2]), "total_mib": int(r[3])} for r in rows}


def smi_apps() -> list[dict]:
    gpus = smi_gpus()
    apps = []
    for pid, uuid, used in smi("pid,gpu_uuid,used_memory", kind="apps"):
        apps.append({"pid": int(pid), "gpu": gpus[uuid]["index"], "used_mib": int(used)})
    return apps


def status() -> dict:
    return json.loads(vsup("status", "--json", check_rc=False).stdout)


def journal(home: Path) -> list[dict]:
    events = []
    for line in (home / "journal.jsonl").read_text().splitlines():
        with contextlib.suppress(ValueError):
            events.append(json.loads(line))
    return events


def ts(event: dict) -> float:
    return datetime.fromisoformat(event["t"].replace("Z", "+00:00")).timestamp()


def tree_pids(pid: int) -> set[int]:
    import psutil

    try:
        proc = psutil.Process(pid)
        pgid = os.getpgid(pid)
    except (psutil.NoSuchProcess, ProcessLookupError):
        return set()
    pids = {pid} | {c.pid for c in proc.children(recursive=True)}
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == pgid:
                pids.add(p.pid)
        except (ProcessLookupError, PermissionError):
            pass
    return pids


def screenshot(out: Path, size: tuple[int, int], select: str | None = None) -> None:
    """The dashboard as it shows this node, through the real daemon, saved as SVG."""
    cmd = [sys.executable, "-m", "vsup", "tui", "--screenshot", str(out)]
    cmd += ["--size", f"{size[0]}x{size[1]}", *(["--select", select] if select else [])]
    for _attempt in range(2):  # one retry: a loaded machine can lose a race in the app's start
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
        if proc.returncode == 0 and out.exists():
            break
    # The SVG is the result; a non-zero exit after it was written is reported, not fatal.
    err = proc.stderr.strip().splitlines()[-1:] if proc.returncode else []
    check(
        f"dashboard screenshot {size[0]}x{size[1]}",
        out.exists(),
        f"{out.name} (rc={proc.returncode}{': ' + err[0][-200:] if err else ''})",
    )


def wait_for(pred, timeout: float, what: str, interval: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(interval)
    raise SystemExit(f"timed out after {timeout}s waiting for {what}")


def alive(pid: int) -> bool:
    """A process that still runs (a zombie holds no memory and no longer runs)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
