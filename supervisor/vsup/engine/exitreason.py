"""Why an instance ended: its exit status plus the tail of its run log -> one exit reason.

The reasons (snapshot.EXIT_REASONS) and what decides each, first match wins:
- `stopped`: the operator stopped it (whatever the log says).
- a decisive log line, in this order of precedence (a root cause outranks what follows it):
  - `port_in_use`: `OSError: [Errno 98] Address already in use` (vLLM binding its port), or
    uvicorn's `error while attempting to bind on address`, or vllm-router's `Address already in
    use (os error 98)` (its metrics port). torch.distributed's EADDRINUSE for
    its own rendezvous port is deliberately not matched: that port is random, a retry helps.
  - `bad_args`: argparse's `prog: error: ...` (`unrecognized arguments`, `argument --x: ...`).
  - `model_not_found`: huggingface_hub's `Repo id must be in the form` (a local path that does
    not exist), `LocalEntryNotFoundError` (offline, not cached), `RepositoryNotFoundError`,
    `GatedRepoError`, vLLM 0.32's `Invalid repository ID or local directory specified` (a
    directory without config.json), transformers' `does not appear to have a file named
    config.json` / `is not a local folder and is not a valid model identifier`, and
    `No such file or directory` on a line naming the model.
  - `gpu_memory_insufficient`: vLLM's start-up refusals for want of GPU memory: `Free memory
    on device cuda:0 (38.77/139.8 GiB) on startup is less than desired GPU memory utilization`
    (and 0.32's `... less than the engine's budget`), `No available memory for the cache
    blocks`, and a CUDA/HIP out-of-memory while the run was starting (`starting=True`).
    The EngineCore logs the ValueError; the APIServer's `RuntimeError: Engine core
    initialization failed` that follows is only its echo, so the ValueError is the excerpt.
    What the engine does next depends on who holds the memory (memory.py).
  - `kv_cache_too_small`: `To serve at least one request with the model's max seq len`, the
    older `... is larger than the maximum number of tokens that can be stored in KV cache`:
    the configuration (max-model-len) does not fit the KV cache vLLM could make.
  - `oom`: an allocation failed while serving: `CUDA out of memory`, `HIP out of memory`,
    `torch.OutOfMemoryError`, `CUDA error: out of memory`, `hipErrorOutOfMemory`, and
    `DefaultCPUAllocator: can't allocate memory` (host memory) at any time.
  - `engine_dead`: `EngineDeadError`, `EngineCore encountered an issue`, `Engine core
    initialization failed` (the excerpt then adds the root-cause exception above it). Not after
    `[shutdown] API server: shutdown triggered`: vLLM 0.32 logs `EngineDeadError` on every
    SIGTERM shutdown too (tests/fixtures/vllm-0.32-cpu/startup.log ends with one).
- `startup_timeout`, `unhealthy`, `engine_dead`, `stalled`: vsup ended the process for that
  cause (`engine_dead` when /health answered 503; `stalled`: `restart.on_stall` and requests
  with no token processed for `stall_after_s`).
- `killed`: a signal that vsup did not send ended it (SIGKILL from a person or the kernel's
  OOM killer, SIGSEGV, ...); the signal's name is in `last_exit.signal`. Also a SIGTERM or
  SIGINT that vsup did not send: vLLM catches those, logs `[shutdown] API server: shutdown
  triggered` and exits 0, so the log line is the only trace (the signal stays null).
- `bad_args`: exit code 2 (argparse's) with no decisive line.
- `unknown`: anything else; the excerpt is the last exception line, if any.

Lines logged by vLLM at INFO, WARNING or DEBUG level never decide: every vLLM start warns
about `OSError: [Errno 24] Too many open files` (a ulimit hint), for instance.
"""

from __future__ import annotations

import re
import signal as _signal
from dataclasses import dataclass

from vsup.engine.states import ExitReason

EXCERPT_MAX = 500

