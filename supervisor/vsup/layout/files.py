"""Reading layout and profile files: regular files only, at most `MAX_FILE_BYTES`, UTF-8.

`vsup validate`, `vsup up` (through the same `load_layout`) and profile lookups read through
here, so `vsup up /dev/zero` or a 20 GB file is refused after reading `limit + 1` bytes, a
FIFO is never opened for reading (it would block), and a binary file is one clear line,
never a traceback.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from vsup.layout.diagnostics import ERROR, Diagnostic

# Layouts of 64 instances are ~10 KiB; anything near this is not a layout.
MAX_FILE_BYTES = 1024 * 1024


class UnreadableFile(ValueError):
    """A file that cannot be used as a layout or profile; `diagnostic` says why and what to do."""

    def __init__(self, diagnostic: Diagnostic) -> None:
        super().__init__(diagnostic.format())
        self.diagnostic = diagnostic


def read_text(path: Path | str, what: str = "layout", limit: int = MAX_FILE_BYTES) -> str:
    """The text of a regular UTF-8 file of at most `limit` bytes; UnreadableFile otherwise."""
    path = Path(path)
    file = str(path)

    def refuse(message: str, line: int | None = None) -> UnreadableFile:
        return UnreadableFile(Diagnostic(ERROR, message, file=file, line=line))

    try:
        # O_NONBLOCK: opening a FIFO for reading would wait for a writer; fstat then says what
        # was opened (no race between a stat and the open).
        fd = os.open(path.expanduser(), os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise refuse(f"cannot read the {what}: {reason}; check the path") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = _kind(mode)
            raise refuse(f"cannot read the {what}: it is {kind}, not a regular file")
        chunks: list[bytes] = []
        size = 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 16, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise refuse(f"cannot read the {what}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if size > limit:
        raise refuse(
            f"the {what} is larger than {limit // 1024} KiB: not a {what} file (check the path)"
        )
    data = b"".join(chunks)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise refuse(
            f"the file is not UTF-8 text (byte {exc.start}); save it as UTF-8", line=line
        ) from None


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def toml_error_diagnostic(exc: Exception, file: str | None) -> Diagnostic:
    """A TOMLDecodeError as a diagnostic with its line: `(at line 3, column 7)`."""
    text = str(exc)
    m = re.search(r"\(at line (\d+), column (\d+)\)", text)
    line = int(m.group(1)) if m else None
    message = re.sub(r"\s*\(at line \d+, column \d+\)", "", text).strip()
    if m:
        message += f" (column {m.group(2)})"
    return Diagnostic(ERROR, f"TOML syntax: {message}; fix the file's syntax", file=file, line=line)
