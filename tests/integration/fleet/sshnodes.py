"""Nodes behind real OpenSSH servers on 127.0.0.1, for the fleet tests and benchmark.

Each node is its own `sshd` (Debian's openssh-server) on a free port with its own host key and
sshd_config, its own VSUP_HOME and a real vsup daemon. The client side is what an operator has:
a key, a known_hosts with every node's host key (written here, never learnt by accepting), an
ssh_config with a Host alias per node, and a fleet file naming them. Host keys are checked as
ssh always checks them; nothing here turns that off.

sshd runs as the user running the tests (root here and on CI: `PermitRootLogin
prohibit-password`, the key only). `StrictModes no` because the files live under /tmp.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from tests.ports import free_port

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
ROOT = Path(__file__).resolve().parents[3]


def sshd_missing() -> str | None:
    """Why these tests cannot run here, or None."""
    if not os.access(SSHD, os.X_OK):
        return (
            f"no OpenSSH server ({SSHD}): `make test` installs it with apt-get "
            "(openssh-server) where it can; install it to run the fleet's SSH tests"
        )
    if not shutil.which("ssh") or not shutil.which("ssh-keygen"):
        return "no OpenSSH client (ssh, ssh-keygen): apt-get install openssh-client"
    return None


def keygen(path: Path) -> str:
    """A new ed25519 key at `path` (no passphrase); its public line."""
    for p in (path, path.with_suffix(".pub")):
        p.unlink(missing_ok=True)
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", path.name, "-f", str(path)],
        check=True,
        capture_output=True,
    )
    return path.with_suffix(".pub").read_text().strip()


class SshNode:
    """One node: an sshd on 127.0.0.1:port and a VSUP_HOME."""

    def __init__(self, root: Path, name: str, authorized_keys: Path) -> None:
        self.name = name
        self.dir = root / name
        self.dir.mkdir(mode=0o700)
        self.home = self.dir / "home"
        self.port = free_port()
        self.host_key = self.dir / "host_ed25519"
        self.host_pub = keygen(self.host_key)
        self.config = self.dir / "sshd_config"
        self.log = self.dir / "sshd.log"
        self.proc: subprocess.Popen | None = None
        self.config.write_text(
            f"""ListenAddress 127.0.0.1
Port {self.port}
HostKey {self.host_key}
PidFile {self.dir / "sshd.pid"}
AuthorizedKeysFile {authorized_keys}
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
AllowStreamLocalForwarding yes
AllowTcpForwarding local
X11Forwarding no
PrintMotd no
MaxStartups 64:30:128
MaxSessions 64
LogLevel INFO
"""
        )

    def known_hosts_line(self) -> str:
        kind, key = self.host_pub.split()[:2]
        return f"[127.0.0.1]:{self.port} {kind} {key}"

    def start(self, timeout: float = 20) -> None:
        """Start sshd and wait until it accepts connections."""
        if os.geteuid() == 0:
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # its privilege-separation dir
        log = open(self.log, "ab")
        self.proc = subprocess.Popen(
            [SSHD, "-D", "-e", "-f", str(self.config)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd for {self.name} exited: {self.log.read_text()[-2000:]}")
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=1) as s,
            ):
                if s.recv(4).startswith(b"SSH-"):
                    return
            time.sleep(0.05)
        raise RuntimeError(f"sshd for {self.name} did not listen on {self.port}")

    def _sshd_tree(self) -> list[psutil.Process]:
        """The listener and every sshd process it forked (one per connection; they are in
        their own sessions, so no process group reaches them all)."""
        if self.proc is None:
            return []
        try:
            top = psutil.Process(self.proc.pid)
            kids = top.children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        return [top, *(k for k in kids if _is_sshd(k))]

    def stop(self) -> None:
        """sshd stops: the listener and every connection it serves end (SIGKILL)."""
        for p in self._sshd_tree():
            with contextlib.suppress(psutil.Error):
                p.kill()
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)
        self.proc = None

    def pause(self) -> None:
        """The node hangs (SIGSTOP to all its sshd processes): connections stay open, nothing
        answers - a slow or black-holed node."""
        for p in self._sshd_tree():
            with contextlib.suppress(psutil.Error):
                p.suspend()

    def resume(self) -> None:
        for p in self._sshd_tree():
            with contextlib.suppress(psutil.Error):
                p.resume()

    def vsup(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        """`vsup ARGS` on the node itself (VSUP_HOME = its home), as its operator would."""
        from tests.conftest import run_vsup

        return run_vsup(self.home, *args, timeout=timeout)

    def down(self) -> None:
        """Stop the node's daemon and instances, whatever is left."""
        if (self.home / "vsup.sock").exists():
            with contextlib.suppress(Exception):
                self.vsup("down", "--yes", timeout=60)
        for p in psutil.process_iter(["cmdline", "environ"]):
            with contextlib.suppress(psutil.Error):
                env = p.info.get("environ") or {}
                if env.get("VSUP_HOME") == str(self.home):
                    p.kill()


