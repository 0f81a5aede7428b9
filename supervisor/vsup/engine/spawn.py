"""Spawning one run of an instance: port check, log file, environment, the process itself.

- The command is the spec's argv list, never a shell; the API key is never in it.
- The environment is `spec.child_env(base)` (the layout's env, GPU pinning, the API key under
  VLLM_API_KEY) with `dirname(sys.executable)` first on PATH, so a layout whose command starts
  with `python` runs the interpreter (and venv) the daemon runs.
- The child gets its own session and process group (`start_new_session=True`): a dropped SSH
  session or a dying daemon sends it nothing, and vsup signals the whole group.
- vLLM's IPC sockets go to a directory of the instance's (rpcdir.py), which is emptied before
  each start and once a run's processes are gone: a killed vLLM never removes its own.
- stdin is /dev/null; stdout and stderr go to the run's log file (runlog.py), which the run's
  log guard (logcap.py, started here once the child runs) keeps under its cap, daemon or not.
- A foreign listener on the port is found before spawning: the run is refused with
  `port_in_use`, and a command that does not exist with `bad_args`; both fail fast. A port
  held only by TIME-WAIT connections (which vLLM could not bind either) is waited out first,
  for at most the 60 s a TIME-WAIT lasts.

Everything here blocks (fork/exec, a socket bind, a scan of sockets): the runner calls
`launch` from a thread.
"""

from __future__ import annotations

import errno
import logging
import os
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass

import psutil

from vsup.engine import rpcdir
from vsup.engine.proc import read_stat
from vsup.engine.runlog import RunLogs
from vsup.engine.states import ExitReason
from vsup.layout.spec import InstanceSpec

log = logging.getLogger("vsup.engine")


@dataclass(frozen=True)
class Launched:
    popen: subprocess.Popen
    pid: int
    pgid: int
    create_time: float


@dataclass(frozen=True)
class Refused:
    """No process was started; `reason` and `excerpt` become the run's last_exit."""

    reason: ExitReason
    excerpt: str
    # retrying cannot help (the command is not there): the instance fails at once, saying why
    fail_fast: bool = False


def child_env(spec: InstanceSpec, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of the instance's process."""
    env = spec.child_env(os.environ if base is None else base)
    here = os.path.dirname(sys.executable)
    path = env.get("PATH", os.defpath)
    env["PATH"] = here + os.pathsep + path if path else here
    return env


# Linux keeps a closed connection in TIME-WAIT for 60 s (TCP_TIMEWAIT_LEN, not tunable).
TIME_WAIT_S = 61.0
TIME_WAIT_POLL_S = 0.25
IN_TIME_WAIT = "connections in TIME-WAIT only (no process listens)"
UNNAMED = "another process"
# A holder with no process to name: what a server killed a moment ago looks like while the
# kernel still tears its processes down (seen: a span's head SIGKILLed, its port still held
# 0.3 s later when its restart began). Polled this long before the start is refused.
UNNAMED_WAIT_S = 15.0


def port_holder(host: str, port: int) -> str | None:
    """None if `host:port` can be bound now, else who holds it (for the operator):
    a listening process, IN_TIME_WAIT, or "another process".

    The bind is tried as vLLM's (uvicorn's) own: with SO_REUSEADDR, which lets it bind beside
    TIME-WAIT leftovers of sockets that had it too (a vLLM that ran there before). A closed
    socket without it (a client's port, a server that did not set it) blocks that bind on
    Linux until its TIME-WAIT ends, for vLLM as for this check (SO_REUSEPORT, which vLLM
    adds, does not help either): that is IN_TIME_WAIT, which `launch` waits out."""
    try:
        infos = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except socket.gaierror:
        return None  # vLLM will say what is wrong with the host
    for family, kind, proto, _, addr in infos:
        with socket.socket(family, kind, proto) as s:
            # as uvicorn binds: TIME_WAIT leftovers of an earlier run do not count
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(addr)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    return _listener(port) or _time_wait(port) or UNNAMED
    return None


def _time_wait(port: int) -> str | None:
    """IN_TIME_WAIT when the only TCP sockets on local `port` are in TIME-WAIT."""
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.AccessDenied, OSError):
        return None
    mine = [c for c in conns if c.laddr and c.laddr.port == port]
    if mine and all(c.status == psutil.CONN_TIME_WAIT for c in mine):
        return IN_TIME_WAIT
    return None


