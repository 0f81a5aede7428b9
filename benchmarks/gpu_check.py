"""Check the NVML probe against nvidia-smi on a real NVIDIA node (run it where there is a GPU).

    python benchmarks/gpu_check.py [--plan 0:4,0:10,1:6] [--tolerance 0.01]

Starts one process per `GPU:GiB` item of the plan (default: two co-tenants on GPU 0 holding
4 and 10 GiB, one on GPU 1 holding 6 GiB; GPU 1's item is dropped on a one-GPU node). Each
allocates that much device memory (torch when importable, else the CUDA driver API through
libcuda.so.1) and holds it until this script ends. Then it prints, side by side:
- per process: vsup's probe (`NvmlProbe`), `nvidia-smi --query-compute-apps=pid,used_memory`,
  and the allocation, plus vsup's per-instance attribution (`hbm.attribute`) for each holder;
- per GPU: the probe's used/total and `nvidia-smi --query-gpu=index,memory.used,memory.total`;
- how long one probe snapshot takes.
It exits 1 when a probe figure and nvidia-smi's differ by more than the tolerance (1%), when a
holder is missing from either list, or when attribution is not "process" with the probe's bytes.

Where NVML and nvidia-smi legitimately differ (and why the comparison allows for it):
- nvidia-smi prints whole MiB; the probe has bytes. A difference under 1 MiB is rounding.
- Per-GPU `used`: the probe reads `nvmlDeviceGetMemoryInfo(h, version=nvmlMemory_v2)`, whose
  `used` excludes the driver's reserved memory. Recent nvidia-smi (R510+) also reports reserved
  separately and `memory.used` without it; an older nvidia-smi includes it (NVML v1 `used`).
  On a mismatch the script prints NVML's v1 `used` too, so that gap is recognisable; it
  still counts as a mismatch.
- Per-process `used_memory` includes the process's CUDA context (some hundreds of MiB), so it
  exceeds the allocation; the allocation is only checked as a lower bound.
- Both read live counters a few milliseconds apart; the holders allocate once and then sit
  still, so their figures do not move between the two reads.
"""

from __future__ import annotations

import argparse
import csv
import ctypes
import io
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from vsup.telemetry.gpu.base import GpuSample  # noqa: E402

MiB = 2**20
GiB = 2**30


def hold(nbytes: int) -> None:
    """Child mode: allocate `nbytes` on the (only visible) GPU, say so, wait for stdin EOF."""
    keep: object
    try:
        import torch

        keep = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        how = "torch"
    except ImportError:
        cuda = ctypes.CDLL("libcuda.so.1")

        def check(status: int, what: str) -> None:
            if status != 0:
                raise SystemExit(f"{what} failed with CUresult {status}")

        dev, ctx, ptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
        check(cuda.cuInit(0), "cuInit")
        check(cuda.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
        check(cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev), "cuCtxCreate")
        check(cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(nbytes)), "cuMemAlloc")
        keep = ptr
        how = "libcuda"
    print(f"ready {os.getpid()} {how}", flush=True)
    sys.stdin.read()
    del keep


