"""What the benchmarks share: paths, the emulator, loopback ports, a daemon of their own, and
the key=value last line.

Every process a benchmark starts carries `VSUP_BENCH_RUN=<token>` in its environment (children
inherit it whatever group or session they move to), so `kill_token` finds and ends all of them
even when a benchmark fails half-way.

A benchmark killed mid-run stops what it started: `install_cleanup` (done by `new_token` and
`Daemon`) turns SIGTERM and SIGHUP into SystemExit, so the benchmark's `finally` blocks run
(SIGINT already raises KeyboardInterrupt), and `at_exit` cleanups (daemons still open, then
every process carrying a token) run when the interpreter exits, whatever ended it.
"""

from __future__ import annotations

import atexit
import contextlib
import math
import os
import shutil
import signal
import socket
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from tests.programs import proctoken

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

EMULATOR = ROOT / "tests" / "programs" / "vllm_emulator.py"
PYTHON = sys.executable
# Not *_TOKEN: the layout rules refuse secret-named variables, and this one is written in the
# benchmark layouts (its value, a hex uuid, does not look like a credential).
TOKEN_VAR = "VSUP_BENCH_RUN"


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_ports(n: int) -> list[int]:
    """`n` distinct loopback ports nobody listens on right now, below the kernel's ephemeral
    range: a port from that range can be taken by any process's outgoing connection or ZMQ
    bind in the seconds before an emulator started one after another binds it (a real vLLM's
    EngineCore of a test run beside took one of 128, 2026-12-06: `port_in_use`)."""
    import random

    high = _ephemeral_low()
    low = max(1024, high - 12000)
    socks: list[socket.socket] = []
    ports: list[int] = []
    try:
        for port in random.sample(range(low, high), high - low):
            if len(ports) == n:
                break
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                s.close()
                continue
            socks.append(s)
            ports.append(port)
    finally:
        for s in socks:
            s.close()
    if len(ports) < n:
        raise RuntimeError(f"only {len(ports)} of {n} free ports below {high}")
    return ports


def free_port_range(n: int, tries: int = 200) -> int:
    """The first of `n` consecutive free loopback ports (the emulator's `--ports A-B`)."""
    for _ in range(tries):
        (base,) = free_ports(1)
        if base + n > 65535:
            continue
        held = []
        try:
            for port in range(base, base + n):
                s = socket.socket()
                held.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
    raise RuntimeError(f"no {n} consecutive free ports found")


_cleanups: list = []
_installed = False


def _terminate(signum: int, _frame: object) -> None:
    # Once: a second signal during the cleanup must not cut it short.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    raise SystemExit(128 + signum)


def _run_cleanups() -> None:
    while _cleanups:
        fn = _cleanups.pop()
        with contextlib.suppress(Exception):
            fn()


def install_cleanup() -> None:
    """Make SIGTERM/SIGHUP end this process through its `finally` blocks and `at_exit`."""
    global _installed
    if _installed:
        return
    _installed = True
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _terminate)
    atexit.register(_run_cleanups)


def at_exit(fn) -> None:
    """Run `fn()` when this process exits (last registered, first run); errors are ignored."""
    install_cleanup()
    _cleanups.append(fn)


def new_token() -> str:
    """A fresh process token; every process carrying it is killed when this process exits."""
    token = uuid.uuid4().hex
    at_exit(lambda: kill_token(token))
    return token


def token_pids(token: str) -> list[int]:
    """Live processes whose environment carries the token."""
    return proctoken.token_pids(token, TOKEN_VAR)


# A run's log guard (supervisor/vsup/engine/logcap.py) ends by itself at its next check after
# its instance's process group is gone, ~1 s at most: a daemon that stopped everything may exit
# before its guards do. What still carries the token after this was left behind.
GUARDS_END_S = 3.0


def kill_token(token: str) -> list[int]:
    """SIGKILL every process carrying the token once the log guards had their time to end;
    the pids that were still alive."""
    deadline = time.monotonic() + GUARDS_END_S
    while token_pids(token) and time.monotonic() < deadline:
        time.sleep(0.1)
    return proctoken.kill_token(token, TOKEN_VAR)


@contextlib.contextmanager
def bench_home() -> Iterator[Path]:
    """A VSUP_HOME of its own, short (unix socket paths are limited to 107 bytes)."""
    home = Path(tempfile.mkdtemp(prefix="vsup-bench-", dir="/tmp"))
    try:
        yield home
    finally:
        shutil.rmtree(home, ignore_errors=True)


