"""Where in a TOML file a table or key was written, found by a light scan of the text.

`tomllib` gives values, not positions. Diagnostics should still point at a line, so this module
scans the source once: table headers (`[defaults]`, `[[instance]]`, `[instance.args]`), key lines
(`port = 8000`, `args.max-model-len = 8192`) and the keys of one-line inline tables
(`args = { max-model-len = 8192 }`). Paths are tuples into the parsed document, with the index of
an array-of-tables entry: `("instance", 2, "args", "max-model-len")`. A lookup falls back to the
nearest enclosing table, so every path inside the file gets some line.
"""

from __future__ import annotations

import contextlib
import re

Path_ = tuple  # a path into the document: str keys and int indices into arrays of tables

_BARE = r"[A-Za-z0-9_-]+"
_BASIC = r'"(?:[^"\\\n]|\\.)*"'
_LITERAL = r"'[^'\n]*'"
_KEY_PART = rf"(?:{_BARE}|{_BASIC}|{_LITERAL})"
_DOTTED = rf"{_KEY_PART}(?:\s*\.\s*{_KEY_PART})*"
_KEY_PART_RE = re.compile(_KEY_PART)
_HEADER_RE = re.compile(rf"^\s*(\[\[?)\s*({_DOTTED})\s*(\]\]?)")
_KEYLINE_RE = re.compile(rf"^\s*({_DOTTED})\s*=\s*(.*)$")
_INLINE_KEY_RE = re.compile(rf"[{{,]\s*({_DOTTED})\s*=")


def _parts(dotted: str) -> list[str]:
    out = []
    for m in _KEY_PART_RE.finditer(dotted):
        part = m.group(0)
        if part[:1] in ('"', "'"):
            part = part[1:-1]
            if m.group(0)[0] == '"':
                with contextlib.suppress(UnicodeDecodeError, UnicodeEncodeError):
                    part = part.encode("latin-1", "backslashreplace").decode("unicode_escape")
        out.append(part)
    return out


class SourceMap:
    """Lines of tables and keys in one TOML text."""

    def __init__(self, text: str | None) -> None:
        self._lines: dict[Path_, int] = {}
        if text:
            self._scan(text)

    def _record(self, path: Path_, line: int) -> None:
        self._lines.setdefault(path, line)

    def _scan(self, text: str) -> None:
        aot_count: dict[tuple, int] = {}  # array-of-tables path (no indices) -> entries seen
        current: Path_ = ()
        in_multiline: str | None = None  # the closing delimiter of an open multi-line string
        for lineno, raw in enumerate(text.splitlines(), start=1):
            line = raw
            if in_multiline:
                if line.count(in_multiline) % 2 == 1:
                    in_multiline = None
                continue
            header = _HEADER_RE.match(line)
            if header and header.group(1) == header.group(3)[::-1].replace("]", "["):
                names = _parts(header.group(2))
                if header.group(1) == "[[":
                    plain = tuple(names)
                    index = aot_count.get(plain, 0)
                    aot_count[plain] = index + 1
                    current = self._indexed(names[:-1], aot_count) + (names[-1], index)
                else:
                    current = self._indexed(names, aot_count)
                self._record(current, lineno)
                continue
            keyline = _KEYLINE_RE.match(line)
            if not keyline:
                continue
            names = _parts(keyline.group(1))
            for depth in range(1, len(names) + 1):
                self._record(current + tuple(names[:depth]), lineno)
            rest = keyline.group(2)
            for delim in ('"""', "'''"):
                if rest.count(delim) % 2 == 1:
                    in_multiline = delim
                    break
            if rest.lstrip().startswith("{"):
                for m in _INLINE_KEY_RE.finditer(rest):
                    sub = _parts(m.group(1))
                    self._record(current + tuple(names) + tuple(sub), lineno)

    @staticmethod
    def _indexed(names: list[str], aot_count: dict[tuple, int]) -> Path_:
        """`[instance.args]` means the args of the latest `[[instance]]`: add that index."""
        out: list = []
        plain: list[str] = []
        for name in names:
            plain.append(name)
            out.append(name)
            seen = aot_count.get(tuple(plain))
            if seen:
                out.append(seen - 1)
        return tuple(out)

    def line(self, path: Path_) -> int | None:
        """The line of `path`, else of the nearest enclosing table or key that has one."""
        path = tuple(path)
        while path:
            if path in self._lines:
                return self._lines[path]
            path = path[:-1]
        return None

    def exact(self, path: Path_) -> int | None:
        return self._lines.get(tuple(path))
