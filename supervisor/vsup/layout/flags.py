"""Layout `args` tables -> vLLM command-line flags.

`max-model-len = 8192` -> `--max-model-len 8192`; `true` -> a bare flag; `false` -> no flag
(so a layout can switch off a flag a profile set); a list -> the flag followed by each item,
as vLLM's `nargs="+"` options expect; a table -> the flag and its JSON
(`compilation-config = {mode = 3}` -> `--compilation-config '{"mode": 3}'`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def flag_name(key: str) -> str:
    """`max_model_len` and `max-model-len` both become `--max-model-len`."""
    return "--" + key.lstrip("-").replace("_", "-")


def args_to_flags(args: Mapping[str, Any]) -> list[str]:
    """Turn an `args` table into argv items, in the table's order."""
    out: list[str] = []
    for key, value in args.items():
        flag = flag_name(key)
        if value is True:
            out.append(flag)
        elif value is False or value is None:
            continue
        elif isinstance(value, Mapping):
            out += [flag, json.dumps(dict(value), separators=(",", ":"))]
        elif isinstance(value, (list, tuple)):
            if not value:
                continue
            out.append(flag)
            out += [_scalar(v) for v in value]
        else:
            out += [flag, _scalar(value)]
    return out


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        # 0.9 stays "0.9"; 2.0 is written "2.0" by repr, which argparse's float() accepts.
        return repr(value)
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"))
    return str(value)
