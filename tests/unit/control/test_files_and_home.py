"""The package's one atomic writer, the output-file checks of `vsup save`, and VSUP_HOME's
private-directory rule."""

from __future__ import annotations

import os
import stat

import pytest

from vsup import paths
from vsup.fsutil import UnsafeTarget, regular_target, write_atomic


def test_write_atomic_keeps_the_mode_and_leaves_no_temp_file(tmp_path):
    path = tmp_path / "f.toml"
    path.write_text("old")
    os.chmod(path, 0o640)
    write_atomic(path, "new")
    assert path.read_text() == "new" and stat.S_IMODE(os.stat(path).st_mode) == 0o640
    write_atomic(tmp_path / "state.json", b"{}", mode=0o600)
    assert stat.S_IMODE(os.stat(tmp_path / "state.json").st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.toml", "state.json"]


def test_write_atomic_never_creates_directories(tmp_path):
    with pytest.raises(FileNotFoundError):
        write_atomic(tmp_path / "missing" / "f.toml", "x")
    assert not (tmp_path / "missing").exists()


def test_regular_target_follows_symlinks_and_refuses_what_is_not_a_file(tmp_path):
    real = tmp_path / "real.toml"
    real.write_text("x")
    (tmp_path / "link.toml").symlink_to(real)
    assert regular_target(tmp_path / "link.toml") == real
    assert regular_target(tmp_path / "new.toml") == tmp_path / "new.toml"
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(UnsafeTarget, match="a FIFO"):
        regular_target(tmp_path / "fifo")
    with pytest.raises(UnsafeTarget, match="a directory"):
        regular_target(tmp_path)
    with pytest.raises(UnsafeTarget, match="--parents"):
        regular_target(tmp_path / "a" / "b.toml")
    assert regular_target(tmp_path / "a" / "b.toml", parents=True) == tmp_path / "a" / "b.toml"


def test_home_is_created_private_or_used_as_found_when_it_is_the_users_own(tmp_path):
    made = paths.private_home(tmp_path / "x" / "home")
    assert made == tmp_path / "x" / "home" and stat.S_IMODE(os.stat(made).st_mode) == 0o700
    own = tmp_path / "own"
    own.mkdir(mode=0o755)
    os.chmod(own, 0o755)
    assert paths.private_home(own) == own and stat.S_IMODE(os.stat(own).st_mode) == 0o755


def test_a_shared_home_gets_vsup_uid_inside_and_is_not_chmodded(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    home = paths.private_home(shared)
    assert home == shared / f"vsup-{os.getuid()}"
    assert stat.S_IMODE(os.stat(shared).st_mode) == 0o1777
    assert stat.S_IMODE(os.stat(home).st_mode) == 0o700
    os.chmod(home, 0o777)
    with pytest.raises(paths.HomeError, match="writable by other users"):
        paths.private_home(shared)
    (tmp_path / "file").write_text("")
    with pytest.raises(paths.HomeError, match="not a directory"):
        paths.private_home(tmp_path / "file")


def test_regular_target_refuses_vsup_home_and_anything_that_resolves_into_it(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "journal.jsonl").write_text("")
    (tmp_path / "link.toml").symlink_to(home / "journal.jsonl")
    (tmp_path / "homelink").symlink_to(home)
    for target in (
        home / "journal.jsonl",
        home / "new.toml",
        home,
        tmp_path / "link.toml",
        tmp_path / "homelink" / "x.toml",
    ):
        with pytest.raises(UnsafeTarget, match="is inside VSUP_HOME"):
            regular_target(target, not_inside=tmp_path / "homelink")
    # a neighbour whose name starts like the home's is not inside it
    assert regular_target(tmp_path / "home2.toml", not_inside=home) == tmp_path / "home2.toml"


def test_the_daemon_lock_holds_when_its_file_is_replaced(tmp_path):
    import subprocess
    import sys

    from vsup.control.lock import acquire_lock, daemon_lock_holder

    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; "
         "from vsup.control.lock import acquire_lock; "
         "assert acquire_lock(Path(sys.argv[1])) is not None; print('held', flush=True); "
         "time.sleep(60)", str(tmp_path)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        assert daemon_lock_holder(tmp_path) == holder.pid
        fresh = tmp_path / "x"
        fresh.write_text("")
        os.replace(fresh, tmp_path / "daemon.lock")
        assert daemon_lock_holder(tmp_path) == -1  # held; the new file names nobody
        assert acquire_lock(tmp_path, retry_s=0.3) is None
        (tmp_path / "daemon.lock").unlink()
        assert acquire_lock(tmp_path, retry_s=0.3) is None
    finally:
        holder.kill()
        holder.wait()
    fd = acquire_lock(tmp_path, retry_s=0.3)
    assert fd is not None
    os.close(fd)


def test_a_home_this_user_may_not_enter_is_a_home_error(tmp_path, monkeypatch):
    def denied(path, *a, **k):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(paths.os, "stat", denied)
    with pytest.raises(paths.HomeError, match="permission denied.*set VSUP_HOME"):
        paths.private_home(tmp_path / "h")
