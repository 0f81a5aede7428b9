"""Validation rules: what a layout that builds means, one named function per rule.

Each rule returns its diagnostics (errors: vLLM would not start, or two instances would fight
over a port or a GPU; warnings: it would start, probably not as intended). Layout rules look at
the whole layout; instance rules at one merged instance. A rule lives in the module of its
concern: `ports`, `gpus`, `parallelism`, `dataparallel`, `env`, `secrets`, `flags`, `model`,
`attention`, `kv`, `instances`, `router`, `stall`, `exporter`, `cpu`, `sleep`, `canary`,
`span`. The
structure checks (unknown keys, types, profiles) come before them, in `vsup.layout.structure`.
"""

from __future__ import annotations

from collections.abc import Callable

from vsup.layout.diagnostics import Diagnostic
from vsup.layout.merge import MergedInstance
from vsup.layout.rules import (
    attention,
    canary,
    cpu,
    dataparallel,
    env,
    exporter,
    flags,
    gpus,
    instances,
    kv,
    model,
    parallelism,
    ports,
    router,
    secrets,
    sleep,
    span,
    stall,
)
from vsup.layout.rules.context import Context

LayoutRule = Callable[[Context], list[Diagnostic]]
InstanceRule = Callable[[Context, MergedInstance], list[Diagnostic]]

LAYOUT_RULES: tuple[LayoutRule, ...] = (
    instances.no_instances,
    secrets.secret_flags,
    secrets.secret_env,
    secrets.secret_values,
    secrets.secret_in_alerts,
    flags.unknown_flags,
    ports.port_used_twice,
    ports.port_of_metrics_exporter,
    exporter.exporter_not_on_loopback,
    ports.port_privileged,
    dataparallel.dp_port_clash,
    router.router_ports,
    router.router_models,
    router.router_reachable,
    router.router_command_not_found,
    gpus.no_gpu_on_node,
    gpus.gpu_overcommitted,
    sleep.swap_group_gpus_differ,
    sleep.swap_group_of_one,
    sleep.swap_group_awake_twice,
    sleep.host_ram_for_sleepers,
    cpu.cpu_instances_outnumber_cores,
    canary.canary_keys_without_watch,
    canary.canary_max_below_watch,
    canary.canary_warmup_not_below_watch,
)

INSTANCE_RULES: tuple[InstanceRule, ...] = (
    gpus.gpu_index_negative,
    gpus.gpu_beyond_node,
    gpus.gpu_listed_twice,
    gpus.utilization_on_cpu,
    model.model_empty,
    model.local_model_missing,
    model.model_not_hub_id,
    model.local_model_incomplete,
    model.command_not_found,
    flags.shutdown_outlasts_grace,
    parallelism.tp_not_positive,
    parallelism.pp_not_positive,
    parallelism.pp_partition_mismatch,
    dataparallel.dp_not_positive,
    parallelism.tp_gpus_mismatch,
    dataparallel.dp_hybrid_lb_without_local,
    dataparallel.dp_external_lb_dense,
    dataparallel.dp_spans_nodes,
    dataparallel.dp_expert_parallel_dense,
    dataparallel.dp_moe_without_expert_parallel,
    dataparallel.dp_env_ignored,
    span.span_ranks,
    span.span_nodes,
    span.span_model_shape,
    span.span_head,
    span.span_address,
    span.span_size,
    span.span_flags_in_args,
    span.span_command,
    span.span_model,
    span.span_with_sleep,
    env.hip_visible_devices,
    env.cuda_visible_devices,
    env.attention_backend_env,
    env.nccl_on_tp1,
    parallelism.tp_for_small_model,
    attention.mla_aiter_block_size,
    model.on_the_fly_quantization,
    kv.batched_below_seqs,
    kv.kv_below_max_model_len,
    kv.kv_below_concurrency,
    stall.stall_after_too_short,
    stall.on_stall_ignored,
    stall.canary_interval,
    stall.rest_interval,
    sleep.swap_group_without_sleep,
    sleep.dev_mode_exposed,
    sleep.dev_mode_env_exposed,
    sleep.sleep_on_cpu,
    sleep.sleep_flag_unknown,
    sleep.sleep_flag_without_table,
)


def run_rules(ctx: Context) -> list[Diagnostic]:
    """Every rule's diagnostics, layout rules first, then instance rules per instance."""
    out: list[Diagnostic] = []
    for rule in LAYOUT_RULES:
        out += rule(ctx)
    for m in ctx.merged:
        for instance_rule in INSTANCE_RULES:
            out += instance_rule(ctx, m)
    return out


__all__ = ["INSTANCE_RULES", "LAYOUT_RULES", "Context", "run_rules"]
