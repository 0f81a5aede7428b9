"""Both state files corrupt under a killed daemon: the next daemon takes the running layout back
from the journal (each apply carries the layout's text and path), so `vsup save` works and the
Prometheus listener comes back, and the instance is re-adopted, not started twice."""

from __future__ import annotations

import httpx
import pytest

from tests.faults.helpers import daemons_of, instance, status, vsup, wait_for
from tests.unit.control.helpers import emulator_layout, free_port

pytestmark = pytest.mark.timeout(120)


def test_the_layout_survives_both_state_files_going_bad(fault_home, tmp_path):
    home = fault_home
    metrics_port = free_port()
    layout = tmp_path / "kept.toml"
    layout.write_text(
        emulator_layout(
            {"a": free_port()}, extra_header=f'metrics_listen = "127.0.0.1:{metrics_port}"'
        )
    )
    assert vsup(home, "up", str(layout), "--detach", "--wait", "--timeout", "60").returncode == 0
    pid_a = instance(home, "a")["pid"]
    assert httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).status_code == 200

    (daemon,) = daemons_of(home)
    daemon.kill()  # no goodbye write of the state file
    daemon.wait(10)
    for name in ("state.json", "state.json.bak"):
        (home / name).write_bytes(b'{"version": 1, "instances": {"a": ')

    assert vsup(home, "daemon", "--detach").returncode == 0
    doc = status(home)
    assert doc["supervisor"]["layout"] == "fakes"
    assert [(i["name"], i["pid"]) for i in doc["instances"]] == [("a", pid_a)]
    assert any(a["kind"] == "state_file" for a in doc["advice"])

    saved = tmp_path / "saved.toml"
    res = vsup(home, "save", str(saved))
    assert res.returncode == 0, res.stderr
    assert f'metrics_listen = "127.0.0.1:{metrics_port}"' in saved.read_text()
    wait_for(lambda: metrics_up(metrics_port), 20, "the Prometheus listener to come back")


def metrics_up(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False
