"""Reaching a node's daemon over the operator's own OpenSSH (docs/fleet.md, "Transport").

Per node, one ControlMaster (`ControlPersist`, so the next `vsup fleet` call finds it warm) and
one forward of the node daemon's unix socket to a private local one:
`ssh -O forward -L RUN/<id>.sock:<remote home>/vsup.sock`. Every control-API call then is plain
HTTP over that local socket (`fleet.http.NodeClient`; a node's dashboard opened from the fleet
uses `control.client.AsyncClient(socket=...)` on it), through the master's connection: no new
SSH handshake, no process per call.

The first connection (cold) is two ssh calls over one TCP connection: the node's own `vsup paths
--json` (where its daemon's socket is, the vsup and vLLM versions), whose ssh authenticates,
checks the host key and stays on as the master (`ControlMaster auto`, `ControlPersist`), then
`-O forward`. What they learned is kept
in `RUN/<id>.json` while the master lives.

Host keys are checked as the operator's ssh checks them: `BatchMode=yes` turns every question
(an unknown or changed key, a passphrase) into a refusal with SSH's own message, and nothing
here sets StrictHostKeyChecking or UserKnownHostsFile. RUN is `$VSUP_HOME/fleet`, 0700.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import signal
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vsup import paths
from vsup.fleet.model import Fleet, Node

CONTROL_PERSIST_S = 600  # a master outlives the command that made it by this much idle time
SERVER_ALIVE_S = 5  # keepalives: a dead peer ends the master after 3 unanswered ones
# ssh binds its ControlPath as `PATH.` + 16 random characters first, then renames it.
MAX_CONTROL_PATH = 107 - 17


class Unreachable(Exception):
    """The node cannot be reached over SSH, or its vsup cannot be run; the message says why,
    in SSH's own words where SSH said it."""

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail  # the whole of what ssh printed


class NoDaemon(Exception):
    """The node answers over SSH but no vsup daemon runs for its VSUP_HOME."""


@dataclass(frozen=True)
class Tunnel:
    """A node's daemon, reachable on `local_socket`. `info` is the node's `vsup paths --json`
    answer (home, socket, version, vllm_version, daemon pid or None)."""

    node: str
    local_socket: Path
    remote_socket: str
    info: dict[str, Any]
    connected_at: float  # wall clock
    warm: bool  # found from an earlier connection, not made now