def wait_out_time_wait(host: str, port: int, limit_s: float | None = None) -> str | None:
    """Poll `port_holder` while the port is held by TIME-WAIT connections only, at most
    `limit_s` (TIME_WAIT_S): what holds it then (None: free)."""
    deadline = time.monotonic() + (TIME_WAIT_S if limit_s is None else limit_s)
    holder = port_holder(host, port)
    while holder == IN_TIME_WAIT and time.monotonic() < deadline:
        time.sleep(TIME_WAIT_POLL_S)
        holder = port_holder(host, port)
    return holder


def _listener(port: int) -> str | None:
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.AccessDenied, OSError):
        return None
    for c in conns:
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid:
            try:
                return f"pid {c.pid} ({psutil.Process(c.pid).name()})"
            except psutil.Error:
                return f"pid {c.pid}"
    return None


def _port_busy(spec: InstanceSpec) -> Refused | None:
    """Why the instance's port keeps it from starting (someone holds it); None when free. A
    span's follower runs headless and binds no port here (its `port` is its head's)."""
    if spec.follower:
        return None
    holder = port_holder(spec.host, spec.port)
    deadline = time.monotonic() + UNNAMED_WAIT_S
    while holder == UNNAMED and time.monotonic() < deadline:
        time.sleep(TIME_WAIT_POLL_S)
        holder = port_holder(spec.host, spec.port)
    if holder == IN_TIME_WAIT:
        # vLLM could not bind it either; it is free within a minute: wait, then start
        holder = wait_out_time_wait(spec.host, spec.port)
    if holder == IN_TIME_WAIT:
        return Refused(
            ExitReason.PORT_IN_USE,
            f"port {spec.port} on {spec.host} is still held by {holder} after "
            f"{TIME_WAIT_S:.0f} s: closed connections of a program that did not set "
            f"SO_REUSEADDR; give instance {spec.name!r} another `port`, or start it again",
        )
    if holder is not None:
        return Refused(
            ExitReason.PORT_IN_USE,
            f"port {spec.port} on {spec.host} is in use by {holder}: give instance "
            f"{spec.name!r} another `port` in the layout, or stop that process",
        )
    return None


def launch(
    spec: InstanceSpec,
    logs: RunLogs,
    run: int,
    started_at: str,
    base_env: Mapping[str, str] | None = None,
) -> Launched | Refused:
    """Start run `run` of `spec`, or say why it cannot start (blocking)."""
    busy = _port_busy(spec)
    if busy is not None:
        return busy
    argv = spec.argv()
    env = child_env(spec, base_env)
    if rpcdir.ENV not in env:
        # vLLM's IPC sockets in a directory of the instance's, emptied of what a killed run left
        where = rpcdir.rpc_dir(logs.dir)
        try:
            rpcdir.prepare(where)
            env[rpcdir.ENV] = str(where)
        except OSError as exc:  # vLLM's default (the temp directory) still works
            log.warning("%s: no socket directory %s: %s", spec.name, where, exc)
    header = f"[vsup] {spec.name} run {run} at {started_at}: {shlex.join(argv)}"
    with logs.open_for_run(run, header) as out:
        try:
            popen = subprocess.Popen(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )
        except (FileNotFoundError, PermissionError, NotADirectoryError) as exc:
            why = f"cannot run {argv[0]!r} ({exc.strerror}): {spec.command_hint}"
            out.write(f"[vsup] {why}\n".encode())
            return Refused(ExitReason.BAD_ARGS, why, fail_fast=True)
    info = read_stat(popen.pid)
    # read_stat finds the child even if it exited already: nothing reaps it before our pidfd
    create_time = info.create_time if info is not None else 0.0
    try:
        logs.start_guard(run, popen.pid)
    except OSError as exc:  # the engine's chores try again
        log.warning("%s: no log guard for run %d yet: %s", spec.name, run, exc)
    return Launched(popen, popen.pid, popen.pid, create_time)
