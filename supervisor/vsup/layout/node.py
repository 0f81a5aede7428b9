"""How many GPUs this node has, and how much memory each: what `validate` and `plan` check against.

A small, guarded probe of its own (NVML, then amdsmi) so the layout package needs nothing from
telemetry. `set_probe()` lets the daemon point it at the telemetry GPU probe instead, and tests
at a fake. Every driver call catches any exception: a failing driver means no GPU information,
never a crash of `validate` or `plan`. Indices are the driver's physical order (what
`gpus = [...]` in a layout means: vsup sets CUDA_VISIBLE_DEVICES from them, with
CUDA_DEVICE_ORDER=PCI_BUS_ID).
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

GIB = 1024**3


@dataclass(frozen=True)
class NodeGpu:
    index: int
    name: str | None
    memory_bytes: int | None
    vendor: str  # "nvidia" | "amd"


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


def _probe_nvml() -> list[NodeGpu]:
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - NVMLError_LibraryNotFound/DriverNotLoaded without NVIDIA
        return []
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            name: Any = pynvml.nvmlDeviceGetName(handle)
            if isinstance(name, bytes):
                name = name.decode(errors="replace")
            try:
                total = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
            except Exception:  # noqa: BLE001
                total = None
            out.append(NodeGpu(i, name, total, "nvidia"))
        return out
    except Exception:  # noqa: BLE001
        return []
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def _probe_amdsmi() -> list[NodeGpu]:
    # Without ROCm's libamd_smi.so, `import amdsmi` prints to stdout and raises KeyError.
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            import amdsmi
        except Exception:  # noqa: BLE001
            return []
    try:
        amdsmi.amdsmi_init()
    except Exception:  # noqa: BLE001
        return []
    try:
        found = []
        for order, handle in enumerate(amdsmi.amdsmi_get_processor_handles()):
            index = order
            with contextlib.suppress(Exception):
                hip_id = amdsmi.amdsmi_get_gpu_enumeration_info(handle).get("hip_id")
                if isinstance(hip_id, int) and hip_id >= 0:
                    index = hip_id
            name = None
            with contextlib.suppress(Exception):
                name = amdsmi.amdsmi_get_gpu_asic_info(handle).get("market_name")
            total = None
            with contextlib.suppress(Exception):
                total = int(
                    amdsmi.amdsmi_get_gpu_memory_total(handle, amdsmi.AmdSmiMemoryType.VRAM)
                )
            found.append(NodeGpu(index, name, total, "amd"))
        return sorted(found, key=lambda g: g.index)
    except Exception:  # noqa: BLE001
        return []
    finally:
        with contextlib.suppress(Exception):
            amdsmi.amdsmi_shut_down()


def _default_probe() -> list[NodeGpu]:
    return _probe_nvml() or _probe_amdsmi()


_probe: Callable[[], list[NodeGpu]] = _default_probe
_cached: list[NodeGpu] | None = None


def set_probe(probe: Callable[[], list[NodeGpu]] | None) -> None:
    """Use `probe` for the node's GPUs (None: the built-in NVML/amdsmi probe); clears the cache."""
    global _probe, _cached
    _probe = probe or _default_probe
    _cached = None


def node_gpus() -> list[NodeGpu]:
    """This node's GPUs ([] when none is found or no driver answers); probed once per process."""
    global _cached
    if _cached is None:
        try:
            _cached = list(_probe())
        except Exception:  # noqa: BLE001
            _cached = []
    return list(_cached)


def node_gpu_count() -> int | None:
    """How many GPUs this node has, or None when the probe finds none."""
    gpus = node_gpus()
    return len(gpus) or None
