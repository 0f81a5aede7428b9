"""Values the unit tests build over and over, with one set of defaults.

`instance_spec()` is a CPU instance of `vllm serve` on 127.0.0.1:8000 with every other key at
InstanceSpec's own default; a test names only the keys it is about:
`instance_spec("b", port=8001, gpus=(0, 1))`. A file whose tests share other values binds them
once: `spec = partial(instance_spec, host="0.0.0.0")` (a keyword given later still wins).
"""

from __future__ import annotations

from typing import Any

from vsup.layout.spec import InstanceSpec


def instance_spec(name: str = "a", **overrides: Any) -> InstanceSpec:
    """An InstanceSpec named `name`: the defaults above, then `overrides` (any InstanceSpec key)."""
    keys: dict[str, Any] = {
        "model": "/m",
        "command": ("vllm", "serve"),
        "host": "127.0.0.1",
        "port": 8000,
        "gpus": (),
        "gpu_memory_utilization": None,
    }
    keys.update(overrides)
    return InstanceSpec(name=name, **keys)
