"""The `vsup` command line (the contract: docs/commands.md and docs/ARCHITECTURE.md).

Each command lives in its own module under `supervisor/vsup/commands/` with two functions:
`register(subparsers)` adds its parser (cheap: no heavy imports at module level) and
`run(args) -> int` does the work. Exit statuses (one map for every command:
`vsup.commands.exits`): 0 done, 1 a failed operation (or `vsup status`: not all ready), 2 bad
input (usage, an invalid layout, an unknown instance), 3 not confirmed, 130 interrupted.

Every error reaches the terminal as one line, never a traceback: vsup's own errors (a bad
VSUP_HOME, a refusal of the daemon, an unsafe file) as their message, anything unexpected as
`vsup: internal error: ...` with the traceback written to a file it names (`VSUP_DEBUG=1`
lets it through instead, for a developer).
"""

from __future__ import annotations

import sys

from vsup import __version__
from vsup.commands.exits import BAD_INPUT, BROKEN_PIPE, INTERRUPTED, one_line

# Not `typing.TYPE_CHECKING`: `vsup --version` imports nothing it does not use (typing is
# ~5 ms); type checkers read this name the same way.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse

# command name -> the module that registers it; order is the order of `vsup --help`. A
# command's module is imported only when that command runs (or for `--help`, an unknown
# command, a bare `vsup`): `vsup status` and `vsup --version` do not pay for the others'
# imports. tests/unit/test_cli_imports.py checks that each module registers exactly its names.
COMMANDS: dict[str, str] = {
    "plan": "vsup.commands.plan",
    "validate": "vsup.commands.validate",
    "pull": "vsup.commands.pull",
    "up": "vsup.commands.up",
    "tui": "vsup.commands.tui",
    "status": "vsup.commands.status",
    "start": "vsup.commands.lifecycle",
    "stop": "vsup.commands.lifecycle",
    "restart": "vsup.commands.lifecycle",
    "drain": "vsup.commands.lifecycle",
    "sleep": "vsup.commands.sleep",
    "wake": "vsup.commands.sleep",
    "swap": "vsup.commands.sleep",
    "logs": "vsup.commands.logs",
    "events": "vsup.commands.events",
    "save": "vsup.commands.save",
    "rollout": "vsup.commands.rollout",
    "rollback": "vsup.commands.rollback",
    "probe": "vsup.commands.probe",
    "down": "vsup.commands.down",
    "bench": "vsup.commands.bench",
    "tune": "vsup.commands.tune",
    "fleet": "vsup.commands.fleet",
    "paths": "vsup.commands.paths",
    "daemon": "vsup.commands.daemon",
    "service": "vsup.commands.service",
}
COMMAND_MODULES = tuple(dict.fromkeys(COMMANDS.values()))


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of `vsup`: with `command` (one of COMMANDS), only that command's module is
    imported and registered; without, every command (`vsup --help` lists them all)."""
    import argparse
    import importlib

    parser = argparse.ArgumentParser(
        prog="vsup",
        description="vLLM node supervisor: launch, watch and restart many vLLM servers.",
    )
    parser.add_argument("--version", action="version", version=f"vsup {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    modules = (COMMANDS[command],) if command in COMMANDS else COMMAND_MODULES
    for name in modules:
        # A module that fails to import is a broken install or rename: it must show, not
        # quietly remove its command.
        importlib.import_module(name).register(sub)
    return parser


def wanted_command(argv: list[str]) -> str | None:
    """The command `argv` names, when it is one of COMMANDS and nothing before it needs the
    whole parser; None otherwise (build every command: help, an unknown command, an error)."""
    if not argv or argv[0].startswith("-"):
        return None
    return argv[0] if argv[0] in COMMANDS else None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv == ["--version"]:
            # no parser at all: argparse's own import and set-up are most of what is left
            print(f"vsup {__version__}")
            return 0
        if not argv or argv[0] in ("--readonly",):
            # bare `vsup` attaches the dashboard
            argv = ["tui", *argv]
        parser = build_parser(wanted_command(argv))
        args = parser.parse_args(argv)
        if not getattr(args, "func", None):
            parser.print_help()
            return BAD_INPUT
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return INTERRUPTED
    except BrokenPipeError:
        # `vsup status | head`: the reader left; say nothing more, as a pipe tool should.
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return BROKEN_PIPE
    except Exception as exc:
        return report_error(exc)


def report_error(exc: BaseException) -> int:
    """One line on stderr for an error no command handled; its exit status (`exits`)."""
    import os

    from vsup.commands.exits import FAILED, known_error

    known = known_error(exc)
    if known is not None:
        code, message = known
        if message:
            print(message, file=sys.stderr)
        return code
    if os.environ.get("VSUP_DEBUG"):
        raise exc
    where = _write_traceback(exc)
    hint = f" (traceback in {where})" if where else ""
    print(
        f"vsup: internal error: {type(exc).__name__}: {one_line(str(exc))}{hint}", file=sys.stderr
    )
    return FAILED


def _write_traceback(exc: BaseException) -> str | None:
    """Append the traceback to a file a person can send with a report; its path, or None."""
    import tempfile
    import time
    import traceback

    text = "".join(traceback.format_exception(exc))
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    try:
        from vsup import paths

        path = paths.vsup_home() / "cli-errors.log"
    except Exception:
        path = None
    for candidate in (path, None):
        try:
            if candidate is None:
                fd, name = tempfile.mkstemp(prefix="vsup-error-", suffix=".log")
                with open(fd, "w") as fh:
                    fh.write(f"{stamp} {sys.argv!r}\n{text}")
                return name
            with open(candidate, "a") as fh:
                fh.write(f"{stamp} {sys.argv!r}\n{text}")
            return str(candidate)
        except OSError:
            continue
    return None
