"""Dashboard tests drive the real app with an in-memory control client (the injection
boundary, as memray and Harlequin test their TUIs): snapshots are injected, the clock is
frozen, and the refresh timer is slowed so each test decides when a refresh happens."""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable

import pytest
from textual.pilot import WaitForScreenTimeout

from vsup.snapshot import StatusSnapshot
from vsup.tui.app import DashboardApp

from tests.support import samples
from tests.support.clock import FakeClock
from tests.support.memory import MemoryClient, layout_validation

LOG_LINES = [
    "INFO 05-11 09:00:01 [api_server.py:1800] vLLM API server version 0.32.0",
    "INFO 05-11 09:00:09 [cuda.py:275] Using FLASH_ATTN attention backend out of potential "
    "backends: ['FLASH_ATTN', 'FLEX_ATTENTION']",
    "INFO 05-11 09:00:31 [api_server.py:1874] Starting vLLM server on http://0.0.0.0:8000",
]


def config_doc(name: str, port: int | None) -> dict:
    return {
        "argv": [
            "vllm",
            "serve",
            "--model",
            samples.MODEL,
            "--port",
            str(port),
            "--max-model-len",
            "8192",
        ],
        "env": {
            "CUDA_VISIBLE_DEVICES": "0",
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "VLLM_API_KEY": "****",
            "HF_TOKEN": "hf_not_masked_by_daemon",
        },
        "cache_config": {"block_size": "16", "num_gpu_blocks": "26952", "cache_dtype": "auto"},
        "spec": {"name": name},
    }


def make_client(snapshot: StatusSnapshot | None = None, **kw) -> MemoryClient:
    snap = snapshot or samples.gpu_node()
    kw.setdefault("layout_toml", samples.layout_for(snap))
    kw.setdefault("layout_path", "/srv/layouts/sample.toml")
    kw.setdefault("logs_current", {i.name: "\n".join(LOG_LINES) + "\n" for i in snap.instances})
    kw.setdefault(
        "logs_previous",
        {
            i.name: f"previous run of {i.name}\ntorch.OutOfMemoryError: CUDA out of memory\n"
            for i in snap.instances
        },
    )
    kw.setdefault("configs", {i.name: config_doc(i.name, i.port) for i in snap.instances})
    kw.setdefault("validate", layout_validation(snap.node.gpu_count))
    return MemoryClient(snapshot=snap, **kw)


def make_app(client: MemoryClient, **kw) -> DashboardApp:
    """The dashboard as an operator gets it (the layout package validates its forms), but
    with a frozen clock, no config discovery (an explicit keymap) and a timer slow enough
    that tests call `tick()` themselves."""
    kw.setdefault("clock", FakeClock())
    kw.setdefault("refresh_s", 3600.0)
    return DashboardApp(client, **kw)


@pytest.fixture
def client() -> MemoryClient:
    return make_client()


@pytest.fixture
def app_factory() -> Callable[..., DashboardApp]:
    return make_app


def _where(check: Callable[..., object]) -> str:
    """The check's source line (a lambda at its call site), so a failure says what it awaited."""
    try:
        lines, first = inspect.getsourcelines(check)
    except (OSError, TypeError):
        return repr(check)
    return f"line {first}: {lines[0].strip()}"


async def settle(
    pilot,
    until: Callable[..., object] | None = None,
    rounds: int = 50,
    delay: float | None = None,
    timeout_s: float = 30.0,
) -> None:
    """Let workers and messages run: until `until()` holds, checked after each idle turn.
    `delay` is only for Textual's own debounce timers (the command palette's search).

    At least `rounds` idle turns and at least `timeout_s` seconds: a worker thread (a form's
    validation) can need more turns than `rounds` on a loaded machine."""
    if until is None:
        for _ in range(3):
            await pilot.pause()
        return
    deadline = time.monotonic() + timeout_s
    turns = 0
    while not until():
        if turns >= rounds and time.monotonic() > deadline:
            raise AssertionError(f"the dashboard did not reach the expected state: {_where(until)}")
        turns += 1
        try:
            await pilot.pause(delay if delay is not None or turns < rounds else 0.02)
        except WaitForScreenTimeout:
            # Textual's own 30 s for pending messages: on the suite's loaded 2 cores the
            # screen once took longer (a fresh clone, 2026-12-06); this loop's deadline rules
            continue
