"""Instance supervision: state machines, spawn, readiness, stop, restart policy, exit reasons,
start order. The daemon hosts `Engine` (engine.py); docs/ARCHITECTURE.md has the contract.

The names below are imported on first use (PEP 562): a module of the package (`vsup.engine.proc`,
which the CLI's liveness check reads) does not pull the whole engine in with it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vsup.engine.engine import AdoptRecord, ApplyPlan, Engine, Instance, UnknownInstance
    from vsup.engine.settings import EngineSettings

__all__ = ["AdoptRecord", "ApplyPlan", "Engine", "EngineSettings", "Instance", "UnknownInstance"]

_WHERE = {name: "vsup.engine.engine" for name in __all__} | {
    "EngineSettings": "vsup.engine.settings"
}


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'vsup.engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(where), name)
    globals()[name] = value
    return value
