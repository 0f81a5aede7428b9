"""Rules about `args` keys: flags the installed vLLM does not know."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from vsup.layout.diagnostics import WARNING, Diagnostic
from vsup.layout.flags import flag_name
from vsup.layout.rules.context import Context
from vsup.layout.schema import ARGS_OWNED_BY_KEYS, suggest
from vsup.layout.structure import ARG_ALIASES, flag_value_ok
from vsup.layout.vllm_flags import FlagList


def unknown_flags(ctx: Context) -> list[Diagnostic]:
    """An `args` key vLLM does not know exits with bad_args; warned, since vLLM versions move.

    Checked where each key is written, against the flags of the vLLM that the instances using
    that table run: an `[[instance]]` its own, `[defaults]` and profiles every instance's."""
    by_instance = {m.index: ctx.flags(m) for m in ctx.merged}
    # One warning per distinct list: instances whose lookups differ only in why they fell back
    # to the frozen list share it.
    everyone = list({(f.name, f.flags): f for f in by_instance.values()}.values())
    out: list[Diagnostic] = []
    for t in ctx.tables:
        args = t.table.get("args")
        if not isinstance(args, Mapping):
            continue
        lists: Sequence[FlagList] = [by_instance[t.index]] if t.index in by_instance else everyone
        where = t.where.sub("args")
        for key, value in args.items():
            flag = flag_name(key)[2:]
            if flag in ARGS_OWNED_BY_KEYS or flag in ARG_ALIASES or not flag_value_ok(value):
                continue  # structure errors of their own
            for flags in lists:
                if flags.flags and not flags.knows(flag):
                    close = suggest(flag, sorted(flags.flags))
                    hint = (
                        f"; did you mean '{close}'?"
                        if close
                        else "; check the spelling (vLLM exits with bad_args on an unknown flag)"
                    )
                    message = f"{flags.name} has no flag --{flag}{hint} (flag list: {flags.detail})"
                    out.append(where.diag(WARNING, message, key, (key,)))
    return out
