"""Live advice rules (docs/ARCHITECTURE.md, advice)."""

from __future__ import annotations

from vsup.control.advice import AdviceInputs, compute_advice, problem
from vsup.snapshot import GpuProcess, GpuStatus, LastExit, empty_instance
from vsup.states import ExitReason, State

GiB = 1024**3
NONE = AdviceInputs(recent_failures={})


def kinds(advice):
    return [(a.kind, a.instance, a.gpu) for a in advice]


def test_full_kv_cache_with_rising_preemptions_says_the_cache_is_too_small():
    inst = empty_instance(
        "g0", state="ready", gpus=(0,), kv_cache_usage=0.97, preemptions_per_min=12.0
    )
    advice = compute_advice([inst], [], NONE)
    assert kinds(advice) == [("kv_exhausted", "g0", None)]
    assert advice[0].severity == "critical"
    text = advice[0].message
    for remedy in ("fewer instances per GPU", "gpu_memory_utilization", "fp8", "max-num-seqs"):
        assert remedy in text


def test_full_kv_cache_without_preemptions_is_fine():
    inst = empty_instance("g0", state="ready", kv_cache_usage=0.99, preemptions_per_min=0.0)
    assert compute_advice([inst], [], NONE) == ()


def test_preemptions_while_the_sampled_gauge_reads_below_95_still_warn():
    # vLLM preempts only when no KV block is free; the 1 Hz gauge misses that moment.
    inst = empty_instance("g0", state="ready", kv_cache_usage=0.40, preemptions_per_min=30.0)
    advice = compute_advice([inst], [], AdviceInputs(recent_failures={}, kv_peak={"g0": 0.8}))
    assert kinds(advice) == [("kv_exhausted", "g0", None)]
    assert advice[0].severity == "warning"
    assert "peaked at 80%" in advice[0].message


def test_a_kv_peak_at_95_within_the_minute_makes_preemption_advice_critical():
    inst = empty_instance("g0", state="ready", kv_cache_usage=0.50, preemptions_per_min=3.0)
    advice = compute_advice([inst], [], AdviceInputs(recent_failures={}, kv_peak={"g0": 0.96}))
    assert [a.severity for a in advice] == ["critical"]


def test_unknown_preemption_rate_is_not_a_rise():
    inst = empty_instance("g0", state="ready", kv_cache_usage=0.99, preemptions_total=40.0)
    assert compute_advice([inst], [], NONE) == ()


def test_hbm_above_the_planned_share_is_reported_with_numbers():
    inst = empty_instance(
        "g0",
        state="ready",
        gpus=(3,),
        hbm_bytes=60 * GiB,
        planned_hbm_bytes=48 * GiB,
        gpu_memory_utilization=0.25,
    )
    advice = compute_advice([inst], [], NONE)
    assert kinds(advice) == [("hbm_over_plan", "g0", 3)]
    assert "60.0 GiB" in advice[0].message and "48.0 GiB" in advice[0].message


def test_small_hbm_excess_is_allocator_slack():
    inst = empty_instance(
        "g0", gpus=(0,), hbm_bytes=48 * GiB + 100 * 1024**2, planned_hbm_bytes=48 * GiB
    )
    assert compute_advice([inst], [], NONE) == ()


MiB = 1024**2
# The real H200 run (tests/fixtures/vllm-0.26-cuda): 0.45 x 143771 MiB planned, 66142 MiB held,
# the log naming 0.22 GiB non-torch and 0.45 GiB CUDA graphs.
H200_PLAN = int(0.45 * 143771 * MiB)
H200_LOGGED = dict(vllm_non_torch_bytes=int(0.22 * GiB), vllm_cudagraph_bytes=int(0.45 * GiB))


def h200(**values):
    base = dict(
        state="ready",
        gpus=(0,),
        hbm_source="process",
        hbm_bytes=66142 * MiB,
        planned_hbm_bytes=H200_PLAN,
        gpu_memory_utilization=0.45,
    )
    return empty_instance("g0", **{**base, **values})


