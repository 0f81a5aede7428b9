"""Instance supervision: state machines, spawn, readiness, stop, restart policy, exit reasons,
start order. The daemon hosts `Engine` (engine.py); docs/ARCHITECTURE.md has the contract."""

from vsup.engine.engine import AdoptRecord, ApplyPlan, Engine, Instance, UnknownInstance
from vsup.engine.settings import EngineSettings

__all__ = ["AdoptRecord", "ApplyPlan", "Engine", "EngineSettings", "Instance", "UnknownInstance"]
