"""A rolling apply and the waits of instances that should run, on the dashboard: a ROLLOUT
mark in the header and its own line (wave, what restarts, what is pending, a failure or an
interruption with what keeps its old config), the reason on each waiting row and in the
detail pane, a start's progress against its start_timeout_s, and no previous run's
sparklines beside a starting instance's dashes."""

from __future__ import annotations

import dataclasses

from vsup.snapshot import RolloutStatus, StatusSnapshot, WaitReason
from vsup.tui import fmt, rows
from vsup.tui.widgets.detail import SidePanel, SparkPanel
from vsup.tui.widgets.header import NodeHeader, header_text
from vsup.tui.widgets.instances import InstanceTable
from vsup.tui.widgets.rolloutbar import RolloutBar, rollout_text

from tests.support import samples
from tests.tui.conftest import make_app, make_client, settle

ROLLING = RolloutStatus(
    state="running",
    wave=1,
    waves=2,
    done=0,
    total=2,
    current=("cpu0",),
    pending=("cpu1",),
    names=("cpu0", "cpu1"),
    old_config=("cpu0", "cpu1"),
)


def _plain(widget) -> str:
    content = widget.content
    return getattr(content, "plain", str(content))


def three() -> StatusSnapshot:
    """The CPU sample node with a third co-tenant."""
    snap = samples.cpu_node()
    last = sorted(snap.instances, key=lambda i: i.name)[-1]
    extra = dataclasses.replace(last, name="cpu9", port=(last.port or 8000) + 7)
    return dataclasses.replace(snap, instances=(*snap.instances, extra))


def rolling_node() -> StatusSnapshot:
    """cpu0 restarting in wave 1 (spawned 2m10s ago), cpu1 serving its old spec, cpu2 waiting
    for cpu0's start on their shared device."""
    snap = three()
    by_name = {i.name: i for i in snap.instances}
    first, second, *rest = sorted(by_name)
    starting = by_name[first].with_wire(
        state="starting",
        uptime_s=130.0,
        start_timeout_s=1200.0,
        kv_cache_usage=None,
        generation_tokens_per_s=None,
        preemptions_per_min=None,
    )
    old = by_name[second].with_wire(outdated=True, outdated_fields=("args",))
    changed = {first: starting, second: old}
    for name in rest:
        changed[name] = by_name[name].with_wire(
            state="starting",
            pid=None,
            uptime_s=None,
            wait=WaitReason("co_tenant", f"{first} starting", instances=(first,)),
            waiting_for=f"{first} starting",
        )
    rollout = dataclasses.replace(ROLLING, current=(first,), pending=(second,))
    return dataclasses.replace(
        snap, instances=tuple(changed.get(i.name, i) for i in snap.instances), rollout=rollout
    )


def test_the_cells_and_lines_say_what_each_instance_waits_for():
    snap = rolling_node()
    a, b, c = sorted(snap.instances, key=lambda i: i.name)[:3]
    state = [col.key for col in rows.COLUMNS].index("state")
    width = next(col.width for col in rows.COLUMNS if col.key == "state")
    cells = [rows.row_cells(i, rows.COLUMNS)[state][0] for i in (a, b, c)]
    assert cells == ["◐ 2m10s of 20m", "● ready old", f"◐ after {a.name}"]
    assert all(len(cell) <= width for cell in cells)
    assert fmt.wait_summary(a) == "starting 2m10s of 20m (start_timeout_s)"
    assert fmt.wait_summary(b) == "runs an older spec than the layout (args differ)"
    assert fmt.wait_summary(c) == f"waits for {a.name} starting"
    memory = c.with_wire(wait=WaitReason("gpu_memory", "pid 7 holds 9.0 GiB"))
    assert rows.row_cells(memory, rows.COLUMNS)[state][0] == "◐ GPU memory"
    assert snap.rollout is not None
    text = rollout_text(snap.rollout).plain
    assert text == (
        f"⟳ rollout wave 1/2: restarting {a.name} · 0/2 done · pending {b.name} "
        "(old config until their wave)"
    )
    assert "ROLLOUT 1/2" in header_text(snap, False, False).plain
    failed = dataclasses.replace(ROLLING, state="failed", failure="cpu0 is failed (oom)")
    assert rollout_text(failed).plain.startswith(
        "✖ rollout failed at wave 1/2: cpu0 is failed (oom) · old config: cpu0, cpu1"
    )
    cut = dataclasses.replace(ROLLING, state="interrupted", old_config=("cpu1",))
    assert "▲ rollout interrupted at wave 1/2" in rollout_text(cut).plain
    assert (
        "ROLLOUT INTERRUPTED"
        in header_text(dataclasses.replace(snap, rollout=cut), False, False).plain
    )
    done = dataclasses.replace(ROLLING, state="done", old_config=())
    assert "ROLLOUT" not in header_text(dataclasses.replace(snap, rollout=done), False, False).plain


