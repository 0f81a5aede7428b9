"""Telemetry -> the status snapshot's instance keys (`status --json` schema 1).

The daemon merges these into each `InstanceStatus` (`status.with_wire(**fields)`);
`vsup probe` builds a whole instance from them. Unknown stays None.
"""

from __future__ import annotations

from typing import Any

from vsup.telemetry.backend import BackendInfo
from vsup.telemetry.hbm import HbmFigure
from vsup.telemetry.metrics import VllmMetrics
from vsup.telemetry.rates import Rates


def telemetry_fields(
    metrics: VllmMetrics | None,
    rates: Rates | None = None,
    backend: BackendInfo | None = None,
    hbm: HbmFigure | None = None,
) -> dict[str, Any]:
    """The `InstanceStatus` fields telemetry owns, from the latest scrape, the rates, the
    backend and the HBM figure. `backend` is the label people know (AITER MHA, FLASH_ATTN);
    `backend_name` the enum name `--attention-backend` takes."""
    m = metrics if metrics is not None else VllmMetrics()
    r = rates if rates is not None else Rates()
    fields: dict[str, Any] = {
        "kv_cache_usage": m.kv_cache_usage,
        "kv_capacity_tokens": m.kv_capacity_tokens,
        "preemptions_total": m.preemptions_total,
        "preemptions_per_min": r.preemptions_per_min,
        "requests_running": m.requests_running,
        "requests_waiting": m.requests_waiting,
        "generation_tokens_per_s": r.generation_tokens_per_s,
        "prompt_tokens_per_s": r.prompt_tokens_per_s,
        "prefix_cache_hit_rate": (
            r.prefix_cache_hit_rate
            if r.prefix_cache_hit_rate is not None
            else m.prefix_cache_hit_rate
        ),
        "backend": backend.label if backend else None,
        "backend_source": backend.source if backend else None,
        "backend_name": backend.name if backend else None,
    }
    if hbm is not None:
        fields["hbm_bytes"] = hbm.bytes
        fields["hbm_source"] = hbm.source
    return fields