def smi(query: str, fields: str) -> list[dict[str, str]]:
    out = subprocess.run(
        ["nvidia-smi", f"--query-{query}={fields}", "--format=csv,noheader,nounits"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    names = fields.split(",")
    rows = []
    for row in csv.reader(io.StringIO(out)):
        if row:
            rows.append({k: v.strip() for k, v in zip(names, row, strict=False)})
    return rows


def close_enough(probe_bytes: int | None, smi_mib: float, tolerance: float) -> bool:
    if probe_bytes is None:
        return False
    smi_bytes = smi_mib * MiB
    return abs(probe_bytes - smi_bytes) <= max(tolerance * max(smi_bytes, 1), MiB)


def _mib(value: int | None) -> str:
    return "-" if value is None else f"{value / MiB:.1f}"


def compare_processes(
    held: list[tuple[int, int, int]],
    samples: Sequence[GpuSample],
    apps: list[dict[str, str]],
    tolerance: float,
) -> tuple[list[str], list[str]]:
    """Each holder (gpu, pid, allocated bytes): the probe's per-pid bytes against nvidia-smi's
    `used_memory` (MiB), and at least the allocation. Returns printable lines and failures."""
    by_index = {s.index: s for s in samples}
    smi_by_pid = {int(a["pid"]): a for a in apps if a.get("pid", "").isdigit()}
    lines, failures = [], []
    for gpu, pid, nbytes in held:
        sample = by_index.get(gpu)
        mine = None
        if sample is not None:
            mine = next((x.hbm_bytes for x in sample.processes if x.pid == pid), None)
        theirs = smi_by_pid.get(pid)
        smi_mib = float(theirs["used_memory"]) if theirs else None
        ok = (
            smi_mib is not None
            and close_enough(mine, smi_mib, tolerance)
            and mine is not None
            and mine >= nbytes
        )
        if not ok:
            failures.append(
                f"GPU {gpu} pid {pid}: probe {mine} B, nvidia-smi {smi_mib} MiB, "
                f"allocated {nbytes} B"
            )
        lines.append(
            f"  {gpu} {pid} | {_mib(mine)} | {smi_mib} | {nbytes / MiB:.0f} | "
            f"{'ok' if ok else 'MISMATCH'}"
        )
    return lines, failures


def compare_all_pids(
    samples: Sequence[GpuSample],
    apps: list[dict[str, str]],
    gpus_smi: list[dict[str, str]],
    tolerance: float,
) -> tuple[list[str], list[str]]:
    """Every (GPU, pid) nvidia-smi lists must be in the probe's list with the same memory, and
    the other way round. Pids are compared as both report them (host pids in a container)."""
    index_of_bus = {_bdf(g["pci.bus_id"]): int(g["index"]) for g in gpus_smi}
    theirs: dict[tuple[int, int], float] = {}
    for a in apps:
        if a.get("pid", "").isdigit() and _bdf(a["gpu_bus_id"]) in index_of_bus:
            theirs[(index_of_bus[_bdf(a["gpu_bus_id"])], int(a["pid"]))] = float(a["used_memory"])
    mine = {(s.index, x.pid): x.hbm_bytes for s in samples for x in s.processes}
    lines, failures = [], []
    for key in sorted(set(theirs) | set(mine)):
        ok = key in theirs and key in mine and close_enough(mine[key], theirs[key], tolerance)
        if not ok:
            failures.append(
                f"GPU {key[0]} pid {key[1]}: probe {mine.get(key, 'absent')} B, "
                f"nvidia-smi {theirs.get(key, 'absent')} MiB"
            )
        lines.append(
            f"  {key[0]} {key[1]} | {_mib(mine.get(key))} | {theirs.get(key, '-')} | "
            f"{'ok' if ok else 'MISMATCH'}"
        )
    return lines, failures


def expected_source(gpu: int, pid: int, held: list[tuple[int, int, int]], visible: bool) -> str:
    """What `hbm.attribute` must answer for a holder: its own process figure when NVML shows
    our pids; otherwise the device figure when it is alone on its GPU, else unavailable."""
    if visible:
        return "process"
    alone = sum(1 for g, _p, _n in held if g == gpu) == 1
    return "device" if alone else "unavailable"


def _bdf(bus_id: str) -> str:
    from vsup.telemetry.gpu.nvml import _bdf as normalise

    return normalise(bus_id.strip()) or ""


def compare_gpus(
    samples: Sequence[GpuSample], gpus_smi: list[dict[str, str]], tolerance: float
) -> tuple[list[str], list[str]]:
    """Each GPU nvidia-smi lists: the probe's used and total bytes against its MiB."""
    by_index = {s.index: s for s in samples}
    lines, failures = [], []
    for row in gpus_smi:
        idx = int(row["index"])
        sample = by_index.get(idx)
        if sample is None:
            failures.append(f"GPU {idx} missing from the probe")
            lines.append(f"  {idx} | missing from the probe | MISMATCH")
            continue
        used_ok = close_enough(sample.hbm_used_bytes, float(row["memory.used"]), tolerance)
        total_ok = close_enough(sample.hbm_total_bytes, float(row["memory.total"]), tolerance)
        ok = used_ok and total_ok
        if not ok:
            failures.append(
                f"GPU {idx}: probe used {sample.hbm_used_bytes} B total "
                f"{sample.hbm_total_bytes} B; nvidia-smi used "
                f"{row['memory.used']} MiB total {row['memory.total']} MiB"
            )
        lines.append(
            f"  {idx} {sample.bdf} | {_mib(sample.hbm_used_bytes)}/"
            f"{_mib(sample.hbm_total_bytes)} | {row['memory.used']}/"
            f"{row['memory.total']} | {'ok' if ok else 'MISMATCH'}"
        )
    return lines, failures


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--plan",
        default="0:4,0:10,1:6",
        help="GPU:GiB items, one holder process each (default 0:4,0:10,1:6)",
    )
    ap.add_argument("--tolerance", type=float, default=0.01)
    ap.add_argument("--hold", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.hold is not None:
        hold(args.hold)
        return 0

    if shutil.which("nvidia-smi") is None:
        print("gpu_check: nvidia-smi is not on PATH; run this on an NVIDIA node", file=sys.stderr)
        return 2
    from vsup.telemetry.gpu import GpuProbeError
    from vsup.telemetry.gpu.nvml import NvmlProbe
    from vsup.telemetry.hbm import InstanceRef, ProcessTable, attribute

    try:
        probe = NvmlProbe()
    except GpuProbeError as exc:
        print(f"gpu_check: {exc} (pip install nvidia-ml-py)", file=sys.stderr)
        return 2
    plan = [
        (int(g), int(float(s) * GiB)) for g, s in (item.split(":") for item in args.plan.split(","))
    ]
    plan = [(g, n) for g, n in plan if g < probe.count]
    if not plan:
        print(f"gpu_check: no plan item fits this node's {probe.count} GPU(s)", file=sys.stderr)
        return 2

    holders: list[tuple[int, int, subprocess.Popen]] = []
    failures: list[str] = []
    try:
        for gpu, nbytes in plan:
            env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(gpu), CUDA_DEVICE_ORDER="PCI_BUS_ID")
            p = subprocess.Popen(
                [sys.executable, __file__, "--hold", str(nbytes)],
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            holders.append((gpu, nbytes, p))
        for gpu, nbytes, p in holders:
            line = p.stdout.readline().split()
            if not line or line[0] != "ready":
                raise SystemExit(f"gpu_check: the holder for GPU {gpu} failed to allocate")
            print(f"holder pid {p.pid} on GPU {gpu}: {nbytes / GiB:.2f} GiB via {line[2]}")

        t0 = time.perf_counter()
        samples = probe.snapshot()
        probe_ms = (time.perf_counter() - t0) * 1e3
        apps = smi("compute-apps", "pid,used_memory,gpu_bus_id")
        gpus_smi = smi("gpu", "index,pci.bus_id,memory.used,memory.total")
        timings = []
        for _ in range(100):
            t0 = time.perf_counter()
            probe.snapshot()
            timings.append((time.perf_counter() - t0) * 1e3)

        by_index = {s.index: s for s in samples}
        held = [(gpu, p.pid, nbytes) for gpu, nbytes, p in holders]
        lines, bad = compare_all_pids(samples, apps, gpus_smi, args.tolerance)
        print("\nevery GPU process: gpu pid | probe MiB | nvidia-smi MiB | ok")
        print("\n".join(lines))
        failures += bad
        visible = any(x.pid == pid for _g, pid, _n in held for s in samples for x in s.processes)
        if visible:
            lines, bad = compare_processes(held, samples, apps, args.tolerance)
            print("\nholders: gpu pid | probe MiB | nvidia-smi MiB | allocated MiB | ok")
            print("\n".join(lines))
            failures += bad
        else:
            print(
                "\nNVML lists none of the holders' pids: this runs in another pid namespace "
                "(a container); per-instance figures must fall back as hbm.py describes"
            )
        lines, bad = compare_gpus(samples, gpus_smi, args.tolerance)
        print("\nper GPU: index bus | probe used/total MiB | nvidia-smi used/total MiB | ok")
        print("\n".join(lines))
        failures += bad
        if bad:
            import pynvml

            for idx in range(probe.count):
                v1 = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(idx))
                print(f"  GPU {idx}: NVML v1 used (with reserved) {v1.used / MiB:.0f} MiB")

        print("\nattribution (each holder as an instance): name | bytes | source | expected")
        refs = [InstanceRef(f"holder{p.pid}", p.pid, (gpu,)) for gpu, _n, p in holders]
        att = attribute(refs, samples, ProcessTable.scan())
        for (gpu, _n, p), ref in zip(holders, refs, strict=False):
            fig = att.instances[ref.name]
            want = expected_source(gpu, p.pid, held, visible)
            per_pid = next((x.hbm_bytes for x in by_index[gpu].processes if x.pid == p.pid), None)
            want_bytes = {
                "process": per_pid,
                "device": by_index[gpu].hbm_used_bytes,
                "unavailable": None,
            }[want]
            ok = fig.source == want and fig.bytes == want_bytes
            if not ok:
                failures.append(f"{ref.name}: attribution {fig}, expected {want} {want_bytes}")
            print(
                f"  {ref.name} | {fig.bytes} | {fig.source} | {want} {'ok' if ok else 'MISMATCH'}"
            )
        if att.foreign:
            print(f"  foreign processes on the GPUs: {[(f.gpu, f.pid) for f in att.foreign]}")

        print(
            f"\nprobe snapshot of {probe.count} GPU(s): first {probe_ms:.2f} ms, "
            f"median {statistics.median(timings):.3f} ms"
        )
    finally:
        for _gpu, _n, p in holders:
            if p.stdin:
                p.stdin.close()
        for _gpu, _n, p in holders:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        probe.close()
    if failures:
        print("\nFAILED:\n  " + "\n  ".join(failures))
        return 1
    print(
        f"\nall probe figures match nvidia-smi within {args.tolerance:.0%} (or 1 MiB of rounding)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