# vLLM's log prefix: "(APIServer pid=7267) INFO 11-29 22:17:16 [file.py:12] message".
_QUIET_LEVEL = re.compile(r"^(?:\([\w:\-]+ pid=\d+\) )?(?:INFO|WARNING|DEBUG) \d\d-\d\d ")

R = ExitReason
GPU_MEMORY_INSUFFICIENT = R.GPU_MEMORY_INSUFFICIENT
# An out-of-memory of the GPU itself (not the host's allocator): at start-up, a memory refusal.
_GPU_OOM = re.compile(
    r"(?:CUDA|HIP) out of memory|OutOfMemoryError|CUDA error: out of memory|hipErrorOutOfMemory"
)

_RULES: tuple[tuple[ExitReason, re.Pattern[str]], ...] = (
    (
        R.PORT_IN_USE,
        re.compile(
            r"\[Errno 98\][^\n]*address already in use"
            r"|error while attempting to bind on address[^\n]*address already in use"
            # vllm-router (Rust), e.g. its metrics port: FailedToCreateHTTPListener("Address
            # already in use (os error 98)")
            r"|address already in use \(os error 98\)",
            re.IGNORECASE,
        ),
    ),
    (R.BAD_ARGS, re.compile(r"^[\w./\- ]{1,60}: error: ")),
    (
        R.MODEL_NOT_FOUND,
        re.compile(
            r"Repo id must be in the form"
            r"|LocalEntryNotFoundError"
            r"|RepositoryNotFoundError"
            r"|GatedRepoError"
            r"|Invalid repository ID or local directory specified"
            r"|does not appear to have a file named config\.json"
            r"|is not a local folder and is not a valid model identifier"
        ),
    ),
    (
        GPU_MEMORY_INSUFFICIENT,
        re.compile(
            r"Free memory on device \S+ \([\d.]+/[\d.]+ GiB\) on startup is less than"
            r"|No available memory for the cache blocks"
        ),
    ),
    (
        R.KV_CACHE_TOO_SMALL,
        re.compile(
            r"To serve at least one request with the model's max seq len"
            r"|is larger than the maximum number of tokens that can be stored in KV cache"
        ),
    ),
    (
        R.OOM,
        re.compile(
            r"(?:CUDA|HIP) out of memory"
            r"|OutOfMemoryError"
            r"|CUDA error: out of memory"
            r"|hipErrorOutOfMemory"
            r"|DefaultCPUAllocator: can't allocate memory"
        ),
    ),
    (
        R.ENGINE_DEAD,
        re.compile(
            r"EngineDeadError|EngineCore encountered an issue|Engine core initialization failed"
        ),
    ),
    # vLLM's config validation (pydantic) when no rule above said more (a missing model is
    # one too): "1 validation error for ModelConfig ... Sleep mode is not supported on current
    # platform". A start with the same arguments fails the same way.
    (R.BAD_ARGS, re.compile(r"\d+ validation errors? for \w*Config\b")),
)

# A Python exception line, as the last line of a traceback prints it.
_EXCEPTION = re.compile(
    r"^(?:\([\w:\-]+ pid=\d+\) ERROR [^\]]*\] )?(?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*"
    r"(?:Error|Exception|Exit|Interrupt|Exited)\b(?::|$)"
)
_WRAPPERS = re.compile(r"EngineDeadError|Engine core initialization failed")
# vLLM's SIGTERM/SIGINT handler (vllm/entrypoints/launchers/launcher.py).
_SHUTDOWN = re.compile(r"\[shutdown\] API server: shutdown triggered")

# Causes for which vsup itself ended the process.
CAUSES = (R.STOPPED, R.STARTUP_TIMEOUT, R.UNHEALTHY, R.ENGINE_DEAD, R.STALLED)


@dataclass(frozen=True)
class Classified:
    reason: ExitReason
    excerpt: str | None


def signal_name(signum: int | None) -> str | None:
    """`9` -> `"SIGKILL"`; None stays None."""
    if signum is None:
        return None
    try:
        return _signal.Signals(signum).name
    except ValueError:
        return f"SIG{signum}"


