"""Two applies 0-20 ms apart (issue 31, item 4): the layout the daemon says runs is the one whose
argv the instance's process runs, and a dry run of the other layout is not "unchanged".

Before the fix an apply's restart could land while the runner was inside its spawn (no process
recorded yet): the restart was taken as a start, the process kept the first layout's argv, the
second spec waited for a restart that never came, and the dry run compared with that pending
spec. A real detached daemon with vLLM emulators (tests/programs/vllm_emulator.py); the applies
are POSTs to its socket, as `vsup up` and the dashboard send them.
"""

from __future__ import annotations

import random
import threading
import time

import psutil
import pytest

from vsup.control.client import JsonClient
from vsup.layout.compiled import compile_layout

from tests.faults.helpers import vsup, wait_for
from tests.unit.control.helpers import emulator_layout, free_port

pytestmark = pytest.mark.timeout(300)

ROUNDS = 20


def settled(home, name: str) -> dict | None:
    """The instance once it is ready and nothing is pending for it (no rollout running)."""
    with JsonClient(home) as client:
        doc = client.status()
    inst = {i["name"]: i for i in doc["instances"]}[name]
    rollout = doc.get("rollout")
    if inst["state"] != "ready" or (rollout and rollout["state"] == "running"):
        return None
    return inst


def apply_both(home, first: str, second: str, gap_s: float, all_at_once: bool) -> None:
    """POST both layouts, the second `gap_s` after the first, each on its own connection."""
    answers: list[dict] = []
    errors: list[BaseException] = []

    def post(text: str, delay: float) -> None:
        try:
            time.sleep(delay)
            with JsonClient(home) as client:
                answers.append(client.apply(text, "/tmp/concurrent.toml", all_at_once=all_at_once))
        except BaseException as exc:  # reported by the test thread below
            errors.append(exc)

    threads = [
        threading.Thread(target=post, args=(first, 0.0)),
        threading.Thread(target=post, args=(second, gap_s)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert len(answers) == 2 and all(a["applied"] and not a["errors"] for a in answers), answers


def test_concurrent_applies_leave_what_runs_equal_to_the_layout(fault_home, tmp_path):
    home = fault_home
    port = free_port()
    # drains are short: the emulator always reports a request running
    base = emulator_layout({"a": port}, args="drain_timeout_s = 0.2")
    layouts = {
        "a": base,
        "b": emulator_layout({"a": port}, args='drain_timeout_s = 0.2\nargs = { say = "b" }'),
    }
    argv = {}
    for key, text in layouts.items():
        compiled, diagnostics = compile_layout(text, "/tmp/concurrent.toml")
        assert compiled is not None, diagnostics
        argv[key] = compiled.specs[0].argv()
    path = tmp_path / "a.toml"
    path.write_text(base)
    res = vsup(home, "up", str(path), "--detach", "--wait", "--timeout", "60")
    assert res.returncode == 0, res.stderr

    rng = random.Random(31)
    for round_ in range(ROUNDS):
        first, second = rng.sample(["a", "b"], 2)
        gap = rng.uniform(0.0, 0.02)
        all_at_once = round_ % 2 == 1
        apply_both(home, layouts[first], layouts[second], gap, all_at_once)
        inst = wait_for(
            lambda: settled(home, "a"), 60, f"round {round_}: a ready and settled", interval=0.05
        )
        with JsonClient(home) as client:
            running = client.layout()["toml"]
            pid = {i["name"]: i for i in client.status()["instances"]}["a"]["pid"]
        now = next(k for k, t in layouts.items() if t == running)
        other = "b" if now == "a" else "a"
        assert pid == inst["pid"]
        cmdline = psutil.Process(pid).cmdline()
        assert cmdline[-len(argv[now]) :] == argv[now], (
            f"round {round_} ({first} then {second}, {gap * 1000:.0f} ms apart): the running "
            f"layout is {now} but the process runs {cmdline}"
        )

        with JsonClient(home) as client:
            plan = client.apply(layouts[other], "/tmp/concurrent.toml", dry_run=True)["plan"]
            again = client.apply(layouts[now], "/tmp/concurrent.toml", dry_run=True)["plan"]
        assert "a" not in plan["unchanged"] and "a" in plan["restart"], (round_, now, plan)
        assert plan["changes"]["a"], plan  # and it says what differs
        assert again["unchanged"] == ["a"] and not again["changes"], (round_, now, again)