def test_healthy_instance_above_its_share_by_vllms_own_overhead_is_not_an_alert():
    # issue 20: 64.6 GiB held of 63.2 GiB planned on a healthy instance
    assert compute_advice([h200(**H200_LOGGED)], [], NONE) == ()
    assert compute_advice([h200()], [], NONE) == ()  # no memory line: the default allowance


def test_hbm_beyond_share_plus_logged_overhead_says_by_how_much_and_why():
    inst = h200(hbm_bytes=H200_PLAN + 4 * GiB, **H200_LOGGED)
    advice = compute_advice([inst], [], NONE)
    assert kinds(advice) == [("hbm_over_plan", "g0", 0)]
    text = advice[0].message
    # 4 GiB above the share, less 0.67 GiB logged and 1 GiB CUDA context
    assert "2.3 GiB above its planned share of 63.2 GiB" in text
    assert "non-torch 0.22 GiB" in text and "CUDA graphs 0.45 GiB" in text


def test_without_the_memory_line_the_default_allowance_is_named():
    advice = compute_advice([h200(hbm_bytes=H200_PLAN + 4 * GiB)], [], NONE)
    assert kinds(advice) == [("hbm_over_plan", "g0", 0)]
    assert "no memory line" in advice[0].message
    # tensor parallel: NCCL buffers on top, per GPU
    tp2 = h200(gpus=(0, 1), planned_hbm_bytes=2 * H200_PLAN, hbm_bytes=2 * H200_PLAN + 4 * GiB)
    assert compute_advice([tp2], [], NONE) == ()


def test_growth_since_the_instance_started_serving_is_drift():
    start = 66142 * MiB
    steady = h200(hbm_start_bytes=start, hbm_bytes=start + 512 * MiB, **H200_LOGGED)
    assert compute_advice([steady], [], NONE) == ()
    grown = h200(hbm_start_bytes=start, hbm_bytes=start + 2 * GiB, **H200_LOGGED)
    advice = compute_advice([grown], [], NONE)
    assert kinds(advice) == [("hbm_over_plan", "g0", 0)]
    assert "grew by 2.0 GiB since it started serving" in advice[0].message


def test_unknown_hbm_gives_no_advice():
    inst = empty_instance("g0", gpus=(0,), hbm_bytes=None, planned_hbm_bytes=48 * GiB)
    assert compute_advice([inst], [], NONE) == ()


def test_foreign_process_on_a_gpu_is_named():
    gpu = GpuStatus(
        2,
        "H200",
        141 * GiB,
        20 * GiB,
        0.0,
        30.0,
        100.0,
        (GpuProcess(111, 10 * GiB, "g2"), GpuProcess(999, 8 * GiB, None)),
    )
    advice = compute_advice([], [gpu], NONE)
    assert kinds(advice) == [("foreign_process", None, 2)]
    assert "pid 999" in advice[0].message and "8.0 GiB" in advice[0].message


def test_failed_instance_is_critical_and_says_how_to_restart():
    le = LastExit(1, None, "oom", "2026-01-01T00:00:00.000Z", "torch.OutOfMemoryError: CUDA out")
    inst = empty_instance("g1", state="failed", last_exit=le, restarts=5)
    advice = compute_advice([inst], [], NONE)
    assert kinds(advice) == [("crash_loop", "g1", None)]
    assert advice[0].severity == "critical"
    assert "vsup restart g1" in advice[0].message and "OutOfMemoryError" in advice[0].message