def run_dir(home: Path | None = None) -> Path:
    """`$VSUP_HOME/fleet`: control sockets, forwarded sockets, what they lead to. 0700 and this
    user's, or refused (a socket there gives whoever can reach it the node's daemon)."""
    base = (home or paths.vsup_home()) / "fleet"
    try:
        os.mkdir(base, 0o700)
        os.chmod(base, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(base)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise paths.HomeError(f"{base} is not a directory of this user; remove it")
    if st.st_mode & 0o077:
        raise paths.HomeError(f"{base} is open to other users; `chmod 700 {base}`")
    return base


def node_id(fleet: Fleet, node: Node) -> str:
    """A short stable name for a node's files: its destination, home and ssh config."""
    key = "\0".join((node.ssh, node.home or "", str(fleet.ssh_config or "")))
    return hashlib.sha256(key.encode()).hexdigest()[:12]


def ssh_error(text: str) -> str:
    """SSH's message on one line: the host-key banner kept to its verdict and its offending
    line, else the last thing ssh said."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    lines = [ln for ln in lines if not ln.startswith("Warning: Permanently added")]
    if not lines:
        return "ssh failed without a message"
    changed = next((ln for ln in lines if "IDENTIFICATION HAS CHANGED" in ln), None)
    if changed:
        keep = [changed.strip("@ ").strip()]
        keep += [ln for ln in lines if ln.startswith(("Offending", "Host key for"))]
        keep += [ln for ln in lines if "verification failed" in ln]
        return " ".join(keep)
    return lines[-1].removeprefix("ssh: ")


class Transport:
    """OpenSSH for one fleet. Async: every ssh runs as a subprocess with a deadline."""

    def __init__(self, fleet: Fleet, run: Path | None = None, ssh: str = "ssh") -> None:
        self.fleet = fleet
        self.run = run or run_dir()
        self.ssh = ssh
        self._tunnels: dict[str, Tunnel] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    # -- paths and command lines ---------------------------------------------------------------

    def control_path(self, node: Node) -> Path:
        path = self.run / f"cm-{node_id(self.fleet, node)}"
        if len(os.fsencode(str(path))) > MAX_CONTROL_PATH:
            raise Unreachable(
                f"the SSH control socket {path} would be over the {MAX_CONTROL_PATH}-byte limit "
                "of unix sockets; set VSUP_HOME to a shorter directory"
            )
        return path

    def local_socket(self, node: Node) -> Path:
        return self.run / f"{node_id(self.fleet, node)}.sock"

    def _cache(self, node: Node) -> Path:
        return self.run / f"{node_id(self.fleet, node)}.json"

    def base_args(self, node: Node) -> list[str]:
        """`ssh` with the options every call shares (never host-key options: the operator's)."""
        args = [self.ssh]
        if self.fleet.ssh_config is not None:
            args += ["-F", str(self.fleet.ssh_config)]
        args += [
            "-o", "BatchMode=yes",
            "-o", f"ConnectTimeout={max(1, round(self.fleet.connect_timeout_s))}",
            "-o", f"ServerAliveInterval={SERVER_ALIVE_S}",
            "-o", "ServerAliveCountMax=3",
            "-o", f"ControlPath={self.control_path(node)}",
            "-o", "StreamLocalBindUnlink=yes",
            "-o", "ExitOnForwardFailure=yes",
        ]  # fmt: skip
        return args

    # -- subprocesses --------------------------------------------------------------------------

    async def _ssh(self, args: list[str], timeout: float) -> tuple[int, str, str]:
        """Run ssh; (code, stdout, stderr). On timeout it is killed (its process group: a
        master it was becoming goes too) and TimeoutError is raised."""
        proc = await asyncio.create_subprocess_exec(
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,  # its own group: killed whole on a timeout
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout)
        except (TimeoutError, asyncio.CancelledError):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(proc.wait(), 2)
            raise
        finally:
            # closed now, not when collected after the loop ended ("Event loop is closed")
            transport = getattr(proc, "_transport", None)
            if transport is not None:
                transport.close()
        text = err.decode(errors="replace") if err else ""
        return proc.returncode or 0, (out or b"").decode(errors="replace"), text

    async def remote_vsup(self, node: Node, *args: str, timeout: float) -> dict[str, Any]:
        """Run the node's own `vsup ARGS` and parse its JSON answer. Over the node's master;
        with none (or a stale socket of one that died) this ssh becomes it: `ControlMaster
        auto` + `ControlPersist`, the master going to the background once the command is done
        (it hands its stdio back: measured, a pipe on stdout and stderr ends with the command).
        Two commands racing for it are fine: the loser connects directly, once."""
        cmd = node.remote_command(*args)
        ssh = [
            *self.base_args(node),
            "-o", "ControlMaster=auto",
            "-o", f"ControlPersist={CONTROL_PERSIST_S}",
            node.ssh, cmd,
        ]  # fmt: skip
        try:
            code, out, err = await self._ssh(ssh, timeout)
        except TimeoutError:
            raise Unreachable(
                f"{cmd} on {node.name} did not answer within {timeout:.0f} s"
            ) from None
        if code == 255:
            raise Unreachable(f"ssh {node.ssh}: {ssh_error(err)}", err)
        if code != 0:
            said = ssh_error(err) if err.strip() else f"exit status {code}"
            hint = ""
            if code == 127:
                where = f" in {self.fleet.path}" if self.fleet.path else ""
                hint = f"; set `vsup` (the remote command) for node {node.name}{where}"
            raise Unreachable(f"`{cmd}` failed on {node.name}: {said}{hint}", err)
        try:
            doc = json.loads(out)
        except ValueError:
            raise Unreachable(
                f"`{cmd}` on {node.name} did not print JSON (is it vsup 0.2 or newer?): "
                f"{out.strip()[:200]!r}"
            ) from None
        if not isinstance(doc, dict):
            raise Unreachable(f"`{cmd}` on {node.name} printed {type(doc).__name__}, not an object")
        return doc

    async def _forward(self, node: Node, remote: str, timeout: float) -> Path:
        local = self.local_socket(node)
        args = [*self.base_args(node), "-O", "forward", "-L", f"{local}:{remote}", node.ssh]
        try:
            code, _, err = await self._ssh(args, timeout)
        except TimeoutError:
            raise Unreachable(
                f"ssh -O forward to {node.name} did not answer in {timeout:.0f} s"
            ) from None
        if code != 0:
            raise Unreachable(
                f"ssh could not forward {remote} of {node.name}: {ssh_error(err)}", err
            )
        return local

    # -- tunnels -------------------------------------------------------------------------------

    def cached(self, node: Node) -> Tunnel | None:
        """The tunnel this process or an earlier one made, if its local socket is still there
        (it may be stale: a failed call then `invalidate`s it)."""
        t = self._tunnels.get(node.name)
        if t is not None and t.local_socket.exists():
            return t
        try:
            doc = json.loads(self._cache(node).read_text())
        except (OSError, ValueError):
            return None
        local = self.local_socket(node)
        if not local.exists() or not isinstance(doc, dict) or doc.get("ssh") != node.ssh:
            return None
        t = Tunnel(node.name, local, doc["remote_socket"], doc["info"], doc["connected_at"], True)
        self._tunnels[node.name] = t
        return t

    def invalidate(self, node: Node) -> None:
        """Forget the tunnel (its socket no longer leads to a daemon)."""
        self._tunnels.pop(node.name, None)
        with contextlib.suppress(OSError):
            self._cache(node).unlink()

    async def connect(self, node: Node, timeout: float | None = None) -> Tunnel:
        """A tunnel to the node's daemon socket: the cached one, else a new one (master when
        none runs, `vsup paths --json`, forward). Unreachable / NoDaemon say why not."""
        timeout = timeout or self.fleet.connect_timeout_s
        lock = self._locks.setdefault(node.name, asyncio.Lock())
        async with lock:
            t = self.cached(node)
            if t is not None:
                return t
            deadline = time.monotonic() + timeout

            def left() -> float:
                return max(0.5, deadline - time.monotonic())

            info = await self.remote_vsup(node, "paths", "--json", timeout=left())
            remote = info.get("socket")
            if not isinstance(remote, str) or not remote.startswith("/"):
                raise Unreachable(f"`vsup paths --json` on {node.name} named no socket: {info}")
            if info.get("daemon") is None:
                raise NoDaemon(
                    f"no vsup daemon runs on {node.name} for {info.get('home')} "
                    "(`vsup fleet up` starts one; on the node, `vsup daemon --detach` or `vsup up`)"
                )
            local = await self._forward(node, remote, left())
            t = Tunnel(node.name, local, remote, info, time.time(), False)
            self._tunnels[node.name] = t
            from vsup.fsutil import write_atomic

            write_atomic(
                self._cache(node),
                json.dumps(
                    {
                        "ssh": node.ssh,
                        "remote_socket": remote,
                        "info": info,
                        "connected_at": t.connected_at,
                    }
                ),
                mode=0o600,
            )
            return t

    async def start_daemon(self, node: Node, timeout: float = 60.0) -> dict[str, Any]:
        """Start the node's daemon if none runs (its own `vsup daemon --detach`)."""
        self.invalidate(node)
        return await self.remote_vsup(node, "daemon", "--detach", timeout=timeout)
