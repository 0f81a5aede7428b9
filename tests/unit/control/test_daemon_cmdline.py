"""Which command lines are a vsup daemon's: the lock holder check during an upgrade."""

from __future__ import annotations

import pytest

from vsup.control.lock import is_daemon_cmdline


@pytest.mark.parametrize(
    "cmd",
    [
        ["/venv/bin/python3", "-m", "vsup", "daemon"],
        # vsup 0.1, whose import package was `supervisor`: still running during an upgrade
        ["/venv/bin/python3", "-m", "supervisor", "daemon"],
        ["/venv/bin/vsup", "daemon"],
        ["vsup", "daemon"],
    ],
)
def test_daemon_command_lines_of_this_and_the_previous_release(cmd):
    assert is_daemon_cmdline(cmd)


@pytest.mark.parametrize(
    "cmd",
    [
        ["/venv/bin/python3", "-m", "vsup", "status"],
        # supervisord's own daemon is not ours
        ["/usr/bin/python3", "/usr/bin/supervisord", "-n"],
        ["/usr/bin/python3", "-m", "supervisor.supervisord"],
        ["/usr/bin/python3", "-m", "vllm.entrypoints.openai.api_server", "daemon"],
        ["sshd", "daemon"],
        [],
    ],
)
def test_other_command_lines_are_not_a_daemon(cmd):
    assert not is_daemon_cmdline(cmd)
