"""What vLLM's start-up log says about its GPU memory: its target and the parts of it.

vLLM sizes its KV cache so that what its allocator sees fits `gpu_memory_utilization` x the
GPU's memory; the CUDA context, kernels loaded later and (in some versions) CUDA graphs come on
top. Its worker logs the parts once it has captured its CUDA graphs (vllm/v1/worker/
gpu_worker.py, `compile_or_warm_up_model`), one line per worker process:

- 0.26: `Free memory on device (139.29/139.8 GiB) on startup. Desired GPU memory utilization is
  (0.45, 62.91 GiB). Actual usage is 2.79 GiB for weight, 0.56 GiB for peak activation, 0.22 GiB
  for non-torch memory, and 0.45 GiB for CUDAGraph memory. Replace ...`
- 0.32: `... Actual usage is 3.01 GiB for consumed memory (weights + non-torch), 0.56 GiB for peak
  activation, and 0.45 GiB for CUDAGraph memory. ...` (weights then come from `Model loading
  took 2.79 GiB memory and 1.9 seconds`, 0.32; `Model loading took 2.79 GiB and ...`, 0.26)
- both: `Available KV cache memory: 59.33 GiB`, `Graph capturing finished in 2 secs, took 0.45
  GiB` (the CUDA graph pool when the long line is missing: `--enforce-eager` captures nothing).
- older releases (0.8-0.9): `model weights take 2.79GiB; non_torch_memory takes 0.22GiB; PyTorch
  activation peak memory takes 0.56GiB; the rest of the memory reserved for KV Cache is ...`

Lines of several workers (TP > 1: `(Worker_TP0 pid=..)`, `(Worker_TP1 pid=..)`) are kept apart
by that prefix and summed: the instance's HBM figure is summed over its processes too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

GiB = 1024**3

_NUM = r"([0-9]+(?:\.[0-9]+)?)"
_WORKER = re.compile(r"^\s*\(([A-Za-z_][\w-]*) pid=\d+\)")
_DESIRED = re.compile(
    r"Free memory on device \(" + _NUM + r"/" + _NUM + r" GiB\) on startup\. "
    r"Desired GPU memory utilization is \(" + _NUM + r", " + _NUM + r" GiB\)"
)
_ACTUAL_026 = re.compile(
    r"Actual usage is "
    + _NUM
    + r" GiB for weight, "
    + _NUM
    + r" GiB for peak activation, "
    + _NUM
    + r" GiB for non-torch memory, and "
    + _NUM
    + r" GiB for CUDAGraph memory"
)
_ACTUAL_032 = re.compile(
    r"Actual usage is "
    + _NUM
    + r" GiB for consumed memory \(weights \+ non-torch\), "
    + _NUM
    + r" GiB for peak activation, and "
    + _NUM
    + r" GiB for CUDAGraph memory"
)
_KV = re.compile(r"Available KV cache memory: " + _NUM + r" GiB")
_LOADED = re.compile(r"Model loading took " + _NUM + r" ?GiB")
_GRAPHS = re.compile(r"Graph capturing finished in [0-9.]+ secs?, took " + _NUM + r" GiB")
_OLD = re.compile(
    r"model weights take " + _NUM + r" ?GiB; non_torch_memory takes " + _NUM + r" ?GiB; "
    r"PyTorch activation peak memory takes " + _NUM + r" ?GiB"
)


def _b(text: str) -> int:
    return int(float(text) * GiB)


@dataclass
class WorkerMemory:
    """One worker process's figures (bytes; None where its log did not say)."""

    utilization: float | None = None
    requested: int | None = None  # utilization x the total memory CUDA reports
    free_at_start: int | None = None
    total: int | None = None
    weights: int | None = None
    activation: int | None = None
    non_torch: int | None = None
    consumed: int | None = None  # 0.32: weights + non-torch together
    cudagraph: int | None = None
    kv_cache: int | None = None
    profiled: bool = False  # the long memory line was seen

    def non_torch_bytes(self) -> int | None:
        if self.non_torch is not None:
            return self.non_torch
        if self.consumed is not None and self.weights is not None:
            return max(0, self.consumed - self.weights)
        return None


