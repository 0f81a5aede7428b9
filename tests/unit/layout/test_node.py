"""Node facts: what validation and `vsup plan` know of the GPUs, and the one probe that finds
them (`vsup.telemetry.gpu.node_facts`, over fakes of pynvml and amdsmi shaped like the real
libraries: tests/unit/telemetry/gpu_fakes.py)."""

from __future__ import annotations

import psutil
import pytest

from vsup.layout.model import loads_layout
from vsup.layout.node import NodeFacts, NodeGpu, gpu_kind
from vsup.layout.validate import validate
from vsup.telemetry import gpu as telemetry_gpu
from vsup.telemetry.gpu import NoneProbe
from vsup.telemetry.gpu.amd import AmdSmiProbe
from vsup.telemetry.gpu.nvml import NvmlProbe

from tests.unit.telemetry.gpu_fakes import AmdGpu, FakeAmdSmi, FakeNvml, NvGpu

# The real function: the layout tests' conftest replaces the module attribute.
node_facts = telemetry_gpu.node_facts

LAYOUT = """
[defaults]
model = "org/model"

[[instance]]
name = "g1"
gpus = [1]
port = 8001
"""


def test_nvml_gpus_become_node_facts() -> None:
    fake = FakeNvml([NvGpu(total=150 * 2**30), NvGpu(total=140 * 2**30)])
    facts = node_facts(NvmlProbe(fake.module))
    assert [(g.index, g.name, g.memory_bytes, g.vendor) for g in facts.gpus] == [
        (0, "NVIDIA H200", 150 * 2**30, "nvidia"),
        (1, "NVIDIA H200", 140 * 2**30, "nvidia"),
    ]
    assert facts.gpu_count == 2 and facts.gpu_memory_bytes == 140 * 2**30
    assert facts.vendor == "nvidia" and facts.gpu_names == ("NVIDIA H200",)
    assert gpu_kind(facts.gpu_names[0]) == "H200"


def test_amd_gpus_are_in_hip_order() -> None:
    fake = FakeAmdSmi([AmdGpu(bdf="0000:05:00.0", hip_id=1), AmdGpu(bdf="0000:06:00.0", hip_id=0)])
    facts = node_facts(AmdSmiProbe(fake.module))
    assert [g.index for g in facts.gpus] == [0, 1] and facts.vendor == "amd"
    assert gpu_kind(facts.gpus[0].name) == "MI300X"


def test_a_node_without_gpus_is_unknown_not_zero() -> None:
    facts = node_facts(NoneProbe())
    assert facts == NodeFacts(host_memory_bytes=facts.host_memory_bytes)
    assert facts.gpu_count is None and facts.vendor == "none"
    (w,) = validate(loads_layout(LAYOUT, "/tmp/l.toml"), node=facts)
    assert "no GPU found on this node" in w.message and not w.is_error


def test_node_facts_know_the_host_ram() -> None:
    """Level-1 sleepers keep their weights in host RAM: validation sizes them against it."""
    assert node_facts(NoneProbe()).host_memory_bytes == psutil.virtual_memory().total
    assert NodeFacts.given(2).host_memory_bytes is None  # another node's: not known


def test_a_lost_gpu_still_counts_without_its_memory() -> None:
    fake = FakeNvml([NvGpu(), NvGpu(lost=True)])
    facts = node_facts(NvmlProbe(fake.module))
    assert facts.gpu_count == 2 and facts.gpus[1].memory_bytes is None


def test_validation_checks_indices_against_the_probed_node() -> None:
    one = NodeFacts((NodeGpu(0, "NVIDIA H200", 150 * 2**30, "nvidia"),))
    (e,) = [d for d in validate(loads_layout(LAYOUT, "/tmp/l.toml"), node=one) if d.is_error]
    assert "this node has 1 GPU (0-0)" in e.message and e.instance == "g1"


def test_a_given_count_holds_even_for_zero() -> None:
    given = NodeFacts.given(0)
    assert given.gpu_count == 0 and not given.probed and given.gpu_memory_bytes is None
    (e,) = [d for d in validate(loads_layout(LAYOUT, "/tmp/l.toml"), node=given) if d.is_error]
    assert "--node-gpus says the node has 0 GPUs" in e.message
    # node_gpus=N is the same as NodeFacts.given(N)
    assert validate(loads_layout(LAYOUT, "/tmp/l.toml"), node_gpus=0) == validate(
        loads_layout(LAYOUT, "/tmp/l.toml"), node=given
    )


def test_the_commands_probe_opens_and_closes_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    closed = []

    class Probe(NoneProbe):
        vendor = "nvidia"

        def snapshot(self):
            from vsup.telemetry.gpu.base import GpuSample

            return (GpuSample(0, name="NVIDIA H100", hbm_total_bytes=80 * 2**30),)

        def close(self) -> None:
            closed.append(True)

    monkeypatch.setattr(telemetry_gpu, "open_probe", lambda vendor="auto": Probe())
    facts = node_facts()
    assert facts.gpus == (NodeGpu(0, "NVIDIA H100", 80 * 2**30, "nvidia"),) and closed == [True]


def test_the_layout_package_has_no_probe_of_its_own() -> None:
    import ast
    from pathlib import Path

    import vsup.layout

    root = Path(vsup.layout.__file__).parent
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            assert not [n for n in names if n.split(".")[0] in ("pynvml", "amdsmi")], path
