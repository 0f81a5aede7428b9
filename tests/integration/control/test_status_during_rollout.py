"""What the operator sees while the layout changes, against a real detached daemon (`vsup up
--detach`) and its real processes: `vsup status` and the dashboard (the real app on the real
`AsyncClient`, driven by Textual's Pilot) during a co-tenant wait and during a rolling apply.

Two CPU instances share the device `cpu`, so the second waits for the first's start; then a
change of their args rolls, one instance at a time. vLLM emulators (tests/programs/
vllm_emulator.py) stand in for vLLM. Each start the operator looks at is held by a gate file
(the emulator's `--ready-file`) that the test creates once it has looked: a window of fixed
seconds was missed twice in full suites on 2 cores (2026-12-07: once a's first start, once its
wave-1 restart, was over before the dashboard or `vsup status` looked). Both always report a
request running, so each drain lasts drain_timeout_s.
tests/integration/router/test_router_vsup.py does a rolling apply with real vLLM."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from vsup.control.client import AsyncClient
from vsup.tui.app import DashboardApp
from vsup.tui.widgets.detail import SparkPanel
from vsup.tui.widgets.header import NodeHeader
from vsup.tui.widgets.instances import InstanceTable
from vsup.tui.widgets.rolloutbar import RolloutBar

from tests.integration.control.test_cli import cli_home, vsup  # noqa: F401 (fixture)
from tests.unit.control.helpers import emulator_layout, free_port

pytestmark = pytest.mark.timeout(240)

SPARK_BARS = "▁▂▃▄▅▆▇█"


def layout(ports: dict[str, int], say: str, a_gate: Path, b_gate: Path) -> str:
    """Each instance starts only once its gate file exists (an instance's args merge into the
    defaults' key by key, docs/layout.md)."""
    text = emulator_layout(
        ports,
        extra_header="max_unavailable = 1\ndrain_timeout_s = 1",
        args=f'args = {{ say = "{say}" }}',
    )
    for name, gate in (("a", a_gate), ("b", b_gate)):
        text = text.replace(
            f'name = "{name}"\n', f'name = "{name}"\nargs = {{ ready-file = "{gate}" }}\n'
        )
    return text


def status_row(home, name: str, pattern: str, timeout: float = 20) -> tuple[str, str]:
    """`vsup status` once its row for `name` matches `pattern`: a hold on the device is taken
    before the spawn, so a `starting` instance shows no progress until its process exists."""

    def matched():
        text = vsup(home, "status").stdout
        row = next((line for line in text.splitlines() if line.startswith(f"{name} ")), "")
        return (text, row) if re.search(pattern, row) else None

    return wait_for(matched, timeout, f"{name}'s row to match {pattern!r}")


def status_json(home) -> dict:
    return json.loads(vsup(home, "status", "--json").stdout)


def wait_for(check: Callable[[], object], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what} (last: {last!r})")


async def until(
    pilot,
    check: Callable[[], bool],
    timeout: float,
    what: str,
    shown: Callable[[], object] | None = None,
) -> None:
    """Let the dashboard fetch and render until `check()` holds (real time: a real daemon).
    `shown`: what the dashboard shows meanwhile, each value it took named in a failure."""
    deadline = time.monotonic() + timeout
    seen: list[object] = []
    while not check():
        if shown is not None and (value := shown()) not in seen:
            seen.append(value)
        if time.monotonic() > deadline:
            raise AssertionError(
                f"the dashboard did not show {what} within {timeout} s"
                + (f" (it showed, in turn: {seen!r})" if shown is not None else "")
            )
        await pilot.pause(0.1)


def plain(widget) -> str:
    content = widget.content
    return getattr(content, "plain", str(content))


async def test_status_and_the_dashboard_during_a_co_tenant_wait_and_a_rolling_apply(
    cli_home,  # noqa: F811
    tmp_path,
):
    home = cli_home
    ports = {"a": free_port(), "b": free_port()}
    v1, v2 = tmp_path / "v1.toml", tmp_path / "v2.toml"
    first_start, a_restart, b_restart = (tmp_path / n for n in ("go1", "go-a", "go-b"))
    v1.write_text(layout(ports, "v1", first_start, first_start))
    v2.write_text(layout(ports, "v2", a_restart, b_restart))
    up = vsup(home, "up", str(v1), "--detach")  # no --wait: a starts, b waits for its turn
    assert up.returncode == 0, up.stdout + up.stderr

    def b_waits():
        doc = status_json(home)
        b = {i["name"]: i for i in doc["instances"]}.get("b")
        return b and (b.get("wait") or {}).get("kind") == "co_tenant" and doc

    doc = wait_for(b_waits, 30, "b to wait for a's start")
    assert doc["instances"][1]["wait"]["instances"] == ["a"]
    assert doc["instances"][1]["waiting_for"] == "a starting"  # the older key, kept
    # a's start, timed against its start_timeout_s (900 s) once its process is spawned
    text, _ = status_row(home, "a", r"^a\s+starting \d+s of 15m\s")
    assert "b: waits for a starting (a co-tenant of its device)" in text, text
    row_b = next(line for line in text.splitlines() if line.startswith("b "))
    assert row_b.split()[1:4] == ["starting", "(waits)", "-"], row_b  # no pid: nothing spawned

    app = DashboardApp(AsyncClient(home), readonly=True, refresh_s=0.25)
    async with app.run_test(size=(160, 45)) as pilot:
        table = app.screen.query_one(InstanceTable)
        sparks = app.screen.query_one(SparkPanel)
        header = app.screen.query_one(NodeHeader)
        bar = app.screen.query_one(RolloutBar)

        def cell(name: str) -> str:
            try:
                return table.get_cell(name, "state").plain
            except Exception:  # the row is not there yet
                return ""

        await until(pilot, lambda: cell("b") == "◐ after a", 20, "b waiting after a")
        table.move_cursor(row=table.order.index("b"))
        await until(pilot, lambda: app.selected == "b", 10, "b selected")
        await until(pilot, lambda: "waits for a starting" in str(sparks.render()), 10, "b's reason")
        assert re.fullmatch(r"◐ \d+s of 15m", cell("a")), cell("a")  # a's start, timed
        first_start.touch()

        # both serve, then the change rolls: a first, b after
        await asyncio.to_thread(
            wait_for,
            lambda: all(i["state"] == "ready" for i in status_json(home)["instances"]),
            60,
            "both instances ready",
        )
        await until(pilot, lambda: cell("b") == "● ready", 10, "b ready on the dashboard")
        go = await asyncio.to_thread(vsup, home, "up", str(v2), "--detach", "--yes")
        assert go.returncode == 0, go.stdout + go.stderr
        assert "rolling restart of 2 serving instance(s) under way" in go.stdout

        text = (await asyncio.to_thread(vsup, home, "status")).stdout
        assert re.search(
            r"^ROLLOUT wave 1/2: restarting a · 0/2 done · pending b \(on the old config until "
            r"their wave\) · max_unavailable 1$",
            text,
            re.M,
        ), text
        assert "b: runs an older spec than the layout (args differ)" in text
        await until(pilot, lambda: bar.has_class("-shown"), 10, "the rollout line")
        assert plain(bar).startswith("⟳ rollout wave 1/2: restarting a")
        assert "ROLLOUT 1/2" in plain(header)
        assert cell("b") == "● ready old"  # pending: serving its old spec

        # a's restart: its row and panel say how far its start is, not its old sparklines
        table.move_cursor(row=table.order.index("a"))
        await until(
            pilot, lambda: cell("a").endswith(" of 15m"), 30, "a restarting", lambda: cell("a")
        )
        await until(pilot, lambda: app.selected == "a", 10, "a selected")
        await until(pilot, lambda: "starting" in str(sparks.render()), 10, "a's progress")
        shown = str(sparks.render())
        assert re.search(r"starting \d+s of 15m \(start_timeout_s\)", shown), shown
        assert not any(b in shown for b in SPARK_BARS), shown

        await asyncio.to_thread(status_row, home, "a", r"^a\s+starting \d+s of 15m\s")
        a_restart.touch()

        # wave 2, then the end: the line and the mark go
        await until(pilot, lambda: "wave 2/2: restarting b" in plain(bar), 60, "wave 2")
        b_restart.touch()
        await until(pilot, lambda: not bar.has_class("-shown"), 60, "the rollout's end")
        assert "ROLLOUT" not in plain(header)
    doc = status_json(home)
    assert doc["rollout"]["state"] == "done" and doc["rollout"]["done"] == 2
    assert not any(i["outdated"] for i in doc["instances"])
    assert "ROLLOUT" not in vsup(home, "status").stdout
