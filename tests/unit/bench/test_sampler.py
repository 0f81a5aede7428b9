"""vsup's telemetry during a run, summarised per instance and per GPU."""

from __future__ import annotations

import pytest

from vsup.bench.sampler import Sampler, summarize


def inst(name, state="ready", pid=100, kv=0.1, pre=0, tok=10.0, hbm=None, **extra):
    return {
        "name": name,
        "state": state,
        "pid": pid,
        "kv_cache_usage": kv,
        "kv_capacity_tokens": 4096,
        "preemptions_total": pre,
        "generation_tokens_per_s": tok,
        "requests_waiting": 0,
        "hbm_bytes": hbm,
        "hbm_source": "nvml" if hbm else "unavailable",
        "backend": "FLASH_ATTN",
        "last_exit": extra.get("last_exit"),
    }


def doc(*instances, gpus=()):
    return {"instances": list(instances), "gpus": list(gpus)}


def gpu(index, used, util):
    return {"index": index, "name": "H200", "hbm_total_bytes": 150, "hbm_used_bytes": used,
            "util_pct": util}  # fmt: skip


def test_peaks_preemption_delta_and_rates_per_instance_and_gpu():
    samples = [
        (1.0, doc(inst("a", kv=0.1, pre=5, tok=0.0, hbm=10), gpus=[gpu(0, 20, 0)])),
        (2.0, doc(inst("a", kv=0.97, pre=9, tok=300.0, hbm=12), gpus=[gpu(0, 22, 100)])),
        (3.0, doc(inst("a", kv=0.5, pre=12, tok=200.0, hbm=11), gpus=[gpu(0, 21, 50)])),
    ]
    s = summarize(samples, ["a"])
    a = s["instances"]["a"]
    assert a["kv_peak"] == 0.97
    assert a["preemptions"] == 7  # the counter's rise during the run, not its value
    assert a["tokens_per_s_peak"] == 300.0
    assert a["tokens_per_s_mean"] == pytest.approx(500 / 3)
    assert a["hbm_peak_bytes"] == 12 and a["died"] is None
    assert s["gpus"] == [
        {
            "index": 0,
            "name": "H200",
            "hbm_total_bytes": 150,
            "hbm_used_peak_bytes": 22,
            "util_mean_pct": 50.0,
            "util_peak_pct": 100,
        }  # fmt: skip
    ]


def test_an_instance_that_dies_mid_run_is_named_with_its_reason_and_its_figures_stop_there():
    le = {"reason": "oom", "log_excerpt": "line one\ntorch.OutOfMemoryError: CUDA out of memory"}
    samples = [
        (1.0, doc(inst("a", pre=2), inst("b"))),
        (2.0, doc(inst("a", pre=6, kv=0.99), inst("b"))),
        (3.0, doc(inst("a", state="backoff", pid=None, last_exit=le), inst("b"))),
        # restarted: new pid, counter from zero
        (4.0, doc(inst("a", pid=200, pre=0, kv=0.05), inst("b"))),
    ]
    s = summarize(samples, ["a", "b"])
    died = s["instances"]["a"]["died"]
    assert died["state"] == "backoff" and died["reason"] == "oom" and died["at"] == 3.0
    assert died["log_line"] == "torch.OutOfMemoryError: CUDA out of memory"
    assert s["instances"]["a"]["preemptions"] == 4
    assert s["instances"]["a"]["kv_peak"] == 0.99
    assert s["instances"]["b"]["died"] is None


def test_a_restart_between_two_polls_is_seen_by_the_new_pid():
    samples = [(1.0, doc(inst("a", pid=1))), (2.0, doc(inst("a", pid=2)))]
    assert summarize(samples, ["a"])["instances"]["a"]["died"]["state"] == "ready"


def test_unknown_figures_stay_unknown():
    samples = [(1.0, doc(inst("a", kv=None, pre=None, tok=None)))]
    a = summarize(samples, ["a"])["instances"]["a"]
    assert a["kv_peak"] is None and a["preemptions"] is None and a["tokens_per_s_mean"] is None
    assert summarize([], ["x"])["instances"]["x"]["samples"] == 0


def test_the_sampler_survives_a_failing_status_call():
    calls = iter([RuntimeError("daemon hiccup"), {"instances": []}])

    def status():
        value = next(calls)
        if isinstance(value, Exception):
            raise value
        return value

    s = Sampler(status, interval=0.01)
    assert s.sample() is None and s.errors == 1
    assert s.sample() == {"instances": []} and len(s.samples) == 1


def test_means_count_only_the_samples_taken_while_the_clients_ran():
    samples = [
        (1.0, doc(inst("a", tok=0.0, pre=0), gpus=[gpu(0, 20, 0)])),
        (2.0, doc(inst("a", tok=400.0, pre=1), gpus=[gpu(0, 20, 100)])),
        (3.0, doc(inst("a", tok=200.0, pre=3), gpus=[gpu(0, 20, 80)])),
        (6.0, doc(inst("a", tok=0.0, pre=4), gpus=[gpu(0, 20, 0)])),  # after the end
    ]
    s = summarize(samples, ["a"], window=(1.5, 3.5))
    a = s["instances"]["a"]
    assert a["tokens_per_s_mean"] == 300.0 and a["tokens_per_s_peak"] == 400.0
    assert a["preemptions"] == 4  # counters use every sample, the last one included
    assert s["gpus"][0]["util_mean_pct"] == 90.0 and s["gpus"][0]["util_peak_pct"] == 100
