"""GPUs whose memory is what the vLLM emulators hold in their fake HBM (sleep mode's accounting).

The emulator (`tests/programs/vllm_emulator.py --fake-hbm-file F --fake-hbm-gib G`) writes the
GPU memory it would hold to F: G GiB awake, a small remainder asleep, G again after a wake. Here
those files become NVML's view of the GPUs: `FakeHbmGpus.probe()` is the real `NvmlProbe` over
the faithful pynvml fake (tests/unit/telemetry/gpu_fakes.py), whose process list and `used`
memory are read from the files at each memory or process call. So the daemon's Monitor
attributes the memory to instances exactly as on a node (by pid against the real process
table), and a sleep shows up as memory released, a `--sleep-keeps-memory` sleep as memory kept.

Usage in a daemon test::

    gpus = FakeHbmGpus(tmp_path / "hbm", count=1)
    daemon, client = await daemons.start(gpu_probe=gpus.probe())
    # in the layout, per instance on GPU 0:  args = { <gpus.toml_args(0, "a", 64.6)> }

A file whose pid is gone (or a zombie) is not counted: the driver frees a dead process's memory.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vsup.telemetry.gpu.nvml import NvmlProbe

from tests.unit.telemetry.gpu_fakes import FakeNvml, NvGpu

GiB = 2**30
# What NVML shows used on an idle H200 (the NvGpu default): the driver's own, held by no process.
BASE_USED = 600 * 2**20
# The calls whose answer depends on the memory the processes hold.
_MEMORY_CALLS = ("nvmlDeviceGetMemoryInfo", "nvmlDeviceGetComputeRunningProcesses")


def _alive(pid: int) -> bool:
    """A process that holds GPU memory: it exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def read_hbm_file(path: Path) -> tuple[int, int] | None:
    """`(pid, bytes)` from one emulator's fake-HBM file; None when it is missing or unreadable
    (the emulator has not listened yet)."""
    try:
        doc = json.loads(path.read_text())
        return int(doc["pid"]), int(doc["bytes"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


class _HbmNvml(FakeNvml):
    """The pynvml fake with each GPU's processes refreshed from the fake-HBM files."""

    def __init__(self, owner: FakeHbmGpus) -> None:
        self.owner = owner
        super().__init__(owner.gpus)

    def _check(self, call: str, handle: Any = None) -> NvGpu | None:
        if handle is not None and call.startswith(_MEMORY_CALLS):
            self.owner.refresh(handle.index)
        return super()._check(call, handle)


class FakeHbmGpus:
    """`count` GPUs of `total_gib` each, their memory held by the emulators that write fake-HBM
    files under `root/gpu<index>/`."""

    def __init__(self, root: Path, count: int = 1, total_gib: float = 139.8) -> None:
        self.root = root
        self.gpus = [
            NvGpu(
                total=int(total_gib * GiB),
                used=BASE_USED,
                uuid=f"GPU-00000000-0000-0000-0000-{i:012d}",
                bus_id=f"00000000:{0x17 + i:02X}:00.0",
            )
            for i in range(count)
        ]
        for i in range(count):
            (root / f"gpu{i}").mkdir(parents=True, exist_ok=True)
        self.nvml = _HbmNvml(self)

    def file(self, gpu: int, name: str) -> Path:
        """Where the emulator of instance `name` on GPU `gpu` writes its fake HBM."""
        return self.root / f"gpu{gpu}" / f"{name}.json"

    def args(
        self, gpu: int, name: str, gib: float, keep_gib: float | None = None
    ) -> dict[str, str]:
        """The emulator's flags for it (a layout's `args` table: flag -> value)."""
        out = {"fake-hbm-file": str(self.file(gpu, name)), "fake-hbm-gib": str(gib)}
        if keep_gib is not None:
            out["sleep-keep-gib"] = str(keep_gib)
        return out

    def toml_args(self, gpu: int, name: str, gib: float, keep_gib: float | None = None) -> str:
        """`args` as the inside of a TOML inline table: `fake-hbm-file = "...", ...`."""
        return ", ".join(
            f"{k} = {json.dumps(v)}" for k, v in self.args(gpu, name, gib, keep_gib).items()
        )

    def cli_args(self, gpu: int, name: str, gib: float, keep_gib: float | None = None) -> list[str]:
        """The same flags on a command line."""
        out: list[str] = []
        for k, v in self.args(gpu, name, gib, keep_gib).items():
            out += [f"--{k}", v]
        return out

    def held(self, gpu: int) -> dict[int, int]:
        """pid -> bytes of the live processes that hold memory on `gpu` right now."""
        out: dict[int, int] = {}
        for path in sorted((self.root / f"gpu{gpu}").glob("*.json")):
            entry = read_hbm_file(path)
            if entry is not None and _alive(entry[0]):
                out[entry[0]] = out.get(entry[0], 0) + entry[1]
        return out

    def refresh(self, gpu: int) -> None:
        """NVML's process list and used memory of `gpu` from the files, now."""
        held = self.held(gpu)
        target = self.gpus[gpu]
        target.processes = sorted(held.items())
        target.used = BASE_USED + sum(held.values())

    def probe(self) -> NvmlProbe:
        """The real NVML probe over these GPUs (a daemon's `gpu_probe`)."""
        return NvmlProbe(self.nvml.module)
