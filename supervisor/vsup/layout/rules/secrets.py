"""Rules that keep secrets out of layouts (what a secret is: `vsup.layout.secrets`).

A layout lives in git, and its flags show in `ps` to every user, in run logs, the journal and
the state file. The API key is named (`api_key_env`); other secrets reach vLLM through the
supervisor's environment, which instances inherit.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from vsup.layout.diagnostics import ERROR, Diagnostic
from vsup.layout.flags import flag_name
from vsup.layout.rules.context import Context
from vsup.layout.secrets import URL_PASSWORD, is_secret_name, secret_value_kind
from vsup.layout.structure import Where

API_KEY_FIX = (
    'remove it and set api_key_env = "VAR" (the supervisor passes $VAR to vLLM as VLLM_API_KEY)'
)
ENV_FIX = (
    "remove it and export it where the supervisor runs (instances inherit its environment); "
    'for the API key set api_key_env = "VAR" and export VAR there'
)
HF_TOKEN_FIX = (
    'remove it and set hf_token_env = "VAR" (the pull sends $VAR; docs/pull.md), or export '
    "HF_TOKEN where the supervisor runs (instances inherit its environment), or write "
    "hf-token = true to use the token `huggingface-cli login` saved"
)
VALUE_FIX = (
    "remove it; pass a token through the supervisor's environment (instances inherit it) and "
    'the API key through api_key_env = "VAR"'
)
CREDENTIAL_FIX = (
    "write the value without it and put the credential in a variable exported where the "
    "supervisor runs (instances inherit its environment): the layout names variables, never "
    "their values"
)
NOT_HERE = "a secret must not be written in the layout"


def _secret_flag(flag: str, value: Any) -> bool:
    if flag == "api-key":
        return True  # whatever its value: the key is named by api_key_env
    # A bare flag (`hf-token = true`) or a removed one carries no secret.
    return is_secret_name(flag) and not isinstance(value, bool) and value not in ("", None)


def secret_flags(ctx: Context) -> list[Diagnostic]:
    """`args` flags that take a secret (`api-key`, `hf-token`, ...), wherever written."""
    out: list[Diagnostic] = []
    for t in ctx.tables:
        args = t.table.get("args")
        if not isinstance(args, Mapping):
            continue
        where = t.where.sub("args")
        for key, value in args.items():
            flag = flag_name(key)[2:]
            if not _secret_flag(flag, value):
                continue
            fix = {"api-key": API_KEY_FIX, "hf-token": HF_TOKEN_FIX}.get(flag, ENV_FIX)
            out.append(where.diag(ERROR, f"{NOT_HERE}: {fix}", key, (key,)))
    return out


def secret_env(ctx: Context) -> list[Diagnostic]:
    """`env` variables whose name says they hold a secret (HF_TOKEN, VLLM_API_KEY, ...)."""
    out: list[Diagnostic] = []
    for t in ctx.tables:
        env = t.table.get("env")
        if not isinstance(env, Mapping):
            continue
        where = t.where.sub("env")
        for key, value in env.items():
            if is_secret_name(key) and value not in ("", None):
                out.append(where.diag(ERROR, f"{NOT_HERE}: {ENV_FIX}", key, (key,)))
    return out


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)
    elif isinstance(value, Mapping):
        for v in value.values():
            yield from _strings(v)


def secret_values(ctx: Context) -> list[Diagnostic]:
    """Values that look like a token (hf_..., sk-..., a long random string) in any `args`
    flag, `env` variable or `command` item, whatever the name: a token passed under an
    innocent name is still in `ps`."""
    out: list[Diagnostic] = []
    for t in ctx.tables:
        for table_key in ("args", "env"):
            table = t.table.get(table_key)
            if not isinstance(table, Mapping):
                continue
            where = t.where.sub(table_key)
            for key, value in table.items():
                named = (
                    _secret_flag(flag_name(key)[2:], value)
                    if table_key == "args"
                    else is_secret_name(key)
                )
                if named:
                    continue  # said by secret_flags / secret_env
                kind = next(filter(None, map(secret_value_kind, _strings(value))), None)
                if kind:
                    out.append(where.diag(ERROR, _looks_like(kind), key, (key,)))
        command = t.table.get("command")
        if isinstance(command, list):
            out += _command_secrets(command, t.where)
    return out


def secret_in_alerts(ctx: Context) -> list[Diagnostic]:
    """A token in `[alerts] command` (e.g. a pager's API key as an argument): the layout is in
    git and the command line in `ps`. The webhook URL is named by `webhook_env` already."""
    command = ctx.layout.alerts.get("command")
    if not isinstance(command, list):
        return []
    where = Where(ctx.layout.file, ctx.layout.source_map, ("alerts",), table="[alerts]")
    return _command_secrets(command, where)


def _looks_like(kind: str) -> str:
    if kind == URL_PASSWORD or kind.startswith("a credential ("):
        return f"the value carries {kind}; {NOT_HERE}: {CREDENTIAL_FIX}"
    return f"the value looks like {kind}; {NOT_HERE}: {VALUE_FIX}"


def _command_secrets(command: list[Any], where: Where) -> list[Diagnostic]:
    for i, item in enumerate(command):
        if not isinstance(item, str):
            continue
        if item.startswith("--"):
            name, eq, value = item[2:].partition("=")
            following = command[i + 1] if i + 1 < len(command) else None
            if (name == "api-key" or is_secret_name(name)) and (
                (eq and value) or (isinstance(following, str) and not following.startswith("-"))
            ):
                message = f"--{name} takes a secret; {NOT_HERE}: {ENV_FIX}"
                return [where.diag(ERROR, message, "command", ("command",))]
        kind = secret_value_kind(item)
        if kind:
            return [where.diag(ERROR, _looks_like(kind), "command", ("command",))]
    return []
