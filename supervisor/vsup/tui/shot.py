"""A screenshot of the live dashboard without a terminal: `vsup tui --screenshot FILE.svg`.

For incident reports and for nodes reached only through scripts (the GPU verification run):
the real dashboard app on the real daemon, rendered headless at a set size once the first
snapshot and the selected instance's history have arrived, saved as Textual's SVG.
"""

from __future__ import annotations

import time
from pathlib import Path

from vsup.tui.client import DashboardClient


async def screenshot_live(
    path: str | Path,
    size: tuple[int, int] = (160, 45),
    *,
    select: str | None = None,
    timeout_s: float = 30.0,
    client: DashboardClient | None = None,
) -> Path:
    """Save the dashboard as `path` (SVG). `select` picks the instance shown in the detail
    pane (default: the first). Raises TimeoutError when no snapshot arrives in `timeout_s`."""
    from vsup.control.client import AsyncClient
    from vsup.tui.app import DashboardApp

    path = Path(path)
    app = DashboardApp(client or AsyncClient(), readonly=True, refresh_s=0.5)
    async with app.run_test(size=size, headless=True) as pilot:
        deadline = time.monotonic() + timeout_s
        while app.snapshot is None or app.selected is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no status from the daemon within {timeout_s:.0f}s")
            await pilot.pause(0.1)
        if select is not None and app.snapshot.instance(select) is None:
            raise ValueError(f"no instance named {select!r}")
        target = select or app.selected
        while app.selected != target and time.monotonic() < deadline:
            await pilot.press("down")
            await pilot.pause(0.05)
        while target not in app.history.seeded and time.monotonic() < deadline:
            await pilot.pause(0.1)
        await pilot.pause(1.0)  # the log tail and the config tab fill in
        path.parent.mkdir(parents=True, exist_ok=True)
        app.save_screenshot(filename=path.name, path=str(path.parent))
    return path
