"""Per-run log files: `logs_dir/NAME/run-NNNN.log`, one per spawn, stdout and stderr together.

The child writes its file directly (opened O_APPEND), never through a pipe to the daemon: an
instance must outlive the daemon and keep logging while no daemon runs.

Limits, so 64 instances that crash-loop or log every request cannot fill the disk:
- only the last `keep` runs of an instance are kept (default 5); older run files are deleted
  when a new run starts;
- a live run file that grows past `max_bytes` (default 32 MiB; checked every few seconds by
  the runner) is copied to `run-NNNN.log.1` (replacing the previous copy) and truncated to zero;
  the child's O_APPEND writes continue at the new end. Lines written between the copy and the
  truncation are lost, and a marker line says where the older part went. So one run holds at
  most about 2 x max_bytes, an instance about keep x 2 x max_bytes.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import BinaryIO

_RUN_FILE = re.compile(r"^run-(\d+)\.log(\.1)?$")

DEFAULT_KEEP = 5
DEFAULT_MAX_BYTES = 32 * 1024 * 1024
TAIL_BYTES = 64 * 1024


class RunLogs:
    """The run log files of one instance."""

    def __init__(
        self,
        logs_dir: Path,
        name: str,
        keep: int = DEFAULT_KEEP,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        self.dir = Path(logs_dir) / name
        self.keep = max(1, keep)
        self.max_bytes = max_bytes

    def path(self, run: int) -> Path:
        return self.dir / f"run-{run:04d}.log"

    def runs(self) -> list[int]:
        """Run numbers that have a log file, oldest first."""
        if not self.dir.is_dir():
            return []
        found = set()
        for entry in os.listdir(self.dir):
            m = _RUN_FILE.match(entry)
            if m and not m.group(2):
                found.add(int(m.group(1)))
        return sorted(found)

    def open_for_run(self, run: int, header: str) -> BinaryIO:
        """Create run `run`'s file (append mode, 0600) with a header line, after deleting the
        runs that fall out of the last `keep`. The caller hands it to the child and closes it."""
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        for old in self.runs():
            if old <= run - self.keep:
                for p in (self.path(old), self._older_part(old)):
                    p.unlink(missing_ok=True)
        fd = os.open(self.path(run), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        f = os.fdopen(fd, "ab", buffering=0)
        try:
            f.write(header.rstrip("\n").encode() + b"\n")
        except OSError:
            # A full disk: vLLM dies on its first stderr write that fails (tqdm), so this run
            # writes to /dev/null and serves; the daemon's disk alert says why logs are missing.
            f.close()
            return open(os.devnull, "ab", buffering=0)
        return f

    def over_cap(self, run: int) -> bool:
        """Whether run `run`'s live file passed `max_bytes` (one stat: cheap on the loop)."""
        try:
            return self.path(run).stat().st_size > self.max_bytes
        except FileNotFoundError:
            return False

    def cap(self, run: int) -> bool:
        """Keep run `run`'s live file under `max_bytes` (see the module doc); True if cut."""
        path = self.path(run)
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return False
        if size <= self.max_bytes:
            return False
        older = self._older_part(run)
        tmp = older.with_name(older.name + ".tmp")
        shutil.copyfile(path, tmp)
        os.replace(tmp, older)
        with open(path, "r+b") as f:
            f.truncate(0)
        with open(path, "ab", buffering=0) as f:
            f.write(
                f"[vsup] log passed {self.max_bytes} bytes: the part before this line is in "
                f"{older.name}\n".encode()
            )
        return True

    def tail(self, run: int, nbytes: int = TAIL_BYTES) -> str:
        """The last `nbytes` of run `run`'s log (with the copied older part when the live file
        was just cut), decoded leniently; '' when there is none."""
        data = _read_tail(self.path(run), nbytes)
        if len(data) < nbytes:
            data = _read_tail(self._older_part(run), nbytes - len(data)) + data
        text = data.decode("utf-8", errors="replace")
        return text

    def _older_part(self, run: int) -> Path:
        return self.dir / f"run-{run:04d}.log.1"


def _read_tail(path: Path, nbytes: int) -> bytes:
    if nbytes <= 0:
        return b""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - nbytes))
            data = f.read(nbytes)
    except FileNotFoundError:
        return b""
    if size > nbytes:
        # drop the partial first line
        cut = data.find(b"\n")
        data = data[cut + 1 :] if cut >= 0 else b""
    return data
