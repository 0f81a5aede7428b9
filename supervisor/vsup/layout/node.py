"""What validation and `vsup plan` know of the node: its GPUs (count, names, memory, vendor)
and its host RAM.

A plain value (`NodeFacts`) handed in by the caller, so the layout package stays a library that
touches no GPU: the CLI commands and the daemon get it from the telemetry GPU probe
(`vsup.telemetry.gpu.node_facts`), `vsup validate --node-gpus N` makes one with `given(N)`, and
tests build one. Indices are the driver's physical order (what `gpus = [...]` in a layout means:
vsup sets CUDA_VISIBLE_DEVICES from them, with CUDA_DEVICE_ORDER=PCI_BUS_ID).
"""

from __future__ import annotations

from dataclasses import dataclass

import psutil

GIB = 1024**3


@dataclass(frozen=True)
class NodeGpu:
    index: int
    name: str | None
    memory_bytes: int | None
    vendor: str  # "nvidia" | "amd" | "unknown" (a count given without a probe)


@dataclass(frozen=True)
class NodeFacts:
    """The node's GPUs and where the figures came from.

    `probed`: they are this node's (a probe's findings, an empty tuple meaning "none found": GPU
    indices are then only checked to be >= 0); False: the caller said how many GPUs to check
    against (`--node-gpus N`), which holds even for 0.
    """

    gpus: tuple[NodeGpu, ...] = ()
    probed: bool = True
    # the node's RAM (level-1 sleepers keep their weights there); None: unknown, not checked
    host_memory_bytes: int | None = None

    @classmethod
    def given(cls, count: int) -> NodeFacts:
        """A node said to have `count` GPUs, of unknown kind and memory (`--node-gpus N`)."""
        return cls(tuple(NodeGpu(i, None, None, "unknown") for i in range(count)), probed=False)

    @property
    def gpu_count(self) -> int | None:
        """The GPU count to check indices against; None when a probe found none (unknown)."""
        if self.probed and not self.gpus:
            return None
        return len(self.gpus)

    @property
    def gpu_memory_bytes(self) -> int | None:
        """One GPU's memory for the estimates: the smallest GPU's, None when not known."""
        sizes = [g.memory_bytes for g in self.gpus if g.memory_bytes]
        return min(sizes) if sizes else None

    @property
    def gpu_names(self) -> tuple[str, ...]:
        """The GPUs' model names, each once, in index order."""
        return tuple(dict.fromkeys(g.name for g in self.gpus if g.name))

    @property
    def vendor(self) -> str:
        """nvidia | amd | none (no GPU) | unknown (a count given without a probe)."""
        return self.gpus[0].vendor if self.gpus else "none"


def host_memory_bytes() -> int | None:
    """This machine's RAM, for `NodeFacts.host_memory_bytes`; None when it cannot be read."""
    try:
        return int(psutil.virtual_memory().total)
    except (OSError, RuntimeError):
        return None


# The GPUs named on `vsup plan --gpu`, with the memory their drivers report.
KNOWN_GPUS: dict[str, tuple[str, int]] = {
    "MI300X": ("amd", 192 * GIB),
    "MI325X": ("amd", 256 * GIB),
    "MI355X": ("amd", 288 * GIB),
    "H200": ("nvidia", 143771 * 1024**2),
    "H100": ("nvidia", 81559 * 1024**2),
}

# Which platform profile suits a GPU model.
PLATFORM_PROFILES = {
    "MI300X": "rocm-mi300x",
    "MI325X": "rocm-mi300x",
    "MI355X": "rocm-mi355x",
    "H200": "nvidia-h200",
    "H100": "nvidia-h200",
}


def gpu_kind(name: str | None) -> str | None:
    """`"AMD Instinct MI300X"` -> "MI300X"; `"NVIDIA H200"` -> "H200"; None when unknown."""
    if not name:
        return None
    upper = name.upper().replace(" ", "")
    for kind in sorted(KNOWN_GPUS, key=len, reverse=True):
        if kind in upper:
            return kind
    return None
