"""Fixtures for the layout tests: isolated profile lookup and no GPU probing."""

from __future__ import annotations

from pathlib import Path

import pytest

import vsup.telemetry.gpu
from vsup.layout.node import NodeFacts

REPO = Path(__file__).resolve().parents[3]
CONFIGS = REPO / "configs"
LAYOUTS = REPO / "layouts"


@pytest.fixture(autouse=True)
def no_gpu_probe(monkeypatch: pytest.MonkeyPatch):
    """Tests never read this machine's GPUs: the commands' probe finds none (the layout
    package itself takes node facts as a value and never probes)."""
    monkeypatch.delenv("VSUP_PROFILE_PATH", raising=False)
    monkeypatch.setattr(vsup.telemetry.gpu, "node_facts", lambda probe=None: NodeFacts())


@pytest.fixture
def write(tmp_path: Path):
    """Write a layout text into tmp_path and return its path."""

    def _write(text: str, name: str = "layout.toml") -> Path:
        p = tmp_path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        return p

    return _write
