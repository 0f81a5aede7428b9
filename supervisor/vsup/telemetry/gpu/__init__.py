"""GPU probes: one snapshot of every GPU per poll, from NVML, amdsmi, or nothing.

```python
probe = open_probe("auto")        # NvmlProbe, AmdSmiProbe or NoneProbe
gpus = probe.snapshot()           # tuple[GpuSample, ...], ordered by index
probe.close()
facts = node_facts()              # layout.node.NodeFacts: what validation and `vsup plan` check
```
`index` is the ordinal `CUDA_VISIBLE_DEVICES` uses for the instances vsup starts: NVML's
index (the engine sets `CUDA_DEVICE_ORDER=PCI_BUS_ID`, which makes CUDA's order NVML's), or on
AMD the HIP ordinal (amdsmi's `hip_id`, else the PCI bus order). Values a driver does not give
are None; a GPU that fails (lost, reset) gives a sample with `error` set and the values None.
No probe raises from `snapshot()`. Calls block for microseconds to milliseconds: the daemon runs
`snapshot()` in a worker thread.
"""

from __future__ import annotations

from vsup.layout.node import NodeFacts, NodeGpu, host_memory_bytes
from vsup.telemetry.gpu.base import (
    GpuProbe,
    GpuProbeError,
    GpuProcessSample,
    GpuSample,
    NoneProbe,
)


def open_probe(vendor: str = "auto") -> GpuProbe:
    """The probe for this node. "auto": NVML when it finds a GPU, else amdsmi when it finds
    one, else the "none" probe. "nvidia" / "amd" insist on that library and raise
    GpuProbeError saying what is missing; "none" never touches a GPU library."""
    if vendor == "none":
        return NoneProbe()
    if vendor not in ("auto", "nvidia", "amd"):
        raise GpuProbeError(f"unknown GPU vendor {vendor!r}: use auto, nvidia, amd or none")
    errors: list[str] = []
    if vendor in ("auto", "nvidia"):
        from vsup.telemetry.gpu.nvml import NvmlProbe

        try:
            probe = NvmlProbe()
        except GpuProbeError as exc:
            if vendor == "nvidia":
                raise
            errors.append(str(exc))
        else:
            if probe.count or vendor == "nvidia":
                return probe
            probe.close()
    if vendor in ("auto", "amd"):
        from vsup.telemetry.gpu.amd import AmdSmiProbe

        try:
            amd = AmdSmiProbe()
        except GpuProbeError as exc:
            if vendor == "amd":
                raise
            errors.append(str(exc))
        else:
            if amd.count or vendor == "amd":
                return amd
            amd.close()
    return NoneProbe(reason="; ".join(errors) or "no GPU found")


def node_facts(probe: GpuProbe | None = None) -> NodeFacts:
    """This node's GPUs as layout validation and `vsup plan` take them (index, name, memory,
    vendor). `probe`: an open probe to read (the daemon's); None opens one ("auto") and closes
    it. Never raises: no driver, or a GPU that fails, means fewer facts, not an error."""
    own = probe is None
    opened = open_probe("auto") if probe is None else probe
    try:
        samples = opened.snapshot()
    finally:
        if own:
            opened.close()
    return NodeFacts(
        tuple(NodeGpu(s.index, s.name, s.hbm_total_bytes, opened.vendor) for s in samples),
        host_memory_bytes=host_memory_bytes(),
    )


__all__ = [
    "GpuProbe",
    "GpuProbeError",
    "GpuProcessSample",
    "GpuSample",
    "NoneProbe",
    "node_facts",
    "open_probe",
]
