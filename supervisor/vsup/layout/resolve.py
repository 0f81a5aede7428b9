"""Resolving a layout into the engine's `InstanceSpec`s: structure checks, then the merge.

Above both in the layout package; `Layout.resolve()` calls `resolve_specs`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vsup.layout.cpubind import bind_cpu_instances
from vsup.layout.diagnostics import LayoutError
from vsup.layout.flags import flag_name
from vsup.layout.merge import MergedInstance, merge_instances, profile_cache_for
from vsup.layout.model import Layout
from vsup.layout.modelpath import resolve_model_path
from vsup.layout.spec import LOAD_TRACKING_FLAG, InstanceSpec, RestartPolicy, SleepSpec
from vsup.layout.structure import check_structure
from vsup.layout.vllm_flags import flags_for_command

_NO_LOAD_TRACKING = "--no-" + LOAD_TRACKING_FLAG[2:]
_LOAD_TRACKING_FLAGS = (LOAD_TRACKING_FLAG, _NO_LOAD_TRACKING)


def _env_str(v: Any) -> str:
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def spec_from_merged(m: MergedInstance, layout: Layout) -> InstanceSpec:
    """The engine's InstanceSpec for one merged instance (assumes its structure checked out)."""
    v = m.values
    restart = dict(v.get("restart", {}))
    raw_args = v.get("args", {})
    args = {
        k: a
        for k, a in raw_args.items()
        if a is not False and flag_name(k) not in _LOAD_TRACKING_FLAGS
    }
    util = v.get("gpu_memory_utilization")
    return InstanceSpec(
        name=v["name"],
        model=resolve_model_path(v["model"], layout.base_dir),
        command=tuple(v["command"]),
        host=v["host"],
        port=v["port"],
        gpus=tuple(v["gpus"]),
        gpu_memory_utilization=float(util) if util is not None else None,
        args=args,
        env={k: _env_str(e) for k, e in v.get("env", {}).items()},
        api_key_env=v.get("api_key_env"),
        restart=RestartPolicy(
            policy=restart.get("policy", RestartPolicy.policy),
            backoff_s=float(restart.get("backoff_s", RestartPolicy.backoff_s)),
            backoff_max_s=float(restart.get("backoff_max_s", RestartPolicy.backoff_max_s)),
            stable_s=float(restart.get("stable_s", RestartPolicy.stable_s)),
            max_failures=int(restart.get("max_failures", RestartPolicy.max_failures)),
            on_stall=bool(restart.get("on_stall", RestartPolicy.on_stall)),
        ),
        start_timeout_s=float(v["start_timeout_s"]),
        stop_grace_s=float(v["stop_grace_s"]),
        drain_timeout_s=float(v["drain_timeout_s"]),
        health_interval_s=float(v["health_interval_s"]),
        unhealthy_after=int(v["unhealthy_after"]),
        unhealthy_grace_s=float(v["unhealthy_grace_s"]),
        stall_after_s=float(v.get("stall_after_s", InstanceSpec.stall_after_s)),
        canary_interval_s=float(v.get("canary_interval_s", InstanceSpec.canary_interval_s)),
        rest_interval_s=float(v.get("rest_interval_s", InstanceSpec.rest_interval_s)),
        load_tracking=load_tracking(raw_args, v["command"]),
        profiles=tuple(layout.profiles),
        revision=v.get("revision"),
        hf_token_env=v.get("hf_token_env"),
        pull=bool(v.get("pull", True)),
        sleep=sleep_spec(v.get("sleep")),
        swap_group=v.get("swap_group"),
    )


def sleep_spec(table: dict[str, Any] | None) -> SleepSpec | None:
    """The instance's `sleep` table as a SleepSpec; None without one (sleep mode off)."""
    if table is None:
        return None
    return SleepSpec(
        level=int(table.get("level", SleepSpec.level)),
        after_idle_s=float(table.get("after_idle_s", SleepSpec.after_idle_s)),
        start=table.get("start"),
        public_dev_mode=bool(table.get("public_dev_mode", False)),
        recycle_growth_gib=float(table.get("recycle_growth_gib", 0.0)),
    )


def load_tracking(args: dict[str, Any], command: Sequence[str]) -> bool:
    """Whether vsup adds `--enable-server-load-tracking` (stall detection reads `/load`):
    as `args` says when it names the flag (`= false`, or `no-... = true`, turns it off), else
    when the instance's vLLM has the flag. vsup's frozen flag list, used when no vLLM is found,
    does not count: an unknown flag would stop vLLM at start."""
    for key, value in args.items():
        name = flag_name(key)
        if name == LOAD_TRACKING_FLAG:
            return value is not False
        if name == _NO_LOAD_TRACKING:
            return value is False
    flags = flags_for_command(list(command))
    return not flags.frozen and flags.knows(LOAD_TRACKING_FLAG[2:])


def resolve_specs(layout: Layout, profile_dirs: Sequence[Path] | None = None) -> list[InstanceSpec]:
    """Layout.resolve: the specs, or LayoutError with every error that prevents building them
    (the structure checks; validation's rules are not needed to build)."""
    cache = profile_cache_for(layout, profile_dirs)
    diagnostics = check_structure(layout, cache)
    if any(d.is_error for d in diagnostics):
        raise LayoutError(diagnostics)
    specs = [spec_from_merged(m, layout) for m in merge_instances(layout, cache)]
    return bind_cpu_instances(specs)  # CPU instances get cores of their own (cpubind.py)
