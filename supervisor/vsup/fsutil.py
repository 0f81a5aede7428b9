"""File-system rules shared by the whole package: one atomic writer, and the checks that keep
vsup from replacing or re-permissioning what is not its own.

- `write_atomic`: temp file in the target's directory, fsync, rename, fsync the directory. A
  reader sees the old content or the new, never a mix; a full disk leaves the old file whole.
- `regular_target`: where a user-named output file (`vsup save FILE`) may be written. Only a
  regular file or a new name: FIFOs, devices, sockets and directories are refused. A symlink is
  followed and its *target* is replaced atomically (the link stays a link). A missing parent
  directory is an error unless the caller asks for it to be created. A place inside
  VSUP_HOME is refused, whatever the symlinks on the way: replacing the journal loses every
  later event, replacing the lock file let a second daemon start beside the first.
- `data_from`: where a sparse file's data resumes (a run log whose middle was released past
  its cap, engine/runlog.py): readers that follow a file by offset skip the hole with it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from pathlib import Path


class UnsafeTarget(ValueError):
    """A path vsup refuses to write (message says why and what to do)."""


def write_atomic(path: Path | str, data: bytes | str, *, mode: int | None = None) -> None:
    """Replace `path` with `data` atomically (temp file + fsync + rename + directory fsync).

    The file keeps the mode of the one it replaces (`mode` overrides; new files get 0644
    less the umask when `mode` is None). The parent directory must exist. On any error the
    temp file is removed and `path` is untouched.
    """
    path = Path(path).expanduser().absolute()
    directory = path.parent
    if isinstance(data, str):
        data = data.encode("utf-8")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if mode is None:
            try:
                mode = os.stat(path).st_mode & 0o7777
            except FileNotFoundError:
                umask = os.umask(0)
                os.umask(umask)
                mode = 0o644 & ~umask
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(directory)


def fsync_dir(directory: Path | str) -> None:
    """Make a rename in `directory` durable (best effort: some file systems refuse it)."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def regular_target(
    path: Path | str, *, parents: bool = False, not_inside: Path | str | None = None
) -> Path:
    """The file to write for a user-named output `path`, checked; raises UnsafeTarget.

    Returns the path itself, or a symlink's final target (writes go to the target so the link
    stays). Refuses anything that exists and is not a regular file, a missing parent
    directory unless `parents` (the caller then creates it), and anything that resolves to a
    place inside `not_inside` (VSUP_HOME: the daemon's own journal, state, lock and logs).
    """
    given = Path(path).expanduser().absolute()
    target = Path(os.path.realpath(given))
    via = f" (the symlink {given} points to it)" if target != given else ""
    if not_inside is not None:
        home = Path(os.path.realpath(Path(not_inside).expanduser().absolute()))
        if target == home or home in target.parents:
            raise UnsafeTarget(
                f"{target}{via} is inside VSUP_HOME ({home}), where vsup keeps its own files "
                "(socket, lock, state, journal, logs); write it somewhere else"
            )
    try:
        st = os.stat(target)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise UnsafeTarget(f"cannot check {target}{via}: {exc.strerror or exc}") from None
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise UnsafeTarget(
            f"{target}{via} is {_kind(st.st_mode)}, not a regular file; vsup only writes "
            "regular files: name a file path instead"
        )
    parent = target.parent
    if not parent.is_dir():
        if parent.exists():
            raise UnsafeTarget(f"{parent} is not a directory; cannot write {target}{via}")
        if not parents:
            raise UnsafeTarget(
                f"the directory {parent} does not exist; create it first or pass --parents"
            )
    return target


def _kind(mode: int) -> str:
    for test, word in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return word
    return "not a regular file"


def data_from(fd: int, offset: int) -> int:
    """The first offset at or after `offset` that holds data: `offset` itself unless it falls
    in a hole (a released part of a run log); the file's size when only a hole follows. File
    systems without SEEK_DATA report every offset as data."""
    try:
        return os.lseek(fd, offset, os.SEEK_DATA)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # nothing but a hole (or the end) after `offset`
            return max(offset, os.fstat(fd).st_size)
        return offset  # EINVAL and the like: no SEEK_DATA here, no holes to skip


def hole_from(fd: int, offset: int) -> int:
    """The first offset at or after `offset` where a hole begins (the file's size when none
    does): a reader stops there rather than read the hole's zeros."""
    try:
        return os.lseek(fd, offset, os.SEEK_HOLE)
    except OSError:
        return max(offset, os.fstat(fd).st_size)


def hole_note(skipped: int) -> str:
    """The line readers put where they skipped a released part of a log."""
    return (
        f"[vsup] ... {skipped} bytes of this log were released here: it passed its size cap "
        "(vsup keeps the start of a run and its latest part)\n"
    )
