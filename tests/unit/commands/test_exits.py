"""One map from errors to exit statuses (`vsup.commands.exits`): a command's own handler
(`cliutil.run_command`) and the CLI's last resort (`cli.report_error`) end every error alike,
and the statuses are the ones README.md and docs/ARCHITECTURE.md document."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from vsup import cli
from vsup.commands import exits
from vsup.commands.cliutil import CommandFailed, run_command
from vsup.control.client import NoDaemon
from vsup.control.errors import Conflict, ControlError, DaemonUnavailable, UnknownInstances
from vsup.fsutil import UnsafeTarget
from vsup.paths import HomeError

REPO = Path(__file__).resolve().parents[3]

CASES = [
    (CommandFailed("vsup up: not confirmed; nothing was changed", 3), 3),
    (CommandFailed("vsup x: bad", 2), 2),
    (ControlError("bad body", status=400), 2),
    (UnknownInstances(["nope"], ["a"]), 2),
    (ControlError("too large", status=413), 2),
    (ControlError("does not validate", status=422), 2),
    (Conflict("the daemon is shutting down"), 1),
    (ControlError("no layout is running", status=409), 1),
    (ControlError("server error", status=500), 1),
    (DaemonUnavailable("no daemon answers on /x/vsup.sock"), 1),
    (NoDaemon(Path("/nonexistent/vsup-home")), 4),
    (HomeError("VSUP_HOME /x is not yours"), 2),
    (UnsafeTarget("/dev/null is a device"), 2),
]


@pytest.mark.parametrize(("exc", "code"), CASES, ids=lambda v: type(v).__name__)
def test_a_command_and_the_cli_end_an_error_alike(exc, code, capsys):
    def failing(_args: argparse.Namespace) -> int:
        raise exc

    assert run_command(failing, argparse.Namespace()) == code
    by_command = capsys.readouterr().err
    assert cli.report_error(exc) == code
    by_cli = capsys.readouterr().err
    assert by_command == by_cli and len(by_cli.strip().splitlines()) == 1, (by_command, by_cli)


def test_an_unexpected_error_is_left_to_the_cli(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("VSUP_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("VSUP_DEBUG", raising=False)

    def broken(_args: argparse.Namespace) -> int:
        raise KeyError("bug")

    with pytest.raises(KeyError):
        run_command(broken, argparse.Namespace())
    assert cli.report_error(KeyError("bug")) == exits.FAILED
    assert "internal error: KeyError" in capsys.readouterr().err


def test_a_multi_line_refusal_is_one_line():
    known = exits.known_error(ControlError("first\n  second\n", status=422))
    assert known is not None
    code, line = known
    assert code == 2 and line == "vsup: first | second"


def test_the_documented_statuses_are_the_map():
    statuses = {
        exits.OK: 0,
        exits.FAILED: 1,
        exits.BAD_INPUT: 2,
        exits.NOT_CONFIRMED: 3,
        exits.NO_DAEMON: 4,
        exits.INTERRUPTED: 130,
        exits.BROKEN_PIPE: 141,
    }
    assert all(k == v for k, v in statuses.items())
    for doc in (REPO / "README.md", REPO / "docs" / "ARCHITECTURE.md"):
        text = doc.read_text()
        section = text[text.index("Exit status") :]
        for code in statuses.values():
            assert re.search(rf"\b{code}\b", section[:3000]), (doc, code)


def test_a_daemon_that_does_not_answer_in_time_is_said_in_words(tmp_path):
    """The control client's read past its timeout (a real socket that accepts and never
    answers): exit FAILED with a line that says so, not an internal error."""
    import socket

    from vsup.control.client import JsonClient

    path = tmp_path / "vsup.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(path))
        listener.listen()
        with pytest.raises(TimeoutError) as caught:
            JsonClient(socket=path, timeout=0.2).status()
    known = exits.known_error(caught.value)
    assert known is not None
    code, line = known
    assert code == exits.FAILED
    assert line.startswith("vsup: the vsup daemon did not answer in time")
