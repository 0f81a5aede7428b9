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
