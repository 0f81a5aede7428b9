"""Rules about the environment variables an instance gets (secrets: `rules/secrets.py`)."""

from __future__ import annotations

from vsup.layout.diagnostics import WARNING, Diagnostic
from vsup.layout.merge import MergedInstance
from vsup.layout.rules.context import Context, origin_diag, parallelism


def _set_in_env(m: MergedInstance, var: str, message: str) -> list[Diagnostic]:
    return [origin_diag(WARNING, message, m, "env", var)] if var in m.env else []


def hip_visible_devices(ctx: Context, m: MergedInstance) -> list[Diagnostic]:
    return _set_in_env(
        m,
        "HIP_VISIBLE_DEVICES",
        "vLLM on ROCm reads CUDA_VISIBLE_DEVICES, and HIP_VISIBLE_DEVICES renumbers the GPUs a "
        "second time; vsup removes it: delete it from env",
    )


def cuda_visible_devices(ctx: Context, m: MergedInstance) -> list[Diagnostic]:
    return _set_in_env(
        m,
        "CUDA_VISIBLE_DEVICES",
        "vsup sets CUDA_VISIBLE_DEVICES from gpus: delete it from env and list the GPUs there",
    )


def attention_backend_env(ctx: Context, m: MergedInstance) -> list[Diagnostic]:
    return _set_in_env(
        m,
        "VLLM_ATTENTION_BACKEND",
        'recent vLLM ignores VLLM_ATTENTION_BACKEND: use args = { attention-backend = "..." }',
    )


def nccl_on_tp1(ctx: Context, m: MergedInstance) -> list[Diagnostic]:
    p = parallelism(m)
    if not (
        "NCCL_MIN_NCHANNELS" in m.env
        and m.gpus
        and p.effective_tp == 1
        and (p.pp or 1) == 1
        and p.shape.dp == 1
    ):
        return []
    return [
        origin_diag(
            WARNING,
            "NCCL_MIN_NCHANNELS only helps multi-GPU (TP>1) instances; on a TP1 instance it does "
            "nothing: remove it",
            m,
            "env",
            "NCCL_MIN_NCHANNELS",
        )
    ]
