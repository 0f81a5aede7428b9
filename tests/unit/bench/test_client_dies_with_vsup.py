"""A `vsup bench` that is SIGKILLed takes its vLLM bench client with it (issue 35 item 18: the
client was left sending ~20 s more load). The client here is a stand-in that behaves as vLLM's
does at the barrier and then keeps "sending" (sleeps); vsup's side is the real ClientRun."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil

from vsup.bench.client import READY

from tests.conftest import until

CLIENT = textwrap.dedent(
    f"""
    import sys, time
    print("{READY} 9.9.9", flush=True)
    if sys.stdin.readline().strip() != "go":
        sys.exit(3)
    time.sleep(120)  # the measured run, going on
    """
)
# vsup's side: start the client as `vsup bench` does, let it go, print its pid, wait.
BENCH = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from vsup.bench.client import ClientRun
    tmp = Path(sys.argv[1])
    c = ClientRun(instance="cpu0", argv=[sys.executable, "-c", sys.argv[2]], env=dict(os.environ),
                  log_path=tmp / "c.log", result_path=tmp / "r.json", total=4)
    c.start()
    assert c.wait_ready(30)
    c.go()
    print(c.proc.pid, flush=True)
    time.sleep(120)
    """
)


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_sigkilled_bench_takes_its_client_with_it(tmp_path: Path):
    bench = subprocess.Popen(
        [sys.executable, "-c", BENCH, str(tmp_path), CLIENT],
        stdout=subprocess.PIPE,
        text=True,
        cwd=str(tmp_path),
    )
    client = None
    try:
        assert bench.stdout is not None
        client = int(bench.stdout.readline())
        assert not gone(client)
        assert psutil.Process(client).ppid() == bench.pid
        bench.send_signal(signal.SIGKILL)
        bench.wait(10)
        until(lambda: gone(client), 15, f"the bench client {client} outlived its SIGKILLed vsup")
    finally:
        bench.kill()
        bench.wait()
        if client is not None and not gone(client):
            os.kill(client, signal.SIGKILL)
