"""Status snapshots of plausible nodes, built from the snapshot dataclasses, for the
dashboard's tests, snapshot tests, screenshots and benchmarks (injected through
`MemoryClient`). Deterministic: the same arguments give the same snapshot; `tick` moves the
live metrics the way a loaded node's would."""

from __future__ import annotations

import math
from typing import Any

from vsup.snapshot import (
    Advice,
    GpuProcess,
    GpuStatus,
    InstanceStatus,
    LastExit,
    NodeInfo,
    StatusSnapshot,
    SupervisorInfo,
    WaitReason,
    empty_instance,
)
from vsup.states import State

H200_BYTES = 143_771 * 2**20  # what NVML reports for an H200
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def _live(
    name: str,
    index: int,
    tick: int,
    gpus: tuple[int, ...],
    gmu: float | None,
    total: int | None,
    **over: Any,
) -> InstanceStatus:
    """A ready instance under a steady load that drifts with `tick`."""
    phase = index * 0.7 + tick * 0.15
    kv = min(0.99, 0.35 + 0.25 * (1 + math.sin(phase)) / 2 + 0.02 * (index % 5))
    planned = int(gmu * total) if gmu and total else None
    values = dict(
        state="ready",
        pid=41000 + index * 13,
        port=8000 + index,
        gpus=gpus,
        model=MODEL,
        restarts=0,
        uptime_s=3 * 3600 + 754 + tick,
        run=1,
        hbm_bytes=int(planned * 0.97) if planned else None,
        hbm_source="process" if planned else "unavailable",
        planned_hbm_bytes=planned,
        gpu_memory_utilization=gmu,
        kv_cache_usage=round(kv, 4),
        kv_capacity_tokens=431_232 if gmu and gmu > 0.5 else 189_440,
        preemptions_total=0.0,
        preemptions_per_min=0.0,
        requests_running=float(24 + (index * 7 + tick) % 40),
        requests_waiting=0.0,
        generation_tokens_per_s=round(1850 + 400 * math.sin(phase), 1),
        prompt_tokens_per_s=round(5200 + 900 * math.cos(phase), 1),
        backend="FLASH_ATTN",
        backend_source="log",
        host="0.0.0.0",
        state_since_s=3 * 3600.0,
    )
    values.update(over)
    return empty_instance(name, **values)


def gpu_node(tick: int = 0, uptime_s: float = 4 * 3600 + 15 * 60) -> StatusSnapshot:
    """An 8 x H200 node: six TP1 replicas, two co-tenants on GPU 6 (one short of KV cache and
    preempting), a crash-looping instance in backoff and a foreign process on GPU 7."""
    instances = [_live(f"gpu{g}", g, tick, (g,), 0.90, H200_BYTES) for g in range(6)]
    instances[3] = _live(
        "gpu3",
        3,
        tick,
        (3,),
        0.90,
        H200_BYTES,
        state="starting",
        pid=41100,
        uptime_s=41.0 + tick,
        kv_cache_usage=None,
        kv_capacity_tokens=None,
        requests_running=None,
        requests_waiting=None,
        generation_tokens_per_s=None,
        prompt_tokens_per_s=None,
        preemptions_total=None,
        preemptions_per_min=None,
        backend=None,
        backend_source=None,
        restarts=1,
        run=2,
        hbm_bytes=int(0.41 * H200_BYTES),
        state_since_s=41.0,
        start_timeout_s=900.0,
    )
    instances.append(
        _live(
            "gpu6a",
            6,
            tick,
            (6,),
            0.45,
            H200_BYTES,
            model="Qwen/Qwen2.5-7B-Instruct",
            backend="TRITON_ATTN",
        )
    )
    instances.append(
        _live(
            "gpu6b",
            7,
            tick,
            (6,),
            0.45,
            H200_BYTES,
            model="Qwen/Qwen2.5-7B-Instruct",
            backend="TRITON_ATTN",
            kv_cache_usage=0.991,
            preemptions_total=1342.0 + 12 * tick,
            preemptions_per_min=37.5,
            requests_running=31.0,
            requests_waiting=118.0,
            generation_tokens_per_s=412.3,
            hbm_bytes=int(0.478 * H200_BYTES),
        )
    )
    instances.append(
        empty_instance(
            "gpu7",
            state="backoff",
            port=8008,
            gpus=(7,),
            model=MODEL,
            restarts=3,
            run=4,
            hbm_source="process",
            planned_hbm_bytes=int(0.90 * H200_BYTES),
            gpu_memory_utilization=0.90,
            backoff_remaining_s=37.0,
            wait=WaitReason("backoff", "next start in 37s (after oom)", remaining_s=37.0),
            state_since_s=3.0,
            host="0.0.0.0",
            last_exit=LastExit(
                code=1,
                signal=None,
                reason="oom",
                at="2026-05-11T09:41:07.512Z",
                log_excerpt="torch.OutOfMemoryError: CUDA out of memory. Tried to "
                "allocate 2.00 GiB. GPU 0 has a total capacity of 139.81 "
                "GiB of which 1.12 GiB is free.",
            ),
        )
    )
    gpus = []
    for g in range(8):
        procs = tuple(
            GpuProcess(i.lifecycle.pid, i.memory.hbm_bytes, i.name)
            for i in instances
            if g in i.gpus and i.lifecycle.pid and i.memory.hbm_bytes
        )
        if g == 7:
            procs += (GpuProcess(99_321, 3 * 2**30 + 2**29, None),)
        used = sum(p.hbm_bytes or 0 for p in procs) + 2**29
        busy = any(i.lifecycle.state == State.READY for i in instances if g in i.gpus)
        gpus.append(
            GpuStatus(
                index=g,
                name="NVIDIA H200",
                hbm_total_bytes=H200_BYTES,
                hbm_used_bytes=used,
                util_pct=(88.0 + (g * 3 + tick) % 11) if busy else 0.0,
                temp_c=(61.0 + g % 4) if busy else 34.0,
                power_w=(540.0 + 17 * g) if busy else 92.0,
                processes=procs,
            )
        )
    advice = (
        Advice(
            "kv_exhausted",
            "critical",
            "gpu6b: KV cache 99% and 37.5 preemptions/min - the KV cache is too small for "
            "this load: run fewer instances on GPU 6, raise its gpu-memory-utilization, use "
            "an fp8 KV cache or lower max-num-seqs.",
            instance="gpu6b",
            gpu=6,
        ),
        Advice(
            "hbm_over_plan",
            "warning",
            "gpu6b holds 68.7 GiB on GPU 6, above its planned 63.2 GiB (0.45 of the GPU).",
            instance="gpu6b",
            gpu=6,
        ),
        Advice(
            "foreign_process",
            "warning",
            "pid 99321 holds 3.5 GiB on GPU 7 and belongs to no instance.",
            gpu=7,
        ),
    )
    return StatusSnapshot(
        supervisor=SupervisorInfo(
            pid=40001, version="0.1.0", uptime_s=uptime_s + tick, layout="llama8b-8xtp1"
        ),
        node=NodeInfo(hostname="gpu-node-07", gpu_vendor="nvidia", gpu_count=8, cpu_count=224),
        gpus=tuple(gpus),
        instances=tuple(instances),
        advice=advice,
    )


