"""Layouts: the TOML model, profiles, validation, the compiled layout and `vsup plan`
(docs/layout.md).

The names other packages use:

    compiled, diagnostics = compile_layout(text, path, node)  # None on errors; errors first
    compiled.specs, .router, .alerts, .metrics_listen, .rollout, .layout   # see compiled.py
    layout = load_layout(path)                       # never raises; layout.load_errors
    diagnostics = validate(layout, node=node)        # errors first; Diagnostic.format()
    save_layout(layout.with_instance(table), path)   # atomic; refuses an invalid layout

`node` is a `NodeFacts` (node.py) the caller got from `vsup.telemetry.gpu.node_facts()`: the
layout package itself never touches a GPU.
"""

from vsup.layout.compiled import (
    CompiledLayout,
    LayoutSettings,
    RolloutSettings,
    compile_document,
    compile_file,
    compile_layout,
    layout_settings,
)
from vsup.layout.diagnostics import Diagnostic, LayoutError
from vsup.layout.model import Layout, dumps_layout, load_layout, loads_layout
from vsup.layout.node import NodeFacts, NodeGpu
from vsup.layout.spec import InstanceSpec, RestartPolicy
from vsup.layout.store import save_layout
from vsup.layout.validate import validate

__all__ = [
    "CompiledLayout",
    "Diagnostic",
    "InstanceSpec",
    "Layout",
    "LayoutError",
    "LayoutSettings",
    "NodeFacts",
    "NodeGpu",
    "RestartPolicy",
    "RolloutSettings",
    "compile_document",
    "compile_file",
    "compile_layout",
    "dumps_layout",
    "layout_settings",
    "load_layout",
    "loads_layout",
    "save_layout",
    "validate",
]
