"""What differs between two specs of one instance, key by key, as a person reads a plan.

`vsup up --dry-run` prints it under the plan ("a: args.max-model-len 4096 -> 8192"); the daemon's
dry run carries it in the plan's `changes`. Tables (`args`, `env`, `restart`) are compared key by
key; values are plain JSON (tuples as lists, a missing key as None). Secrets never show: a value
under a secret-looking name (`HF_TOKEN`, `api-key`) or one that looks like a token is `***`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from vsup.layout.secrets import is_secret_name, secret_value_kind
from vsup.layout.spec import InstanceSpec

MASK = "***"
# Compared key by key: a change names the key inside the table (`args.max-model-len`).
# `span`: a node's part of a server across nodes (SpanRole; None on other instances).
_TABLES = ("args", "env", "restart", "span")


@dataclass(frozen=True)
class SpecChange:
    """One key that differs: `key` ("model", "gpus", "args.max-model-len"), old and new values
    (None where the key is not set)."""

    key: str
    old: Any
    new: Any

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "old": self.old, "new": self.new}

    def format(self) -> str:
        """`args.max-model-len: 4096 -> 8192` (unset: `(unset)`)."""
        return f"{self.key}: {_shown(self.old)} -> {_shown(self.new)}"


def spec_changes(old: InstanceSpec, new: InstanceSpec) -> list[SpecChange]:
    """The keys in which `new` differs from `old`, in the spec's field order (a table's keys
    in the order the old spec, then the new one, has them)."""
    out: list[SpecChange] = []
    for f in fields(InstanceSpec):
        a, b = getattr(old, f.name), getattr(new, f.name)
        if a == b:
            continue
        if f.name in _TABLES:
            ta = _table(a)
            tb = _table(b)
            for key in dict.fromkeys([*ta, *tb]):
                va, vb = ta.get(key), tb.get(key)
                if va != vb:
                    secret = is_secret_name(key)
                    out.append(
                        SpecChange(f"{f.name}.{key}", _plain(va, secret), _plain(vb, secret))
                    )
        else:
            out.append(SpecChange(f.name, _plain(a), _plain(b)))
    return out


def _table(value: Any) -> dict[str, Any]:
    if value is None:
        return {}  # no span
    if isinstance(value, Mapping):
        return dict(value)
    return asdict(value)  # RestartPolicy, SpanRole


def _plain(value: Any, secret: bool = False) -> Any:
    """JSON data of a spec value, secrets masked."""
    if value is None:
        return None
    if secret:
        return MASK
    if isinstance(value, str):
        return MASK if secret_value_kind(value) else value
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v, is_secret_name(str(k))) for k, v in value.items()}
    return value


def _shown(value: Any) -> str:
    if value is None:
        return "(unset)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        # quoted when it would not read as one word (spaces, an escape code)
        return value if value and value.isprintable() and " " not in value else repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_shown(v) for v in value) + "]"
    return str(value)
