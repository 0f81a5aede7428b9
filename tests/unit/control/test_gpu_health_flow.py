"""A sick GPU through the daemon's poll path: NVML (fake) -> Monitor -> status JSON, advice and
Prometheus, as the daemon assembles them."""

from __future__ import annotations

import json

import pynvml
from prometheus_client.parser import text_string_to_metric_families

from vsup.control.advice import AdviceInputs, compute_advice
from vsup.control.export import render
from vsup.control.monitor import Monitor
from vsup.snapshot import NodeInfo, StatusSnapshot, SupervisorInfo, empty_instance
from vsup.telemetry.gpu.nvml import NvmlProbe

from tests.support.clock import FakeClock
from tests.unit.telemetry.gpu_fakes import FakeNvml, NvGpu

UNC_VOLATILE = (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC)


async def test_a_sick_gpu_reaches_status_json_advice_and_metrics() -> None:
    fake = FakeNvml(
        [
            NvGpu(),
            NvGpu(
                ecc={UNC_VOLATILE: 2},
                xids=[79],
                clocks_event_mask=pynvml.nvmlClocksEventReasonSwThermalSlowdown,
                sm_clock=1410,
            ),
        ]
    )
    probe = NvmlProbe(fake.module)
    mon = Monitor(FakeClock(), probe=probe)
    try:
        await mon._poll_gpus([])
    finally:
        probe.close()
    instances = (empty_instance("gpu1", state="ready", gpus=(1,)),)
    snap = StatusSnapshot(
        supervisor=SupervisorInfo(pid=1, version="x", uptime_s=1.0),
        node=NodeInfo(hostname="n", gpu_vendor="nvidia", gpu_count=2),
        gpus=mon.gpus,
        instances=instances,
        advice=compute_advice(instances, mon.gpus, AdviceInputs(recent_failures={})),
    )
    doc = json.loads(json.dumps(snap.to_json()))
    assert doc["schema"] == 1
    sick = doc["gpus"][1]["health"]
    assert sick["ecc_volatile_uncorrected"] == 2 and sick["xid_count"] == 1
    assert sick["throttle_reasons"] == ["thermal"] and sick["sm_clock_max_mhz"] == 1980.0
    assert doc["gpus"][0]["health"]["ecc_volatile_uncorrected"] == 0
    assert [(a["kind"], a["severity"], a["gpu"]) for a in doc["advice"]] == [
        ("gpu_ecc", "critical", 1),
        ("gpu_xid", "critical", 1),
        ("gpu_throttle", "warning", 1),
    ]
    assert "drain gpu1 and have the node checked" in doc["advice"][0]["message"]
    exported = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(render(snap).decode())
        for s in fam.samples
    }
    labels = (("gpu", "1"), ("gpu_name", "NVIDIA H200"))
    assert exported[("vsup_gpu_xid_errors_total", labels)] == 1
    assert exported[("vsup_gpu_throttle_active", (*labels, ("reason", "thermal")))] == 1
    assert exported[("vsup_advice_active", (("gpu", "1"), ("kind", "gpu_ecc"), ("name", ""),
                                            ("severity", "critical")))] == 1  # fmt: skip
