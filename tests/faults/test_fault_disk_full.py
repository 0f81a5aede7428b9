"""A full disk under VSUP_HOME: supervision goes on, the failed writes are an alert and are
retried, the journal stays readable record by record, and no command claims what it did not do."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from tests.faults.helpers import alive, instance, status, vsup, wait_for
from tests.unit.control.helpers import emulator_layout, free_port

pytestmark = pytest.mark.timeout(240)


def fill(home) -> Path:
    """Fill the file system of `home` to the last byte; the filler's path."""
    filler = home / "filler"
    with open(filler, "wb", buffering=0) as fh:
        chunk = b"\0" * 65536
        while True:
            try:
                fh.write(chunk)
            except OSError:
                if len(chunk) == 1:
                    break
                chunk = chunk[: len(chunk) // 2]
    return filler


def test_a_full_disk_is_an_alert_while_a_killed_instance_still_restarts(tmpfs_home, tmp_path):
    home = tmpfs_home
    layout = tmp_path / "b.toml"
    # Restarted at once, and not given up on after the few kills below.
    layout.write_text(
        emulator_layout({"b": free_port()}).replace("max_failures = 3", "max_failures = 50")
    )
    up = vsup(home, "up", str(layout), "--detach", "--wait", "--timeout", "60")
    assert up.returncode == 0, up.stderr
    first = instance(home, "b")
    assert first["state"] == "ready"

    filler = fill(home)
    # tmpfs hands out whole pages: the journal's last page still takes a few records, and each
    # state write frees the old backup's page first. Kill b until the journal crosses into a
    # page the disk no longer has; every kill must end in a restart all the same.
    pid, advice = first["pid"], []
    for _ in range(8):
        os.kill(pid, signal.SIGKILL)
        back = wait_for(
            lambda old=pid: (
                (i := instance(home, "b"))["state"] == "ready" and i["pid"] != old and i
            ),
            60,
            "b to be restarted on the full disk",
        )
        assert alive(back["pid"])
        pid = back["pid"]
        advice = [
            a for a in status(home)["advice"] if a["kind"] in ("journal_write", "state_write")
        ]
        if advice:
            break
    assert advice, "no write alert in status although the disk is full"
    assert any("retried" in a["message"] and str(home) in a["message"] for a in advice)
    assert instance(home, "b")["restarts"] >= 1

    # A restart asked for by hand on the full disk: the command says only what it knows.
    res = vsup(home, "restart", "b")
    assert res.returncode == 0, res.stderr
    assert "b: restart requested" in res.stdout and "restarted" not in res.stdout
    waited = vsup(home, "restart", "b", "--wait", "--timeout", "60")
    assert waited.returncode == 0 and "b: ready" in waited.stdout, waited.stderr

    # Space comes back: the alerts clear, the events kept in memory reach the journal, and
    # every line of it is one whole record, in order.
    filler.unlink()
    wait_for(
        lambda: not [a for a in status(home)["advice"] if a["kind"].endswith("_write")],
        30,
        "the write alerts to clear",
    )
    lines = (home / "journal.jsonl").read_bytes().splitlines()
    events = []
    for raw in lines:
        try:
            events.append(json.loads(raw))
        except ValueError:
            # A torn fragment of a write the disk cut short: alone on its line, never joined
            # to the start of another record.
            assert raw.find(b'{"seq":', 1) == -1, f"a torn line swallowed a record: {raw!r}"
    seqs = [e["seq"] for e in events]
    assert seqs == list(range(1, len(seqs) + 1)), "events missing or out of order"
    kinds = [(e["kind"], e.get("instance")) for e in events]
    # The exit of the SIGKILL and the respawns made while the disk was full are all there.
    assert ("exit", "b") in kinds and kinds.count(("spawn", "b")) >= 4
    state = json.loads((home / "state.json").read_text())
    assert state["instances"]["b"]["pid"] == instance(home, "b")["pid"]
