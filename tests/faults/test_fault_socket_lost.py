"""The control socket file deleted or replaced under a live daemon: the daemon binds it again
within seconds, and a client meanwhile waits briefly for it instead of starting a second daemon
or hanging for half a minute."""

from __future__ import annotations

import json
import os
import socket

import pytest

from tests.conftest import until
from tests.faults.helpers import daemons_of, instance, vsup
from tests.unit.control.helpers import emulator_layout, free_port

pytestmark = pytest.mark.timeout(300)


def test_a_deleted_socket_is_bound_again_and_status_answers_within_seconds(fault_home, tmp_path):
    """The daemon binds the socket again (the journal's `socket_rebound`, deleted and then
    replaced) and status answers from that same daemon, never a second one."""
    home = fault_home
    layout = tmp_path / "a.toml"
    layout.write_text(emulator_layout({"a": free_port()}))
    assert vsup(home, "up", str(layout), "--detach", "--wait", "--timeout", "60").returncode == 0
    (daemon,) = daemons_of(home)
    pid_a = instance(home, "a")["pid"]

    # With the socket file gone, a client waits only REBIND_WAIT_S (8 s) for the live daemon to
    # bind it again, then gives up with an error: an answer at all is the "within seconds",
    # measured by vsup's own client, not by this test.
    (home / "vsup.sock").unlink()
    res = vsup(home, "status", "--json", timeout=60)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    # The same daemon answers (no second one was started), with the same instance.
    assert doc["supervisor"]["pid"] == daemon.pid and daemons_of(home) == [daemon]
    assert doc["instances"][0]["pid"] == pid_a

    # Replaced by another socket file (bound by someone else, nobody listening): bound again.
    (home / "vsup.sock").unlink()
    stranger = socket.socket(socket.AF_UNIX)
    stranger.bind(str(home / "vsup.sock"))
    try:
        res = until(
            lambda: (r := vsup(home, "status", "--json", timeout=60)).returncode == 0 and r,
            timeout=90,
            what="status through the socket bound again after a stranger's replaced it",
        )
        assert json.loads(res.stdout)["supervisor"]["pid"] == daemon.pid
        assert daemons_of(home) == [daemon]
    finally:
        stranger.close()
    events = [json.loads(x) for x in (home / "journal.jsonl").read_text().splitlines()]
    rebound = [e["was"] for e in events if e["kind"] == "socket_rebound"]
    assert rebound == ["gone", "replaced"]
    assert os.stat(home / "vsup.sock").st_mode & 0o777 == 0o600