def emulator_layout(
    name: str,
    ports: Sequence[int],
    token: str,
    *,
    args: str = "",
    health_interval_s: float = 1.0,
    gpus: Sequence[Sequence[int]] | None = None,
    stop_grace_s: float = 10.0,
    instance_args: Sequence[str] | None = None,
) -> str:
    """A layout of emulated vLLM instances `e000`.. on `ports` (CPU instances unless `gpus`
    gives each one's GPU list; `instance_args`: each one's own `args` entries, merged with the
    defaults' key by key). `pull = false`: the emulator loads no model, and
    "bench/emulated" reads as a hub id the daemon would otherwise pull before the start (every
    instance then stays `stopped (pull failed)`)."""
    import json

    cmd = json.dumps([PYTHON, str(EMULATOR)])
    text = f"""[layout]
name = "{name}"

[defaults]
model = "bench/emulated"
pull = false
command = {cmd}
host = "127.0.0.1"
health_interval_s = {health_interval_s}
stop_grace_s = {stop_grace_s}
env = {{ {TOKEN_VAR} = "{token}" }}
{args}
"""
    for i, port in enumerate(ports):
        g = list(gpus[i]) if gpus is not None else []
        text += f'\n[[instance]]\nname = "e{i:03d}"\ngpus = {g}\nport = {port}\n'
        if instance_args is not None and instance_args[i]:
            text += f"args = {{ {instance_args[i]} }}\n"
    return text


class Daemon:
    """A vsup daemon of the benchmark's own (`python -m vsup daemon`, detached like the
    CLI starts it) and a client for it. `close()` stops its instances, then it."""

    def __init__(self, home: Path, token: str, poll_interval: float = 1.0) -> None:
        from vsup.control.client import JsonClient

        env = dict(os.environ)
        env["VSUP_HOME"] = str(home)
        env[TOKEN_VAR] = token
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
        import subprocess

        self.home = home
        self.log = open(home / "daemon.log", "ab")
        self.proc = subprocess.Popen(
            [PYTHON, "-m", "vsup", "daemon", "--poll-interval", str(poll_interval)],
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=str(home),
            env=env,
        )
        self.pid = self.proc.pid
        self._closed = False
        at_exit(self.close)  # stops its instances even if the benchmark is killed (SIGTERM)
        self.client = JsonClient(home, timeout=120)
        deadline = time.monotonic() + 30
        while self.client.alive(timeout=1.0) is None:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the daemon did not come up; see {home / 'daemon.log'}")
            time.sleep(0.05)

    def wait_states(
        self, want: Iterable[str], timeout: float, names: Iterable[str] | None = None
    ) -> dict:
        """Poll /v1/status until every (named) instance is in one of `want`; the status."""
        want = set(want)
        deadline = time.monotonic() + timeout
        while True:
            status = self.client.status()
            insts = [i for i in status["instances"] if names is None or i["name"] in names]
            if insts and all(i["state"] in want for i in insts):
                return status
            failed = [i for i in insts if (i.get("pull") or {}).get("state") == "failed"]
            if failed:  # no start follows a failed pull: say why now, not after the timeout
                pull = failed[0]["pull"]
                raise RuntimeError(
                    f"the daemon's pull of {pull['model']} failed ({pull['reason']}: "
                    f"{pull['message']}); {len(failed)} instance(s) stay stopped"
                )
            if time.monotonic() > deadline:
                states = {i["name"]: i["state"] for i in insts}
                raise TimeoutError(f"instances not {sorted(want)} after {timeout} s: {states}")
            time.sleep(0.2)

    def close(self) -> None:
        """Stop its instances, then it (idempotent)."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            self.client.shutdown(stop_instances=True)
        try:
            self.proc.wait(timeout=60)
        except Exception:
            self.proc.kill()
            self.proc.wait()
        self.client.close()
        self.log.close()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of one process (not its children), from the kernel's accounting."""
    import psutil

    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100), nearest rank: p99 of 50 samples is the 50th smallest."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def last_line(**figures: object) -> str:
    """The key=value line every benchmark ends with (floats to 3 significant decimals)."""
    parts = []
    for key, value in figures.items():
        if isinstance(value, float):
            value = f"{value:.3f}" if abs(value) < 100 else f"{value:.1f}"
        parts.append(f"{key}={value}")
    return " ".join(parts)


def parse_last_line(text: str) -> dict[str, str]:
    """The key=value pairs of the last non-empty line of a benchmark's output."""
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    if not lines:
        return {}
    out = {}
    for part in lines[-1].split():
        if "=" in part:
            k, v = part.split("=", 1)
            out[k] = v
    return out