def cpu_node(tick: int = 0) -> StatusSnapshot:
    """The demo: two CPU instances of the tiny model, one under a load that preempts."""
    model = "/home/op/.cache/vsup/tiny-llama"
    a = empty_instance(
        "cpu0",
        state="ready",
        pid=51001,
        port=8101,
        model=model,
        uptime_s=312.0 + tick,
        run=1,
        kv_cache_usage=0.42,
        kv_capacity_tokens=8192,
        preemptions_total=0.0,
        preemptions_per_min=0.0,
        requests_running=3.0,
        requests_waiting=0.0,
        generation_tokens_per_s=96.4,
        backend="CPU_ATTN",
        backend_source="default",
        host="127.0.0.1",
    )
    b = empty_instance(
        "cpu1",
        state="ready",
        pid=51044,
        port=8102,
        model=model,
        uptime_s=298.0 + tick,
        run=2,
        restarts=1,
        kv_cache_usage=0.8,
        kv_capacity_tokens=768,
        preemptions_total=13.0,
        preemptions_per_min=4.0,
        requests_running=2.0,
        requests_waiting=10.0,
        generation_tokens_per_s=41.7,
        backend="CPU_ATTN",
        backend_source="default",
        host="127.0.0.1",
        last_exit=LastExit(
            code=None,
            signal="SIGKILL",
            reason="killed",
            at="2026-05-11T09:30:00.000Z",
            log_excerpt=None,
        ),
    )
    return StatusSnapshot(
        supervisor=SupervisorInfo(
            pid=50001, version="0.1.0", uptime_s=330.0 + tick, layout="cpu-demo"
        ),
        node=NodeInfo(hostname="builder", gpu_vendor="none", gpu_count=0, cpu_count=2),
        gpus=(),
        instances=(a, b),
    )


def big_node(n: int = 64, tick: int = 0) -> StatusSnapshot:
    """`n` instances packed onto 8 GPUs (n/8 per GPU): the render benchmark's load."""
    per_gpu = max(1, n // 8)
    gmu = round(0.9 / per_gpu, 3)
    instances = tuple(
        _live(f"g{i % 8}-{i // 8:02d}", i, tick, (i % 8,), gmu, H200_BYTES) for i in range(n)
    )
    gpus = tuple(
        GpuStatus(
            index=g,
            name="NVIDIA H200",
            hbm_total_bytes=H200_BYTES,
            hbm_used_bytes=sum(i.memory.hbm_bytes or 0 for i in instances if g in i.gpus),
            util_pct=90.0,
            temp_c=63.0,
            power_w=600.0,
            processes=tuple(
                GpuProcess(i.lifecycle.pid, i.memory.hbm_bytes, i.name)
                for i in instances
                if g in i.gpus and i.lifecycle.pid is not None  # every sample instance runs
            ),
        )
        for g in range(8)
    )
    return StatusSnapshot(
        supervisor=SupervisorInfo(pid=40001, version="0.1.0", uptime_s=7200.0 + tick),
        node=NodeInfo(hostname="gpu-node-64", gpu_vendor="nvidia", gpu_count=8),
        gpus=gpus,
        instances=instances,
    )


def layout_for(snapshot: StatusSnapshot, name: str = "sample") -> str:
    """A layout TOML whose instances are the snapshot's (what a daemon running it reports)."""
    from vsup.layout.model import Layout, dumps_layout

    instances = []
    for inst in snapshot.instances:
        table: dict = {"name": inst.name, "gpus": list(inst.gpus), "port": inst.port}
        if inst.model and inst.model != MODEL:
            table["model"] = inst.model
        if inst.memory.gpu_memory_utilization is not None:
            table["gpu_memory_utilization"] = inst.memory.gpu_memory_utilization
        instances.append(table)
    defaults = {
        "model": MODEL,
        "command": ["vllm", "serve"],
        "args": {"max-model-len": 8192, "max-num-seqs": 256},
    }
    return dumps_layout(Layout.from_tables(instances, defaults, {"name": name}))
