"""Rules about `args` keys: flags the installed vLLM does not know.

vLLM exits with `bad_args` on a flag it does not know, so a misspelt key (`max-modle-len`) is
an error when the flag list was read from the vLLM the instance's command runs (`vllm serve`,
`python -m vllm...`): that list is the truth for this node. It stays a warning when the list is
vsup's frozen one (no vLLM found, or it could not be read) or when the command is a wrapper
that may not be vLLM at all (`python my_launcher.py`): the flags of another version are a
guess. A layout opts a flag out with `unchecked_args = ["my-plugin-flag"]` (in `[defaults]`,
a profile or an `[[instance]]`; docs/layout.md).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from vsup.layout.diagnostics import ERROR, WARNING, Diagnostic
from vsup.layout.flags import flag_name
from vsup.layout.merge import MergedInstance
from vsup.layout.rules.context import Context, origin_diag
from vsup.layout.schema import ARGS_OWNED_BY_KEYS, suggest
from vsup.layout.structure import ARG_ALIASES, flag_value_ok
from vsup.layout.vllm_flags import FlagList

_PYTHONS = ("python", "python3")


def _runs_vllm(command: Any) -> bool:
    """Whether `command` is vLLM's own server: the `vllm` script, or a Python running a
    `vllm...` module. Anything else (a wrapper script) may take other flags."""
    if not isinstance(command, list) or not command or not isinstance(command[0], str):
        return False
    program = os.path.basename(command[0])
    if program == "vllm":
        return True
    if program.startswith(_PYTHONS):
        rest = [c for c in command[1:] if isinstance(c, str)]
        if "-m" in rest:
            i = rest.index("-m")
            return i + 1 < len(rest) and rest[i + 1].split(".")[0] == "vllm"
    return False


def _unchecked(m: MergedInstance) -> set[str]:
    value = m.values.get("unchecked_args")
    if not isinstance(value, list):
        return set()
    return {flag_name(v)[2:] for v in value if isinstance(v, str)}


def _severity(flags: FlagList, m: MergedInstance) -> str:
    """An error when the list is the installed vLLM's own and the instance runs that vLLM."""
    return ERROR if not flags.frozen and _runs_vllm(m.values.get("command")) else WARNING


def unknown_flags(ctx: Context) -> list[Diagnostic]:
    """An `args` key vLLM does not know: an error when the installed vLLM's flags say so, a
    warning when they are a guess (module docstring); `unchecked_args` opts a key out.

    Checked where each key is written, against the flags of the vLLM that the instances using
    that table run: an `[[instance]]` its own, `[defaults]` and profiles every instance's."""
    by_index = {m.index: m for m in ctx.merged}
    out: list[Diagnostic] = []
    for t in ctx.tables:
        args = t.table.get("args")
        if not isinstance(args, Mapping):
            continue
        users: Sequence[MergedInstance] = (
            [by_index[t.index]] if t.index in by_index else list(ctx.merged)
        )
        where = t.where.sub("args")
        for key, value in args.items():
            flag = flag_name(key)[2:]
            if flag in ARGS_OWNED_BY_KEYS or flag in ARG_ALIASES or not flag_value_ok(value):
                continue  # structure errors of their own
            groups = _unknown_to(ctx, users, flag)
            for (_name, _set, severity), (flags, labels) in groups.items():
                # a shared table ([defaults], a profile) some instances opted out of: say whose
                some = len(labels) < len(users) and t.index not in by_index
                message = _unknown_message(flags, flag, labels if some else None, severity)
                out.append(where.diag(severity, message, key, (key,)))
    return out


def _unknown_to(
    ctx: Context, users: Sequence[MergedInstance], flag: str
) -> dict[tuple[str, frozenset[str], str], tuple[FlagList, list[str]]]:
    """The instances among `users` whose vLLM does not know `flag` (and that did not opt it
    out), grouped by flag list and severity: one diagnostic per distinct list and severity,
    so instances whose lookups differ only in why they fell back to the frozen list share it."""
    groups: dict[tuple[str, frozenset[str], str], tuple[FlagList, list[str]]] = {}
    for m in users:
        flags = ctx.flags(m)
        if not flags.flags or flags.knows(flag) or flag in _unchecked(m):
            continue
        key3 = (flags.name, flags.flags, _severity(flags, m))
        groups.setdefault(key3, (flags, []))[1].append(m.label)
    return groups


def _unknown_message(flags: FlagList, flag: str, labels: list[str] | None, severity: str) -> str:
    """`labels`: the instances it concerns, when not every user of the table."""
    whose = f" for instance{'s' if len(labels) > 1 else ''} {', '.join(labels)}" if labels else ""
    close = suggest(flag, sorted(flags.flags))
    hint = f"; did you mean '{close}'?" if close else "; check the spelling"
    if severity == ERROR:
        why = (
            f": vLLM would exit with bad_args. If the flag is right (a plugin's), "
            f'list it in unchecked_args = ["{flag}"]'
        )
    else:
        why = " (vLLM exits with bad_args on an unknown flag)"
    return f"{flags.name} has no flag --{flag}{whose}{hint}{why} (flag list: {flags.detail})"


def shutdown_outlasts_grace(ctx: Context, m: MergedInstance) -> list[Diagnostic]:
    """`shutdown-timeout` (how long vLLM drains running requests on SIGTERM) at or beyond
    `stop_grace_s` (when vsup sends SIGKILL): the drain is cut short by the kill."""
    value = m.arg("shutdown-timeout")
    grace = m.values.get("stop_grace_s")
    try:
        drain = float(value) if value is not None else None
    except (TypeError, ValueError):
        return []
    if drain is None or not isinstance(grace, (int, float)) or drain < grace:
        return []
    return [
        origin_diag(
            WARNING,
            f"args shutdown-timeout = {value} lets vLLM drain for as long as vsup waits before "
            f"SIGKILL (stop_grace_s = {grace:g}): the kill cuts the drain short and its "
            "requests fail; keep shutdown-timeout a few seconds below stop_grace_s",
            m,
            "args",
            m.arg_key("shutdown-timeout") or "",
        )
    ]