def classify(
    code: int | None,
    signum: int | None,
    log_tail: str,
    *,
    model: str | None = None,
    cause: str | None = None,
    starting: bool = False,
) -> Classified:
    """The exit reason and the decisive log line(s).

    `code` is the exit status when the process exited by itself, `signum` the signal that ended
    it (both None when unknown, e.g. for an adopted process); `cause` is why vsup ended it, if
    it did (one of CAUSES); `starting`: the run never became ready (a GPU out-of-memory then
    is a start-up refusal, `gpu_memory_insufficient`, not `oom`).
    """
    if cause is not None and cause not in CAUSES:
        raise ValueError(f"unknown cause {cause!r}")
    if cause == R.STOPPED:
        return Classified(R.STOPPED, None)
    lines = [line.rstrip() for line in log_tail.splitlines()]
    shutdown_at = next((i for i, line in enumerate(lines) if _SHUTDOWN.search(line)), None)
    found = _decisive(lines, model, shutdown_at)
    if found is not None:
        if starting and found.reason == R.OOM and _GPU_OOM.search(found.excerpt or ""):
            return Classified(GPU_MEMORY_INSUFFICIENT, found.excerpt)
        return found
    if cause is not None:
        return Classified(ExitReason(cause), _last_exception(lines))
    if signum is not None:
        return Classified(R.KILLED, None)
    if shutdown_at is not None:
        return Classified(R.KILLED, _clip(lines[shutdown_at].strip()))
    if code == 2:
        return Classified(R.BAD_ARGS, _last_exception(lines))
    return Classified(R.UNKNOWN, _last_exception(lines))


def after_rank_death(found: Classified, rank_died: str) -> Classified:
    """The end of a run in which a data-parallel rank's engine died first (`rank_died` says
    which, as vsup saw it): never a clean exit. vLLM's server ends by itself once a rank is
    gone, and a headless one (a span's follower) exits with status 0 whatever killed the rank:
    seen on an H100 with vLLM 0.26, a follower whose head had restarted gave up on it after 5
    minutes ("RuntimeError: Did not receive response from front-end process within 5
    minutes"), exited 0, and read as clean, so it was never restarted and the unit stayed
    down. What no rule names is the engine's death (`engine_dead`); with nothing in the log
    (vsup ended it before vLLM said why), the excerpt is what vsup saw."""
    reason = R.ENGINE_DEAD if found.reason == R.UNKNOWN else found.reason
    return Classified(reason, found.excerpt or rank_died)


def _decisive(lines: list[str], model: str | None, shutdown_at: int | None) -> Classified | None:
    missing_model = _missing_model_rule(model)
    for reason, rule in _RULES:
        last = len(lines) if reason != R.ENGINE_DEAD or shutdown_at is None else shutdown_at
        for i in range(last - 1, -1, -1):
            line = lines[i]
            if not line or _QUIET_LEVEL.match(line):
                continue
            if rule.search(line) or (
                reason == R.MODEL_NOT_FOUND and missing_model and missing_model.search(line)
            ):
                excerpt = _clip(line.strip())
                if reason == R.ENGINE_DEAD and _WRAPPERS.search(line):
                    root = _root_cause(lines, i)
                    if root:
                        excerpt = _clip(root) + "\n" + excerpt
                return Classified(reason, excerpt)
    return None


def _missing_model_rule(model: str | None) -> re.Pattern[str] | None:
    if not model:
        return None
    return re.compile(r"No such file or directory[^\n]*" + re.escape(model))


def _root_cause(lines: list[str], before: int) -> str | None:
    for j in range(before - 1, -1, -1):
        line = lines[j]
        if _EXCEPTION.match(line) and not _WRAPPERS.search(line):
            return line.strip()
    return None


def _last_exception(lines: list[str]) -> str | None:
    for line in reversed(lines):
        if _EXCEPTION.match(line):
            return _clip(line.strip())
    return None


def _clip(text: str) -> str:
    return text if len(text) <= EXCERPT_MAX else text[: EXCERPT_MAX - 3] + "..."