def test_failed_instance_says_why_vsup_gave_up():
    le = LastExit(None, "SIGKILL", "unhealthy", "2026-01-01T00:00:00.000Z", None)
    why = (
        "processes of g1 outlived SIGKILL: 28258 VLLM::Worker (R: running, exiting). They "
        "hold their memory ...; `vsup start g1` once they are gone"
    )
    stuck = empty_instance("g1", state="failed", last_exit=le, restarts=0, failed_why=why)
    (advice,) = compute_advice([stuck], [], NONE)
    assert (advice.kind, advice.severity) == ("failed", "critical")
    assert why in advice.message and "repeated crashes" not in advice.message
    assert "vsup restart" not in advice.message  # the why says what to do
    assert "last exit: unhealthy" in advice.message

    policy = "the restart policy gave up: 5 consecutive failures (max_failures = 5)"
    looped = empty_instance("g2", state="failed", last_exit=le, restarts=4, failed_why=policy)
    (advice,) = compute_advice([looped], [], NONE)
    assert advice.kind == "crash_loop" and policy in advice.message
    assert "`vsup restart g2`" in advice.message


def test_repeated_failures_in_the_window_are_a_crash_loop():
    inst = empty_instance("g1", state="backoff", restarts=3)
    inputs = AdviceInputs(recent_failures={"g1": 3})
    assert kinds(compute_advice([inst], [], inputs)) == [("crash_loop", "g1", None)]
    quiet = AdviceInputs(recent_failures={"g1": 2})
    assert compute_advice([inst], [], quiet) == ()


def test_critical_advice_comes_first_and_problems_are_kept():
    failed = empty_instance("a", state="failed")
    kv = empty_instance("b", kv_cache_usage=0.5, preemptions_per_min=5.0)  # a warning
    inputs = AdviceInputs({}, problems=(problem("state_file", "state file unreadable"),))
    advice = compute_advice([kv, failed], [], inputs)
    assert [a.kind for a in advice] == ["crash_loop", "state_file", "kv_exhausted"]


def test_a_foreign_router_worker_is_critical_and_says_what_let_it_in():
    from vsup.router import ForeignWorker

    seen = ForeignWorker(
        url="http://127.0.0.1:18899",
        first_seen="2026-12-01T10:00:00.000Z",
        last_seen="2026-12-01T10:00:05.000Z",
        removals=12,
        last_seen_mono=5.0,
        router_host="0.0.0.0",
        router_port=8080,
    )
    (advice,) = compute_advice([], [], AdviceInputs(recent_failures={}, foreign_workers=(seen,)))
    assert (advice.kind, advice.severity, advice.instance) == (
        "router_foreign_worker",
        "critical",
        None,
    )
    text = advice.message
    assert "0.0.0.0:8080" in text and "http://127.0.0.1:18899" in text
    assert "12 times, last at 2026-12-01T10:00:05.000Z" in text and "no authentication" in text
    assert compute_advice([], [], AdviceInputs(recent_failures={})) == ()


def test_a_failed_router_is_critical_advice_saying_why_and_what_to_do():
    from vsup.control.advice import router_failed
    from vsup.snapshot import RouterStatus

    why = "cannot run 'vllm-router' (No such file or directory): pip install 'vsup[router]'"
    failed = RouterStatus(
        state=State.FAILED,
        port=8080,
        endpoint="http://127.0.0.1:8080",
        failed_why=why,
        last_exit=LastExit(None, None, ExitReason.BAD_ARGS, "2026-12-02T05:00:00Z", why),
    )
    (advice,) = router_failed(failed)
    assert advice.kind == "router_failed" and advice.severity == "critical"
    assert advice.message.startswith(f"the router (http://127.0.0.1:8080) failed: {why}")
    assert "vsup logs @router" in advice.message and "vsup start @router" in advice.message
    # through compute_advice, as the daemon runs it
    got = compute_advice([], [], AdviceInputs(recent_failures={}, router=failed))
    assert [a.kind for a in got] == ["router_failed"]
    for state in (State.READY, State.STARTING, State.BACKOFF, State.STOPPED):
        assert router_failed(RouterStatus(state=state, port=8080)) == []
    assert router_failed(None) == []