def _is_sshd(p: psutil.Process) -> bool:
    try:
        return p.name() == "sshd" or (p.cmdline()[:1] or [""])[0].startswith("sshd")
    except psutil.Error:
        return False


class SshFleet:
    """Several SshNodes, the operator's key, known_hosts, ssh_config and fleet file."""

    def __init__(self, names: list[str], fleet_name: str = "test") -> None:
        # short: unix socket paths (control sockets, the daemons' sockets) are at most 107 bytes
        self.root = Path(tempfile.mkdtemp(prefix="vf-", dir="/tmp"))
        os.chmod(self.root, 0o700)
        self.key = self.root / "id_ed25519"
        pub = keygen(self.key)
        self.authorized_keys = self.root / "authorized_keys"
        self.authorized_keys.write_text(pub + "\n")
        self.nodes = {n: SshNode(self.root, n, self.authorized_keys) for n in names}
        self.known_hosts = self.root / "known_hosts"
        self.ssh_config = self.root / "ssh_config"
        self.fleet_file = self.root / "fleet.toml"
        self.operator_home = self.root / "op"  # the operator's own VSUP_HOME
        self.fleet_name = fleet_name
        self.write_client_files()

    def write_client_files(self, extra: str = "") -> None:
        self.known_hosts.write_text(
            "".join(n.known_hosts_line() + "\n" for n in self.nodes.values())
        )
        user = getpass.getuser()
        hosts = "".join(
            f"""Host {n.name}
  HostName 127.0.0.1
  Port {n.port}
  User {user}
"""
            for n in self.nodes.values()
        )
        self.ssh_config.write_text(
            hosts
            + f"""Host *
  IdentityFile {self.key}
  IdentitiesOnly yes
  UserKnownHostsFile {self.known_hosts}
  GlobalKnownHostsFile /dev/null
"""
        )
        vsup = json.dumps([sys.executable, "-m", "vsup"])
        text = f'[fleet]\nname = "{self.fleet_name}"\nssh_config = "ssh_config"\ntimeout_s = 3\n'
        text += "connect_timeout_s = 15\n" + extra
        for i, n in enumerate(self.nodes.values()):
            group = "rack1" if i < 2 else "rack2"
            text += f"""
[[node]]
name = "{n.name}"
ssh = "{n.name}"
home = "{n.home}"
vsup = {vsup}
groups = ["{group}"]
"""
        self.fleet_file.write_text(text)

    def start(self) -> SshFleet:
        for n in self.nodes.values():
            n.start()
        return self

    def fleet(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        """`vsup fleet ARGS --fleet FILE` as the operator runs it (their own VSUP_HOME)."""
        from tests.conftest import run_vsup

        sub, rest = (args[0], args[1:]) if args and not args[0].startswith("-") else (None, args)
        argv = ["fleet", *([sub] if sub else []), "--fleet", str(self.fleet_file), *rest]
        return run_vsup(self.operator_home, *argv, timeout=timeout)

    def status(self, *args: str) -> dict:
        res = self.fleet("status", "--json", *args)
        assert res.returncode in (0, 1), (res.stdout, res.stderr)
        return {n["name"]: n for n in json.loads(res.stdout)["nodes"]}

    def close(self) -> None:
        # the operator's ssh masters first (they would keep connections open), then the nodes
        run = self.operator_home / "fleet"
        for cm in run.glob("cm-*") if run.is_dir() else ():
            subprocess.run(
                ["ssh", "-F", str(self.ssh_config), "-o", f"ControlPath={cm}", "-O", "exit", "x"],
                capture_output=True,
                timeout=10,
            )
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=8) as pool:  # each `vsup down` is its own process
            list(pool.map(lambda n: n.down(), self.nodes.values()))
        for n in self.nodes.values():
            n.stop()
        for p in psutil.process_iter(["cmdline"]):
            with contextlib.suppress(psutil.Error):
                cmd = p.info.get("cmdline") or []
                if any(str(self.root) in c for c in cmd) and p.pid != os.getpid():
                    p.send_signal(signal.SIGKILL)
        shutil.rmtree(self.root, ignore_errors=True)
