"""Layouts: the TOML model, profiles, validation, the compiled layout and `vsup plan`
(docs/layout.md).

The names other packages use:

    compiled, diagnostics = compile_layout(text, path, node)  # None on errors; errors first
    compiled.specs, .router, .alerts, .metrics_listen, .rollout, .layout   # see compiled.py
    layout = load_layout(path)                       # never raises; layout.load_errors
    diagnostics = validate(layout, node=node)        # vsup.layout.validate; errors first
    save_layout(layout.with_instance(table), path)   # atomic; refuses an invalid layout

`node` is a `NodeFacts` (node.py) the caller got from `vsup.telemetry.gpu.node_facts()`: the
layout package itself never touches a GPU.

The names are imported on first use (PEP 562): a module of the package (`vsup.layout.schema`,
which the CLI reads for an instance name's rule) does not pull the whole package in with it.
`validate` is imported from its module (`from vsup.layout.validate import validate`): the
package's attribute of that name is the module once anything imports it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
]

_WHERE = {
    "CompiledLayout": "vsup.layout.compiled",
    "LayoutSettings": "vsup.layout.compiled",
    "RolloutSettings": "vsup.layout.compiled",
    "compile_document": "vsup.layout.compiled",
    "compile_file": "vsup.layout.compiled",
    "compile_layout": "vsup.layout.compiled",
    "layout_settings": "vsup.layout.compiled",
    "Diagnostic": "vsup.layout.diagnostics",
    "LayoutError": "vsup.layout.diagnostics",
    "Layout": "vsup.layout.model",
    "dumps_layout": "vsup.layout.model",
    "load_layout": "vsup.layout.model",
    "loads_layout": "vsup.layout.model",
    "NodeFacts": "vsup.layout.node",
    "NodeGpu": "vsup.layout.node",
    "InstanceSpec": "vsup.layout.spec",
    "RestartPolicy": "vsup.layout.spec",
    "save_layout": "vsup.layout.store",
}


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'vsup.layout' has no attribute {name!r}")
    value = getattr(importlib.import_module(where), name)
    globals()[name] = value
    return value
