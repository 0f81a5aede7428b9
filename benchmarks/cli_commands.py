"""What a `vsup` command costs as a process: CPU and wall time of the CLI's everyday commands
against a running daemon (issue 35 item 8: import only what a command needs).

    python -m benchmarks.cli_commands [--runs 7]

A daemon of its own (`python -m vsup daemon --detach`, a temporary VSUP_HOME, no layout).
Each command runs as a user runs it (`python -m vsup ...`, a new process, output to a pipe),
`--runs` times; per command the median of the process's CPU (user + system of the child,
`resource.getrusage(RUSAGE_CHILDREN)` around it) and of its wall time. The commands answer
without an instance: `status --json`, `status`, `events`, `logs` (none to show), `stop
nosuch` (refused: unknown instance), `save` (a file in the temporary home), and last `down
--yes` (its own daemon started again before each run).

Before/after figures of another copy of vsup (an earlier commit: `git archive REV supervisor |
tar -x -C /tmp/old`): `PYTHONPATH=/tmp/old/supervisor python -m benchmarks.cli_commands`.

Last line: `cmd=cpu_ms/wall_ms ...` for each command, in the order above.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.common import median  # noqa: E402

COMMANDS = (
    ("status_json", ("status", "--json")),
    ("status", ("status",)),
    ("events", ("events",)),
    ("logs", ("logs",)),
    ("stop_unknown", ("stop", "nosuch")),
    ("save", ("save", "{home}/saved.toml")),
)


def timed(args: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(CPU s, wall s) of one `python -m vsup ARGS` process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    subprocess.run(
        [sys.executable, "-m", "vsup", *args],
        env=env,
        capture_output=True,
        stdin=subprocess.DEVNULL,
        timeout=120,
        check=False,
    )
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall


def start_daemon(env: dict[str, str]) -> None:
    subprocess.run(
        [sys.executable, "-m", "vsup", "daemon", "--detach"],
        env=env,
        capture_output=True,
        timeout=120,
        check=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="vsup-cli-", dir="/tmp"))
    env = dict(os.environ, VSUP_HOME=str(home))
    results: list[tuple[str, float, float]] = []
    try:
        start_daemon(env)
        for name, words in COMMANDS:
            argv = [w.format(home=home) for w in words]
            timed(argv, env)  # a first run: the page cache, not the command
            runs = [timed(argv, env) for _ in range(args.runs)]
            results.append((name, median([c for c, _ in runs]), median([w for _, w in runs])))
        downs = []
        for _ in range(args.runs):
            start_daemon(env)
            downs.append(timed(["down", "--yes"], env))
        results.append(("down", median([c for c, _ in downs]), median([w for _, w in downs])))
    finally:
        subprocess.run(
            [sys.executable, "-m", "vsup", "down", "--yes"], env=env, capture_output=True
        )
        shutil.rmtree(home, ignore_errors=True)
    for name, cpu, wall in results:
        print(
            f"{name:>14}: {cpu * 1000:7.0f} ms CPU {wall * 1000:7.0f} ms wall "
            f"(median of {args.runs})"
        )
    print(" ".join(f"{n}={c * 1000:.0f}/{w * 1000:.0f}" for n, c, w in results))


if __name__ == "__main__":
    main()