async def test_the_dashboard_shows_the_rollout_the_waits_and_no_stale_sparklines():
    plain = three()
    snap = rolling_node()
    first = sorted(i.name for i in snap.instances)[0]
    client = make_client(plain)
    app = make_app(client)
    async with app.run_test(size=(160, 45)) as pilot:
        await settle(pilot, lambda: app.selected == first)
        bar = app.screen.query_one(RolloutBar)
        assert not bar.has_class("-shown")
        sparks = app.screen.query_one(SparkPanel)
        assert "▁" in str(sparks.render()) or "█" in str(sparks.render())  # serving: sparklines

        client.snapshot = snap
        app.tick()
        await settle(pilot, lambda: bar.has_class("-shown"))
        assert _plain(bar).startswith(f"⟳ rollout wave 1/2: restarting {first}")
        assert bar.region.y == 1 and bar.region.height == 1  # right under the header
        assert "ROLLOUT 1/2" in _plain(app.screen.query_one(NodeHeader))
        table = app.screen.query_one(InstanceTable)
        assert table.get_cell(first, "state").plain == "◐ 2m10s of 20m"
        waiting = [i.name for i in snap.instances if i.lifecycle.wait is not None]
        assert waiting and all(
            table.get_cell(n, "state").plain == f"◐ after {first}" for n in waiting
        )
        shown = str(sparks.render())
        assert "starting 2m10s of 20m" in shown
        assert not any(bar_ in shown for bar_ in "▁▂▃▄▅▆▇█"), "the previous run's sparklines"
        assert app.screen.query_one(SidePanel).border_title == f"{first} · ◐ starting"

        table.move_cursor(row=table.order.index(waiting[0]))
        await settle(pilot, lambda: app.selected == waiting[0])
        assert f"waits for {first} starting" in str(sparks.render())

        client.snapshot = dataclasses.replace(snap, rollout=None)
        app.tick()
        await settle(pilot, lambda: not bar.has_class("-shown"))
        assert "ROLLOUT" not in _plain(app.screen.query_one(NodeHeader))


def test_escapes_in_what_the_dashboard_prints_are_shown_not_obeyed():
    evil = "\x1b]0;pwned\x07\x1b[2J"
    snap = samples.cpu_node()
    inst = snap.instances[0].with_wire(model=f"m{evil}", backend=f"B{evil}")
    cells = rows.row_cells(inst, rows.COLUMNS)
    assert not any("\x1b" in text or "\x07" in text for text, _ in cells)
    node = dataclasses.replace(snap.node, hostname=f"h{evil}")
    assert "\x1b" not in header_text(dataclasses.replace(snap, node=node), False, False).plain
    cut = dataclasses.replace(ROLLING, state="failed", failure=f"boom{evil}")
    assert "\x1b" not in rollout_text(cut).plain and "\\x1b" in rollout_text(cut).plain
