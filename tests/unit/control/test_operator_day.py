"""The daemon's side of an operator's day (issue 25): a start after a reboot adopts nothing and
starts the layout fresh; advice that tells a CPU instance's story and what to do after an exit
that fails fast; the router's log route and actions on a layout without a router."""

from __future__ import annotations

import subprocess
import sys

import psutil
import pytest

from vsup import paths
from vsup.control.advice import AdviceInputs, compute_advice
from vsup.control.errors import ControlError
from vsup.control.state import DaemonState, InstanceRecord, StateFile, spec_to_dict
from vsup.snapshot import LastExit, empty_instance

from tests.unit.control.helpers import emulator_layout, free_port

pytestmark = pytest.mark.timeout(60)
NONE = AdviceInputs(recent_failures={})


async def test_a_start_after_a_reboot_adopts_nothing_and_starts_the_layout_fresh(
    daemons, vsup_home
):
    """The state file names a process that began before the node booted (as every record does
    after a reboot), and its pid is now an unrelated live process: nothing is adopted or
    signalled, and the instance starts fresh - no crash counted, a new run."""
    from vsup.layout.compiled import compile_layout

    text = emulator_layout({"a": free_port()})
    compiled, _diags = compile_layout(text, "/tmp/fakes.toml")
    specs = compiled.specs
    stranger = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
    )
    try:
        before_boot = psutil.boot_time() - 600
        StateFile(paths.state_path(vsup_home)).save(
            DaemonState(
                layout_path="/tmp/fakes.toml",
                layout_toml=text,
                layout_name="fakes",
                instances={
                    "a": InstanceRecord(
                        name="a",
                        spec=spec_to_dict(specs[0]),
                        state="ready",
                        pid=stranger.pid,
                        create_time=before_boot,
                        pgid=stranger.pid,
                        port=specs[0].port,
                        run=4,
                        restarts=1,
                        descendants={str(stranger.pid): before_boot},
                    )
                },
            )
        )
        daemon, client = await daemons.start()
        assert await daemon.engine.wait("a", ("ready",), timeout=20) == "ready"
        inst = daemon.engine.instances["a"]
        assert inst.pid != stranger.pid and inst.run == 5
        assert inst.restarts == 1, "a reboot is no crash of the instance"
        events = (await client.events()).to_json()["events"]
        (adopt,) = [e for e in events if e["kind"] == "adopt"]
        assert adopt["adopted"] is False and "before the node last booted" in adopt["why"]
        assert not [e for e in events if e["kind"] in ("exit", "sweep")]
        assert stranger.poll() is None, "an unrelated process was signalled"
    finally:
        stranger.kill()
        stranger.wait()


def test_cpu_preemption_advice_talks_about_the_cpu_kv_cache_not_gpus():
    inst = empty_instance(
        "cpu1", state="ready", gpus=(), kv_cache_usage=0.0, kv_capacity_tokens=640,
        preemptions_per_min=7.0,
    )  # fmt: skip
    (advice,) = compute_advice([inst], [], AdviceInputs(recent_failures={}, kv_peak={"cpu1": 0.0}))
    text = advice.message
    assert advice.kind == "kv_exhausted" and "VLLM_CPU_KVCACHE_SPACE" in text
    assert "640 tokens" in text and "max-num-seqs" in text
    for gpu_words in ("per GPU", "gpu_memory_utilization", "0%"):
        assert gpu_words not in text
    assert "ran full between samples" in text


def test_a_gpu_instance_never_quotes_a_zero_peak_either():
    inst = empty_instance("g0", state="ready", gpus=(0,), kv_cache_usage=0.0,
                          preemptions_per_min=3.0)  # fmt: skip
    (advice,) = compute_advice([inst], [], AdviceInputs(recent_failures={}, kv_peak={"g0": 0.0}))
    assert "0%" not in advice.message and "gpu_memory_utilization" in advice.message


def failed(reason: str, **kw):
    return empty_instance(
        "a",
        state="failed",
        port=8101,
        failed_why=f"the restart policy gave up: {reason} recurs",
        last_exit=LastExit(code=2, signal=None, reason=reason, at="t", log_excerpt=kw.get("log")),
    )


def test_bad_args_advice_says_edit_the_layout_and_vsup_up():
    (advice,) = compute_advice([failed("bad_args")], [], NONE)
    text = advice.message
    assert "Edit the layout" in text and "`vsup up LAYOUT`" in text
    assert "would run the same command line again" in text
    assert "bad_args fails fast" in text and "gave up" not in text
    assert "Fix the cause, then `vsup restart a`" not in text


def test_port_in_use_advice_names_the_port_and_how_to_find_its_holder():
    log = "port 8101 on 127.0.0.1 is in use by pid 4242 (python3): give instance 'a' another port"
    (advice,) = compute_advice([failed("port_in_use", log=log)], [], NONE)
    text = advice.message
    assert "port 8101 is taken" in text and "pid 4242 (python3)" in text
    assert "port_in_use fails fast" in text and "(?)" not in text


async def test_router_logs_and_actions_without_a_router_are_404(daemons):
    _daemon, client = await daemons.start()
    with pytest.raises(ControlError) as exc:
        await client.logs("@router")
    assert exc.value.status == 404 and "no [router]" in exc.value.message
    with pytest.raises(ControlError) as exc:
        await client.action("restart", ["@router"])
    assert exc.value.status == 404 and "no [router]" in exc.value.message
    with pytest.raises(ControlError) as exc:
        await client.action("drain", ["@router"])
    assert exc.value.status == 400 and "router has no requests" in exc.value.message
