"""Layouts: the TOML model, profiles, validation and `vsup plan` (docs/layout.md).

The names other packages use:

    layout = load_layout(path)                       # never raises; layout.load_errors
    diagnostics = validate(layout, node_gpus=None)   # errors first; Diagnostic.format()
    specs = layout.resolve()                         # list[InstanceSpec]; LayoutError
    save_layout(layout.with_instance(table), path)   # atomic; refuses an invalid layout
"""

from vsup.layout.diagnostics import Diagnostic, LayoutError
from vsup.layout.model import Layout, dumps_layout, load_layout, loads_layout
from vsup.layout.spec import InstanceSpec, RestartPolicy
from vsup.layout.store import save_layout
from vsup.layout.validate import validate

__all__ = [
    "Diagnostic",
    "InstanceSpec",
    "Layout",
    "LayoutError",
    "RestartPolicy",
    "dumps_layout",
    "load_layout",
    "loads_layout",
    "save_layout",
    "validate",
]
