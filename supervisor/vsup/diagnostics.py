"""One problem in a file vsup reads: the `Diagnostic` every validator reports with.

The layout's validation (`vsup.layout`) and the fleet file's (`vsup.fleet.model`) both say what
is wrong this way, one line each: `FILE:LINE: error: instance 'gpu0': key 'port': message`
(a fleet file's: `FILE: error: node 'gpu01': key 'ssh': message`). A leaf module (stdlib
only): the fleet commands import it without the layout package, which costs 0.2 s of CPU to
import.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ERROR = "error"
WARNING = "warning"
# How many further instances a folded diagnostic names before "and N more".
SHOWN_OTHERS = 4


@dataclass(frozen=True)
class Diagnostic:
    severity: str  # "error" | "warning"
    message: str  # what is wrong and what to change
    file: str | None = None  # the file the problem is in (a layout, a profile, a fleet file)
    line: int | None = None  # 1-based, where the source text shows it
    instance: str | None = None  # the layout instance it concerns, if one
    key: str | None = None  # dotted key inside its table, e.g. "args.max-model-len"
    # "[layout]", "[defaults]", "profile 'x'", "node 'gpu01'", "[[node]] #2" when not an instance
    table: str | None = None
    others: tuple[str, ...] = ()  # further instances with the very same problem

    @property
    def is_error(self) -> bool:
        return self.severity == ERROR

    def format(self) -> str:
        """One line: `FILE:LINE: error: instance 'gpu0': key 'port': message`."""
        where = ""
        if self.file:
            where = f"{self.file}:{self.line}: " if self.line else f"{self.file}: "
        parts = [f"{where}{self.severity}"]
        if self.instance is not None:
            label = f"instance '{self.instance}'"
            if self.others:
                shown = ", ".join(f"'{o}'" for o in self.others[:SHOWN_OTHERS])
                more = len(self.others) - SHOWN_OTHERS
                label += f" (and {shown}" + (f" and {more} more)" if more > 0 else ")")
            parts.append(label)
        elif self.table:
            parts.append(self.table)
        if self.key:
            parts.append(f"key '{self.key}'")
        parts.append(self.message)
        return ": ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "severity": self.severity,
            "message": self.message,
            "file": self.file,
            "line": self.line,
            "instance": self.instance,
            "key": self.key,
            "table": self.table,
            "others": list(self.others),
            "text": self.format(),
        }

    def __str__(self) -> str:
        return self.format()
