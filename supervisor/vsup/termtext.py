"""Text from a layout, a log or a remote node, made safe to print on a terminal.

A layout's `name`, an instance name, a log line or an error message can carry terminal
control sequences (`\x1b]0;...\x07` retitles the window, `\x1b[2J` clears it, `\r` rewrites the
line). Everything `vsup status` and the dashboard print from such a source goes through
`printable`: control characters become visible escapes (`\x1b` -> `\\x1b`), so the text
reads as it is and cannot drive the terminal. Pure, stdlib only.
"""

from __future__ import annotations

import re

# C0 controls, DEL, C1 controls; and the Unicode bidi overrides that reorder a line on
# screen (a name that reads differently than it is).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_CONTROL_BUT_TAB = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _escape(match: re.Match[str]) -> str:
    ch = match.group()
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: object, *, newlines: bool = False) -> str:
    """`text` with every control character shown as an escape (`\\x1b`), never sent to the
    terminal; `newlines` keeps line breaks and tabs (a log excerpt). Plain text comes back as
    it is."""
    s = text if isinstance(text, str) else str(text)
    if newlines:
        return _CONTROL_BUT_TAB.sub(_escape, s)
    return _CONTROL.sub(_escape, s)
