"""The exit status of every `vsup` command, and the one map from errors to it.

- 0 `OK`: done (`vsup validate`: valid; warnings may be printed).
- 1 `FAILED`: an operation failed: an instance failed or is not ready (`vsup status`), a
  rollout failed, `--wait` ran out of time, no daemon answers, the daemon refused for what is
  going on now (409: it is shutting down, no layout runs), an internal error.
- 2 `BAD_INPUT`: the input is wrong: usage, a layout that does not validate, an unknown
  instance, a file vsup will not read or write, a VSUP_HOME it will not use, a request the
  daemon refused as malformed (400, 404, 413, 422).
- 3 `NOT_CONFIRMED`: a change that stops or restarts serving instances was not confirmed (no
  terminal and no `--yes`, or the answer was no); nothing was changed.
- 4 `NO_DAEMON`: a read-only command (`status`, `logs`, `events`, `save`, `tui --readonly`)
  found no daemon for this VSUP_HOME; such commands never start one (`control.client.NoDaemon`).
- 130 `INTERRUPTED`: Ctrl-C. 141 `BROKEN_PIPE`: the reader of the output went away
  (`vsup status | head`).

`cli.main` (errors no command handled) and `cliutil.run_command` (each command's own) both
take the status from `known_error`, so an error ends every command the same way. This module
imports nothing heavy: `cli.main` uses it for every command.
"""

from __future__ import annotations

OK = 0
FAILED = 1
BAD_INPUT = 2
NOT_CONFIRMED = 3
NO_DAEMON = 4
INTERRUPTED = 130
BROKEN_PIPE = 141

# Refusals of the daemon that say the request itself was wrong (the rest are FAILED).
BAD_INPUT_STATUSES = frozenset({400, 404, 413, 422})


class CommandFailed(Exception):
    """Ends a command with a message on stderr (said as it is) and an exit status."""

    def __init__(self, message: str, code: int = FAILED) -> None:
        super().__init__(message)
        self.code = code


def status_for_refusal(http_status: int) -> int:
    """The exit status of a daemon's refusal with this HTTP status."""
    return BAD_INPUT if http_status in BAD_INPUT_STATUSES else FAILED


def known_error(exc: BaseException) -> tuple[int, str] | None:
    """(exit status, the line to print) for an error vsup means to report; None for anything
    else (an internal error: status FAILED, the traceback kept for a bug report)."""
    from vsup.control.errors import ControlError, DaemonUnavailable
    from vsup.fsutil import UnsafeTarget
    from vsup.paths import HomeError

    if isinstance(exc, CommandFailed):
        return exc.code, str(exc)
    if isinstance(exc, ControlError):
        return status_for_refusal(exc.status), f"vsup: {one_line(exc.message)}"
    if isinstance(exc, DaemonUnavailable):
        from vsup.control.client import NoDaemon

        code = NO_DAEMON if isinstance(exc, NoDaemon) else FAILED
        return code, f"vsup: {one_line(str(exc))}"
    if isinstance(exc, (HomeError, UnsafeTarget)):
        return BAD_INPUT, f"vsup: {one_line(str(exc))}"
    if isinstance(exc, TimeoutError):  # the control client's read of a daemon that is slow
        why = one_line(str(exc)) if str(exc) else "timed out"
        return FAILED, (
            f"vsup: the vsup daemon did not answer in time ({why}); it may be busy: try again, "
            "or read $VSUP_HOME/daemon.log"
        )
    return None


def one_line(text: str) -> str:
    """`text` on one line (a message that spans lines is joined with ' | ')."""
    return " | ".join(part.strip() for part in text.splitlines() if part.strip()) or "(no message)"
