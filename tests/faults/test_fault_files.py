"""`vsup save` writes regular files only, and VSUP_HOME never re-permissions a directory that
vsup did not create."""

from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path

import pytest

from tests.faults.helpers import cleanup, vsup
from tests.unit.control.helpers import emulator_layout, free_port

pytestmark = pytest.mark.timeout(120)


def test_save_refuses_fifos_devices_and_directories_follows_symlinks_and_asks_for_parents(
    fault_home, tmp_path
):
    home = fault_home
    layout = tmp_path / "a.toml"
    layout.write_text(emulator_layout({"a": free_port()}))
    assert vsup(home, "up", str(layout), "--detach").returncode == 0

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    directory = tmp_path / "dir"
    directory.mkdir()
    targets = [fifo, directory]
    if os.geteuid() == 0:
        device = tmp_path / "null"  # a character device like /dev/null (1, 3)
        os.mknod(device, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        targets.append(device)
    for target in targets:
        before = os.lstat(target)
        res = vsup(home, "save", str(target))
        assert res.returncode == 2, res.stdout
        assert res.stderr.count("\n") == 1 and "not a regular file" in res.stderr, res.stderr
        after = os.lstat(target)
        assert (after.st_ino, after.st_mode) == (before.st_ino, before.st_mode)

    # A symlink: its target gets the layout (atomically), the link stays a link.
    real = tmp_path / "real.toml"
    real.write_text("# old\n")
    link = tmp_path / "link.toml"
    link.symlink_to(real)
    res = vsup(home, "save", str(link))
    assert res.returncode == 0, res.stderr
    assert f"saved the running layout to {real} (through the symlink {link})" in res.stdout
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert "[[instance]]" in real.read_text()

    # A missing directory is not created unless asked.
    nested = tmp_path / "new" / "deeper" / "saved.toml"
    res = vsup(home, "save", str(nested))
    assert res.returncode == 2 and "--parents" in res.stderr
    assert not nested.parent.exists()
    res = vsup(home, "save", str(nested), "--parents")
    assert res.returncode == 0 and nested.is_file(), res.stderr
    assert vsup(home, "validate", str(nested)).returncode == 0


def test_a_shared_vsup_home_gets_a_private_directory_inside_and_keeps_its_mode(monkeypatch):
    shared = Path(tempfile.mkdtemp(prefix="vsup-shared-", dir="/tmp"))
    os.chmod(shared, 0o1777)  # like /tmp
    private = shared / f"vsup-{os.getuid()}"
    try:
        assert vsup(shared, "daemon", "--detach").returncode == 0
        res = vsup(shared, "status", "--json")
        assert res.returncode == 0, res.stderr
        doc = json.loads(res.stdout)
        assert doc["supervisor"]["home"] == str(private)
        assert stat.S_IMODE(os.stat(shared).st_mode) == 0o1777
        assert stat.S_IMODE(os.stat(private).st_mode) == 0o700
        assert (private / "vsup.sock").exists() and not (shared / "vsup.sock").exists()

        # Something not vsup's in the private directory's place is refused, not taken over.
        other = Path(tempfile.mkdtemp(prefix="vsup-shared-", dir="/tmp"))
        os.chmod(other, 0o1777)
        (other / f"vsup-{os.getuid()}").symlink_to(shared)
        try:
            res = vsup(other, "status")
            assert res.returncode != 0
            assert res.stderr.count("\n") == 1 and "not a directory of user" in res.stderr
            assert "Traceback" not in res.stderr
        finally:
            (other / f"vsup-{os.getuid()}").unlink()
            other.rmdir()
    finally:
        cleanup(private)
        import shutil

        shutil.rmtree(shared, ignore_errors=True)
