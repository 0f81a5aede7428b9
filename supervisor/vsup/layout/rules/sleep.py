"""Rules about vLLM's sleep mode: the `sleep` table, `swap_group` and what time-sharing needs.

A swap group's members take turns on the same GPUs, one awake at a time (vsup.layout.timeshare
counts their memory); each must be able to sleep (a `sleep` table), and vLLM's sleep endpoints
are dev-mode endpoints that must not face the network. Level-1 sleepers keep their weights in
host RAM, which the node must have. docs/layout.md, "Time-sharing a GPU: swap groups and sleep".
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from vsup.layout.diagnostics import ERROR, WARNING, Diagnostic
from vsup.layout.merge import MergedInstance
from vsup.layout.node import GIB
from vsup.layout.rules.context import Context, origin_diag
from vsup.layout.rules.flags import _runs_vllm as runs_vllm
from vsup.layout.spec import DEV_MODE_ENV, SLEEP_MODE_FLAG
from vsup.layout.timeshare import HOST_RAM_ERROR_SHARE, HOST_RAM_WARN_SHARE, host_ram_need

_FLAG = SLEEP_MODE_FLAG[2:]


def _sleep(m: MergedInstance) -> Mapping[str, Any] | None:
    value = m.values.get("sleep")
    return value if isinstance(value, Mapping) else None


def _group(m: MergedInstance) -> str | None:
    value = m.values.get("swap_group")
    return value if isinstance(value, str) else None


def _groups(ctx: Context) -> dict[str, list[MergedInstance]]:
    out: dict[str, list[MergedInstance]] = {}
    for m in ctx.merged:
        group = _group(m)
        if group is not None:
            out.setdefault(group, []).append(m)
    return out


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: whatever it resolves to, it is not known to be loopback


def swap_group_without_sleep(ctx: Context, m: MergedInstance) -> list[Diagnostic]:
    """A member vsup cannot put to sleep would stay awake beside the one whose turn it is."""
    group = _group(m)
    if group is None or _sleep(m) is not None:
        return []
    return [
        origin_diag(
            ERROR,
            f"instance is in swap group '{group}' but has no sleep table: vsup could not put it "
            "to sleep, and the group's members would be awake together on one GPU; add "
            "sleep = { level = 1 } (or remove swap_group)",
            m,
            "swap_group",
        )
    ]


def swap_group_gpus_differ(ctx: Context) -> list[Diagnostic]:
    """Members take turns on the same GPUs: one on other GPUs frees nothing for the rest."""
    out: list[Diagnostic] = []
    for group, members in _groups(ctx).items():
        first = members[0]
        want = sorted(first.gpus or [])
        for m in members[1:]:
            have = sorted(m.gpus or [])
            if have == want:
                continue
            out.append(
                origin_diag(
                    ERROR,
                    f"swap group '{group}': '{m.label}' is on GPUs {have} but '{first.label}' "
                    f"on {want}; the members of a group take turns on the same GPUs (a sleeper "
                    "frees only its own): give them the same gpus, or put this one in a group "
                    "of its own GPUs",
                    m,
                    "gpus",
                )
            )
    return out


def swap_group_of_one(ctx: Context) -> list[Diagnostic]:
    out = []
    for group, members in _groups(ctx).items():
        if len(members) == 1:
            out.append(
                origin_diag(
                    WARNING,
                    f"swap group '{group}' has this one member: it shares its GPUs with no one "
                    "(a typo in another instance's swap_group?); give the group a second member "
                    "or remove swap_group",
                    members[0],
                    "swap_group",
                )
            )
    return out


def swap_group_awake_twice(ctx: Context) -> list[Diagnostic]:
    """`sleep.start = "awake"` on two members: `vsup up` would wake both on one GPU."""
    out: list[Diagnostic] = []
    for group, members in _groups(ctx).items():
        awake = [m for m in members if (_sleep(m) or {}).get("start") == "awake"]
        if len(awake) < 2:
            continue
        names = ", ".join(f"'{m.label}'" for m in awake)
        for m in awake[1:]:
            out.append(
                origin_diag(
                    ERROR,
                    f"swap group '{group}' has sleep.start = \"awake\" on {names}: one member "
                    'of a group is awake at a time; set start = "asleep" on all but one',
                    m,
                    "sleep",
                    "start",
                )
            )
    return out


def dev_mode_exposed(ctx: Context, m: MergedInstance) -> list[Diagnostic]:
    """Sleep mode needs VLLM_SERVER_DEV_MODE=1, which also opens /sleep, /wake_up,
    /collective_rpc (any method on the workers) and /reset_prefix_cache to whoever reaches the
    port: loopback only, unless the layout opts in with `sleep.public_dev_mode = true`."""
    sleep = _sleep(m)
    host = m.values.get("host")
    if sleep is None or not isinstance(host, str) or _is_loopback(host):
        return []
    if sleep.get("public_dev_mode") is True:
        return []
    return [
        origin_diag(
            ERROR,
            f"a sleep table turns on vLLM's dev mode (VLLM_SERVER_DEV_MODE=1), and host = "
            f"'{host}' would expose its /sleep, /wake_up and /collective_rpc endpoints to "
            'whoever reaches the port; set host = "127.0.0.1" and put a router in front, or '
            "opt in with sleep = { public_dev_mode = true }",
            m,
            "host",
        )
    ]


def dev_mode_env_exposed(ctx: Context, m: MergedInstance) -> list[Diagnostic]:
    """VLLM_SERVER_DEV_MODE turned on through `env` opens the same endpoints as a sleep table
    does, without one: on a host other than loopback a warning says so (a sleep table's case
    is `dev_mode_exposed`'s). On as vLLM reads it: an integer other than 0."""
    if DEV_MODE_ENV not in m.env or _sleep(m) is not None:
        return []
    raw = str(m.env[DEV_MODE_ENV]).strip()
    try:
        on = int(raw) != 0
    except ValueError:
        on = False  # vLLM itself would fail to read it; not this rule's to say
    host = m.values.get("host")
    if not on or not isinstance(host, str) or _is_loopback(host):
        return []
    return [
        origin_diag(
            WARNING,
            f"{DEV_MODE_ENV}={raw} turns on vLLM's dev mode, and host = '{host}' exposes its "
            "/sleep, /wake_up, /collective_rpc (any method on the workers) and "
            "/reset_prefix_cache endpoints to whoever reaches the port; set host = "
            '"127.0.0.1" and put a router in front, or remove the variable',
            m,
            "env",
            DEV_MODE_ENV,
        )
    ]


def sleep_on_cpu(ctx: Context, m: MergedInstance) -> list[Diagnostic]:
    if _sleep(m) is None or m.gpus != []:
        return []
    return [
        origin_diag(
            WARNING,
            "a CPU instance (gpus = []) cannot sleep: the CPU build of vLLM answers /sleep but "
            "frees nothing (sleep mode is not supported on CPU); remove the sleep table, or keep "
            "it only to try the protocol",
            m,
            "sleep",
        )
    ]


def sleep_flag_unknown(ctx: Context, m: MergedInstance) -> list[Diagnostic]:
    """The installed vLLM the instance runs has no --enable-sleep-mode: vsup adds it, and vLLM
    would exit with bad_args. Only said when the flag list is that vLLM's own (rules/flags.py)."""
    if _sleep(m) is None:
        return []
    flags = ctx.flags(m)
    if flags.frozen or not flags.flags or flags.knows(_FLAG):
        return []
    if not runs_vllm(m.values.get("command")):
        return []  # a wrapper may take the flag on to a vLLM that knows it
    return [
        origin_diag(
            ERROR,
            f"{flags.name} has no flag {SLEEP_MODE_FLAG}, which a sleep table adds: vLLM would "
            f"exit with bad_args; install a vLLM with sleep mode, or remove the sleep table "
            f"(flag list: {flags.detail})",
            m,
            "sleep",
        )
    ]


def sleep_flag_without_table(ctx: Context, m: MergedInstance) -> list[Diagnostic]:
    """The flag by hand does not make an instance one vsup can put to sleep."""
    if _sleep(m) is not None or not m.arg(_FLAG):
        return []
    return [
        origin_diag(
            WARNING,
            f"args {_FLAG} without a sleep table: vLLM reserves sleep mode's allocator, but vsup "
            "neither turns on the endpoints (VLLM_SERVER_DEV_MODE) nor puts it to sleep; use "
            "sleep = { level = 1 } instead of the flag",
            m,
            "args",
            m.arg_key(_FLAG) or "",
        )
    ]


def host_ram_for_sleepers(ctx: Context) -> list[Diagnostic]:
    """Level-1 sleepers hold their weights in pinned host RAM; any of them may be asleep at
    once (`vsup sleep`, idle sleep), so the node must hold all their weights."""
    ram = ctx.host_memory_bytes
    if not ram:
        return []
    need = host_ram_need(ctx.tenants())
    total = need.bytes
    if not need.sleepers or total <= HOST_RAM_WARN_SHARE * ram:
        return []
    severity = ERROR if total > HOST_RAM_ERROR_SHARE * ram else WARNING
    limit = HOST_RAM_ERROR_SHARE if severity == ERROR else HOST_RAM_WARN_SHARE
    verb = "too much: the node needs the rest" if severity == ERROR else "a large part of it"
    by_label = {m.label: m for m in ctx.merged}
    first, *rest = need.sleepers
    d = origin_diag(
        severity,
        f"level-1 sleepers keep their weights in host RAM: {need.describe()} = "
        f"{total / GIB:.1f} GiB asleep at once, {total / ram:.0%} of this node's "
        f"{ram / GIB:.1f} GiB: above {limit:.0%} is {verb}; use sleep level 2 for some (weights "
        "dropped, a wake reloads them from disk) or fewer level-1 sleepers",
        by_label[first.name],
        "sleep",
        "level",
    )
    return [replace(d, others=tuple(t.name for t in rest))]
