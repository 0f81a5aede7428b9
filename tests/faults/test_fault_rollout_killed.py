"""A daemon SIGKILLed in the middle of a rolling apply (issue 31, item 5). Four instances,
`max_unavailable = 1`, the daemon killed in wave 2: the next daemon must not show 4/4 ready
and no rollout while instances still run the old spec. It reports the rollout `interrupted`
with which instance runs which spec (`outdated`), `vsup status` says so, `vsup save` names what
still runs an older spec than the file it writes, and `vsup up` of the layout restarts exactly
those. The processes' own command lines are the proof of what runs."""

from __future__ import annotations

import psutil
import pytest

from tests.conftest import daemon_status
from tests.faults.helpers import daemons_of, status, vsup, wait_for
from tests.unit.control.helpers import emulator_layout, free_port

pytestmark = pytest.mark.timeout(240)

NAMES = ("a", "b", "c", "d")


def layout(ports: dict[str, int], say: str) -> str:
    # the emulator always reports a request running: each drain lasts drain_timeout_s
    return emulator_layout(
        ports,
        extra_header="max_unavailable = 1\ndrain_timeout_s = 1.5",
        args=f'args = {{ say = "{say}" }}',
    )


def says(pid: int) -> str:
    """What the running process was started with (`--say X`): the spec it really runs."""
    argv = psutil.Process(pid).cmdline()
    return argv[argv.index("--say") + 1]


def test_a_daemon_killed_in_wave_2_leaves_a_rollout_reported_and_resumable(fault_home, tmp_path):
    home = fault_home
    ports = {n: free_port() for n in NAMES}
    v1, v2 = tmp_path / "v1.toml", tmp_path / "v2.toml"
    v1.write_text(layout(ports, "v1"))
    v2.write_text(layout(ports, "v2"))
    up = vsup(home, "up", str(v1), "--detach", "--wait", "--timeout", "90")
    assert up.returncode == 0, up.stdout + up.stderr
    go = vsup(home, "up", str(v2), "--detach", "--yes")
    assert go.returncode == 0, go.stdout + go.stderr

    def in_wave_2():
        # in this process (a `vsup status --json` subprocess can take seconds on a loaded
        # machine, longer than wave 2's ~3 s)
        r = daemon_status(home)["rollout"]
        return r and r["state"] == "running" and r["wave"] == 2 and r

    wait_for(in_wave_2, 90, "the rollout's wave 2", interval=0.05)
    (daemon,) = daemons_of(home)
    daemon.kill()  # SIGKILL: no goodbye write of anything
    daemon.wait(10)
    # read-only commands never start a daemon (issue 25): the operator starts the new one
    assert vsup(home, "daemon", "--detach").returncode == 0

    # a new daemon re-adopts the instances (b, when it was caught between its stop and its
    # start, is started again: it is ready soon)
    doc = wait_for(
        lambda: (d := status(home)) and all(i["state"] == "ready" for i in d["instances"]) and d,
        60,
        "every instance ready under the new daemon",
    )
    insts = {i["name"]: i for i in doc["instances"]}
    running = {n: says(insts[n]["pid"]) for n in NAMES}
    assert running["a"] == "v2" and running["c"] == running["d"] == "v1", running
    rollout = doc["rollout"]
    assert rollout is not None, "the interrupted rollout is gone: the layout looks applied"
    assert rollout["state"] == "interrupted" and rollout["wave"] == 2
    old = [n for n in NAMES if running[n] == "v1"]
    assert rollout["old_config"] == old
    for name in NAMES:
        assert insts[name]["outdated"] is (running[name] == "v1"), (name, insts[name])
    assert "args" in insts["c"]["outdated_fields"]

    text = vsup(home, "status").stdout
    assert "ROLLOUT INTERRUPTED at wave 2/4" in text and ", ".join(old) in text
    assert "c: runs an older spec than the layout (args differ)" in text

    saved = tmp_path / "saved.toml"
    res = vsup(home, "save", str(saved))
    assert res.returncode == 0, res.stderr
    assert 'say = "v2"' in saved.read_text()
    assert f"{', '.join(old)} still run(s) an older spec than this layout" in res.stderr

    again = vsup(home, "up", str(v2), "--detach", "--yes", "--wait", "--timeout", "120")
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"restart (changed, rolling): {', '.join(old)}" in again.stdout
    doc = status(home)
    assert doc["rollout"]["state"] == "done" and doc["rollout"]["names"] == old
    assert not any(i["outdated"] for i in doc["instances"])
    assert {n: says(i["pid"]) for n, i in ((i["name"], i) for i in doc["instances"])} == {
        n: "v2" for n in NAMES
    }
    res = vsup(home, "save", str(saved))
    assert res.returncode == 0 and "older spec" not in res.stderr
