"""The node's GPU probe: NVML first, then amdsmi, with fakes shaped like the real modules."""

from __future__ import annotations

import enum
import sys
import types

import pytest

from vsup.layout import node


class _Mem:
    """pynvml's c_nvmlMemory_t: total, free and used in bytes."""

    def __init__(self, total: int) -> None:
        self.total, self.free, self.used = total, total, 0


def fake_pynvml(names: list[str], fail_init: bool = False) -> types.ModuleType:
    m = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    class NVMLError_LibraryNotFound(NVMLError):
        pass

    m.NVMLError = NVMLError
    m.NVMLError_LibraryNotFound = NVMLError_LibraryNotFound
    m.calls = []

    def init():
        if fail_init:
            raise NVMLError_LibraryNotFound("NVML Shared Library Not Found")
        m.calls.append("init")

    m.nvmlInit = init
    m.nvmlShutdown = lambda: m.calls.append("shutdown")
    m.nvmlDeviceGetCount = lambda: len(names)
    m.nvmlDeviceGetHandleByIndex = lambda i: ("handle", i)
    m.nvmlDeviceGetName = lambda h: names[h[1]]
    m.nvmlDeviceGetMemoryInfo = lambda h: _Mem(143771 * 2**20)
    return m


def fake_amdsmi(hip_ids: list[int | str]) -> types.ModuleType:
    m = types.ModuleType("amdsmi")

    class AmdSmiMemoryType(enum.IntEnum):
        VRAM = 0
        VIS_VRAM = 1
        GTT = 2

    m.AmdSmiMemoryType = AmdSmiMemoryType
    m.amdsmi_init = lambda *a: None
    m.amdsmi_shut_down = lambda: None
    m.amdsmi_get_processor_handles = lambda: [f"h{i}" for i in range(len(hip_ids))]

    def enumeration(h):
        return {
            "drm_render": 128,
            "drm_card": 0,
            "hsa_id": 1,
            "hip_id": hip_ids[int(h[1:])],
            "hip_uuid": "GPU-x",
        }

    m.amdsmi_get_gpu_enumeration_info = enumeration
    m.amdsmi_get_gpu_asic_info = lambda h: {
        "market_name": "AMD Instinct MI300X",
        "vendor_id": "0x1002",
    }

    def total(h, kind):
        assert kind is AmdSmiMemoryType.VRAM
        return 192 * 2**30 + int(h[1:])

    m.amdsmi_get_gpu_memory_total = total
    return m


def test_nvml_gpus(monkeypatch):
    fake = fake_pynvml(["NVIDIA H200", "NVIDIA H200"])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    gpus = node._default_probe()
    assert [(g.index, g.name, g.memory_bytes, g.vendor) for g in gpus] == [
        (0, "NVIDIA H200", 143771 * 2**20, "nvidia"),
        (1, "NVIDIA H200", 143771 * 2**20, "nvidia"),
    ]
    assert fake.calls == ["init", "shutdown"]
    assert node.gpu_kind(gpus[0].name) == "H200"


def test_amdsmi_when_nvml_is_missing_ordered_by_hip_id(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([], fail_init=True))
    monkeypatch.setitem(sys.modules, "amdsmi", fake_amdsmi([1, 0, "N/A"]))
    gpus = node._default_probe()
    assert [(g.index, g.memory_bytes) for g in gpus] == [
        (0, 192 * 2**30 + 1),
        (1, 192 * 2**30),
        (2, 192 * 2**30 + 2),
    ]
    assert node.gpu_kind(gpus[0].name) == "MI300X"


def test_no_driver_means_no_gpus_and_nothing_printed(monkeypatch, capfd):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([], fail_init=True))
    monkeypatch.delitem(sys.modules, "amdsmi", raising=False)
    # The real amdsmi without ROCm's library: `import amdsmi` prints and raises KeyError here.
    assert node._probe_amdsmi() == [] or pytest.skip("ROCm is installed on this machine")
    assert node._default_probe() == []
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_probe_is_cached_and_replaceable():
    calls = []

    def probe():
        calls.append(1)
        return [node.NodeGpu(0, "x", 1, "nvidia")]

    node.set_probe(probe)
    assert node.node_gpu_count() == 1 and node.node_gpu_count() == 1
    assert calls == [1]
    node.set_probe(list)
    assert node.node_gpu_count() is None


def test_a_failing_probe_counts_as_no_gpus():
    def broken():
        raise RuntimeError("driver hiccup")

    node.set_probe(broken)
    assert node.node_gpus() == []
