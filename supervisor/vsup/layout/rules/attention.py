"""Rules about the attention backend a model will get."""

from __future__ import annotations

from vsup.layout.diagnostics import ERROR, Diagnostic
from vsup.layout.merge import MergedInstance
from vsup.layout.rules.context import Context, env_flag_on, int_flag, origin_diag


def mla_aiter_block_size(ctx: Context, m: MergedInstance) -> list[Diagnostic]:
    """An MLA model with AITER on ROCm gets the AITER MLA backend, which needs --block-size 1."""
    info = ctx.model_info(m)
    if info is None or not info.is_mla or not m.gpus:
        return []
    env = m.env
    aiter = env_flag_on(env.get("VLLM_ROCM_USE_AITER", "0"))
    aiter_mla = env_flag_on(env.get("VLLM_ROCM_USE_AITER_MLA", "1"))
    backend = str(m.arg("attention-backend") or "")
    other_backend = backend and "AITER_MLA" not in backend.upper()
    if not aiter or not aiter_mla or other_backend or int_flag(m, "block-size") == 1:
        return []
    return [
        origin_diag(
            ERROR,
            f"{m.values.get('model')} uses MLA (its config has kv_lora_rank) and "
            "VLLM_ROCM_USE_AITER=1 selects the AITER MLA backend, which needs --block-size 1 "
            "(vLLM refuses to start otherwise): add block-size = 1 to args",
            m,
            "args",
            m.arg_key("block-size") or "",
        )
    ]
