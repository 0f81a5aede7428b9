"""`[alerts]` as the daemon's alerts take it: the table typed once, when the layout compiles.

What the keys mean and how incidents are sent is control/alerts.py's; the keys and their checks
are the schema's (`ALERTS_KEYS`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vsup.layout.schema import ALERT_KINDS


@dataclass(frozen=True)
class AlertConfig:
    """The `[alerts]` table, checked by layout validation before it gets here."""

    webhook_env: str | None = None
    command: tuple[str, ...] = ()
    kinds: frozenset[str] = frozenset(ALERT_KINDS)
    min_severity: str = "warning"
    min_interval_s: float = 300.0
    resolve_after_s: float = 60.0
    resolved: bool = True

    @classmethod
    def from_table(cls, table: Mapping[str, Any] | None) -> AlertConfig | None:
        """The config of an `[alerts]` table; None when there is none or it names no target."""
        if not table or not (table.get("webhook_env") or table.get("command")):
            return None
        kinds = table.get("kinds")
        return cls(
            webhook_env=table.get("webhook_env") or None,
            command=tuple(table.get("command") or ()),
            kinds=frozenset(ALERT_KINDS if kinds is None else kinds),
            min_severity=table.get("min_severity", "warning"),
            min_interval_s=float(table.get("min_interval_s", 300.0)),
            resolve_after_s=float(table.get("resolve_after_s", 60.0)),
            resolved=bool(table.get("resolved", True)),
        )