@dataclass(frozen=True)
class MemoryProfile:
    """An instance's memory as its vLLM logged it, summed over its worker processes."""

    workers: int
    utilization: float | None
    requested_bytes: int | None
    weights_bytes: int | None
    activation_bytes: int | None
    non_torch_bytes: int | None
    cudagraph_bytes: int | None
    kv_cache_bytes: int | None
    profiled: bool  # every worker logged the long memory line

    def fields(self) -> dict[str, int | None]:
        """The `InstanceStatus` keys for these figures (snapshot schema 1 additions)."""
        return {
            "vllm_requested_hbm_bytes": self.requested_bytes,
            "vllm_weights_bytes": self.weights_bytes,
            "vllm_activation_bytes": self.activation_bytes,
            "vllm_non_torch_bytes": self.non_torch_bytes,
            "vllm_cudagraph_bytes": self.cudagraph_bytes,
            "vllm_kv_cache_bytes": self.kv_cache_bytes,
        }


EMPTY_FIELDS = {
    "vllm_requested_hbm_bytes": None,
    "vllm_weights_bytes": None,
    "vllm_activation_bytes": None,
    "vllm_non_torch_bytes": None,
    "vllm_cudagraph_bytes": None,
    "vllm_kv_cache_bytes": None,
}


class MemoryLines:
    """Feed it start-up log lines in order; `profile()` sums what the workers said."""

    def __init__(self) -> None:
        self._workers: dict[str, WorkerMemory] = {}

    def feed(self, line: str) -> bool:
        """Take one line; True when it carried a memory figure."""
        if "GiB" not in line:
            return False
        m = _WORKER.match(line)
        key = m.group(1) if m else ""
        w = self._workers.get(key)
        found = self._parse(line, w if w is not None else WorkerMemory())
        if found is not None and w is None:
            self._workers[key] = found
        return found is not None

    @staticmethod
    def _parse(line: str, w: WorkerMemory) -> WorkerMemory | None:
        if m := _DESIRED.search(line):
            w.free_at_start, w.total = _b(m.group(1)), _b(m.group(2))
            w.utilization, w.requested = float(m.group(3)), _b(m.group(4))
            if a := _ACTUAL_026.search(line):
                w.weights, w.activation = _b(a.group(1)), _b(a.group(2))
                w.non_torch, w.cudagraph = _b(a.group(3)), _b(a.group(4))
            elif a := _ACTUAL_032.search(line):
                w.consumed, w.activation, w.cudagraph = (_b(a.group(i)) for i in (1, 2, 3))
            w.profiled = True
            return w
        if m := _KV.search(line):
            w.kv_cache = _b(m.group(1))
            return w
        if m := _LOADED.search(line):
            w.weights = w.weights if w.weights is not None else _b(m.group(1))
            return w
        if m := _GRAPHS.search(line):
            w.cudagraph = w.cudagraph if w.cudagraph is not None else _b(m.group(1))
            return w
        if m := _OLD.search(line):
            w.weights, w.non_torch, w.activation = (_b(m.group(i)) for i in (1, 2, 3))
            w.profiled = True
            return w
        return None

    def profile(self) -> MemoryProfile | None:
        """The figures so far, or None before any memory line."""
        workers = list(self._workers.values())
        if not workers:
            return None

        def total(values: list[int | None]) -> int | None:
            return None if any(v is None for v in values) else sum(v for v in values)  # type: ignore[misc]

        utils = {w.utilization for w in workers if w.utilization is not None}
        return MemoryProfile(
            workers=len(workers),
            utilization=utils.pop() if len(utils) == 1 else None,
            requested_bytes=total([w.requested for w in workers]),
            weights_bytes=total([w.weights for w in workers]),
            activation_bytes=total([w.activation for w in workers]),
            non_torch_bytes=total([w.non_torch_bytes() for w in workers]),
            cudagraph_bytes=total([w.cudagraph for w in workers]),
            kv_cache_bytes=total([w.kv_cache for w in workers]),
            profiled=all(w.profiled for w in workers),
        )
