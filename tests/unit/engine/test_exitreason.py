"""Exit classification against real vLLM 0.32 logs (tests/fixtures/vllm-0.32-cpu/exits)."""

from pathlib import Path

import pytest

from vsup.engine.exitreason import classify, signal_name
from vsup.states import ExitReason

FIX = Path(__file__).parents[2] / "fixtures" / "vllm-0.32-cpu"


def log(name: str) -> str:
    return (FIX / "exits" / name).read_text()


@pytest.mark.parametrize(
    "fixture, code, reason, excerpt_has",
    [
        ("bad_args_unrecognized.log", 2, "bad_args", "unrecognized arguments: --no-such-flag"),
        ("bad_args_invalid_value.log", 2, "bad_args", "argument --max-model-len"),
        ("model_not_found_missing_path.log", 1, "model_not_found", "Repo id must be in the form"),
        ("model_not_found_offline_hub_id.log", 1, "model_not_found", "LocalEntryNotFoundError"),
        ("model_not_found_empty_dir.log", 1, "model_not_found", "Invalid repository ID"),
        ("kv_cache_too_small.log", 1, "kv_cache_too_small", "To serve at least one request"),
        ("port_in_use.log", 1, "port_in_use", "[Errno 98] Address already in use"),
        ("engine_dead_core_killed.log", 0, "engine_dead", "EngineDeadError"),
    ],
)
def test_real_startup_failures_are_classified(fixture, code, reason, excerpt_has):
    got = classify(code, None, log(fixture), model="/tmp/eng-cap/does-not-exist")
    assert got.reason == reason
    assert got.excerpt is not None
    assert excerpt_has in got.excerpt
    assert "\n" not in got.excerpt or reason == "engine_dead"


def until_ready() -> str:
    """The real startup log up to the first request: a healthy server."""
    text = (FIX / "startup.log").read_text()
    return text[: text.index("GET /health")]


def test_the_ulimit_warning_every_start_prints_decides_nothing():
    startup = until_ready()
    assert "Too many open files" in startup
    assert classify(None, 9, startup).reason == "killed"
    assert classify(0, None, startup) == type(classify(0, None, ""))(ExitReason.UNKNOWN, None)


def test_a_foreign_sigterm_is_killed_not_engine_dead():
    # The fixture ends with a SIGTERM shutdown, during which vLLM logs EngineDeadError.
    got = classify(0, None, (FIX / "startup.log").read_text())
    assert got.reason == "killed"
    assert got.excerpt is not None
    assert "shutdown triggered" in got.excerpt


def test_operator_stop_wins_over_any_log_line():
    assert (
        classify(0, None, log("engine_dead_core_killed.log"), cause="stopped").reason == "stopped"
    )


def test_log_root_cause_wins_over_the_cause_vsup_saw():
    got = classify(None, 15, log("engine_dead_core_killed.log"), cause="unhealthy")
    assert got.reason == "engine_dead"


def test_causes_vsup_acted_on_without_a_log_line():
    startup = (FIX / "startup.log").read_text()  # ends with vsup's SIGTERM shutdown
    for cause in ("startup_timeout", "unhealthy", "engine_dead"):
        assert classify(None, 9, startup, cause=cause).reason == cause


def test_unrequested_signal_is_killed():
    got = classify(-9, 9, "(APIServer pid=1) INFO 11-29 22:17:47 [entry.py:140] Starting vLLM")
    assert (got.reason, got.excerpt) == ("killed", None)


def test_exit_code_2_without_a_line_is_bad_args():
    assert classify(2, None, "").reason == "bad_args"


def test_oom_lines_from_cuda_and_rocm():
    # The formats PyTorch's caching allocators raise (c10/cuda/CUDACachingAllocator.cpp).
    cuda = (
        "(EngineCore pid=311) ERROR 01-02 10:00:00 [core.py:900] torch.OutOfMemoryError: CUDA out"
        " of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 139.72 GiB of"
        " which 1.02 GiB is free."
    )
    hip = "torch.OutOfMemoryError: HIP out of memory. Tried to allocate 1.50 GiB. GPU 3 has a"
    for line in (cuda, hip):
        got = classify(1, None, f"Traceback (most recent call last):\n{line}\n")
        assert got.reason == "oom" and got.excerpt.startswith(line[:40])


def test_oom_in_the_engine_outranks_the_engine_dead_that_follows():
    tail = (
        "(EngineCore pid=5) ERROR 01-02 10:00:00 [core.py:1] torch.OutOfMemoryError: CUDA out of"
        " memory. Tried to allocate 20.00 MiB.\n"
        "(APIServer pid=4) ERROR 01-02 10:00:01 [async_llm.py:906] vllm.v1.engine.exceptions."
        "EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root"
        " cause.\n"
    )
    assert classify(0, None, tail).reason == "oom"


def test_no_available_memory_for_cache_blocks_is_a_memory_refusal():
    # issue 14: a start-up memory refusal, whoever holds the memory (memory.py decides what next)
    tail = (
        "ValueError: No available memory for the cache blocks. Try increasing "
        "`gpu_memory_utilization` when initializing the engine.\n"
    )
    assert classify(1, None, tail).reason == "gpu_memory_insufficient"


def test_warning_lines_mentioning_memory_do_not_decide():
    tail = (
        "(APIServer pid=1) WARNING 01-02 10:00:00 [x.py:1] CUDA out of memory may occur with "
        "these settings\n"
    )
    assert classify(1, None, tail).reason == "unknown"


def test_no_such_file_counts_only_for_the_model_path():
    tail = "FileNotFoundError: [Errno 2] No such file or directory: '/models/llama/config.json'\n"
    assert classify(1, None, tail, model="/models/llama").reason == "model_not_found"
    assert classify(1, None, tail, model="/models/other").reason == "unknown"


def test_torch_distributed_port_clash_is_not_the_api_port():
    tail = (
        "RuntimeError: The server socket has failed to listen on any local network address. "
        "port: 29500, useIpv6: 0, code: -98, name: EADDRINUSE, message: address already in use\n"
    )
    assert classify(1, None, tail).reason == "unknown"


def test_vllm_router_metrics_port_in_use_is_port_in_use():
    # vllm-router 0.1.17 with its --prometheus-port taken (seen here)
    tail = (
        "pyo3_runtime.PanicException: failed to install Prometheus metrics exporter: "
        'FailedToCreateHTTPListener("Address already in use (os error 98)")\n'
    )
    assert classify(1, None, tail).reason == "port_in_use"


def test_engine_init_failure_names_the_root_cause():
    tail = (
        "Process EngineCore:\nTraceback (most recent call last):\n"
        "ValueError: Unsupported CPU attention configuration: head_dim=16\n"
        "Traceback (most recent call last):\n"
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core "
        "proc(s): {'EngineCore': 1}\n"
    )
    got = classify(1, None, tail)
    assert got.reason == "engine_dead"
    assert got.excerpt.splitlines()[0].startswith("ValueError: Unsupported CPU attention")


def test_unknown_keeps_the_last_exception_line():
    got = classify(1, None, "Traceback (most recent call last):\nKeyError: 'boom'\n")
    assert got == type(got)(ExitReason.UNKNOWN, "KeyError: 'boom'")


def test_signal_names():
    assert signal_name(9) == "SIGKILL" and signal_name(None) is None


GPU = Path(__file__).parents[2] / "fixtures" / "vllm-0.26-h200" / "exits"
ISSUE_14_VALUE_ERROR = (
    "ValueError: Free memory on device cuda:0 (38.77/139.8 GiB) on startup is less than desired "
    "GPU memory utilization (0.9, 125.82 GiB). Decrease GPU memory utilization or reduce GPU "
    "memory used by other processes."
)


def test_free_memory_below_utilization_is_its_own_reason_with_the_engine_cores_line():
    text = (GPU / "gpu_memory_free_below_utilization.log").read_text()
    assert "RuntimeError: Engine core initialization failed" in text  # the APIServer's echo
    got = classify(1, None, text, model="/models/Qwen2.5-7B-Instruct", starting=True)
    assert got.reason == "gpu_memory_insufficient"
    assert got.excerpt == ISSUE_14_VALUE_ERROR
    # the same without knowing the run was starting: the refusal only happens at start-up
    assert classify(1, None, text).reason == "gpu_memory_insufficient"


def test_no_cache_blocks_is_a_memory_refusal():
    got = classify(1, None, (GPU / "gpu_memory_no_cache_blocks.log").read_text(), starting=True)
    assert got.reason == "gpu_memory_insufficient"
    assert got.excerpt.startswith("ValueError: No available memory for the cache blocks")


def test_cuda_oom_is_a_memory_refusal_at_start_and_oom_while_serving():
    text = (GPU / "gpu_memory_cuda_oom_at_start.log").read_text()
    at_start = classify(1, None, text, starting=True)
    assert at_start.reason == "gpu_memory_insufficient"
    assert at_start.excerpt.startswith("torch.OutOfMemoryError: CUDA out of memory")
    assert classify(1, None, text, starting=False).reason == "oom"
    hip = "torch.OutOfMemoryError: HIP out of memory. Tried to allocate 2.00 GiB."
    assert classify(1, None, hip, starting=True).reason == "gpu_memory_insufficient"
    host = "RuntimeError: DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 GB"
    assert classify(1, None, host, starting=True).reason == "oom"


def test_the_kv_cache_config_refusal_stays_kv_cache_too_small():
    got = classify(1, None, log("kv_cache_too_small.log"), starting=True)
    assert got.reason == "kv_cache_too_small"


def test_the_captured_h200_refusal_is_classified_with_the_engine_cores_line():
    # a real vLLM 0.26 capture (tests/fixtures/vllm-0.26-cuda/README.md): a torch process held
    # 86412 MiB of the GPU while an instance at 0.90 started
    real = Path(__file__).parents[2] / "fixtures" / "vllm-0.26-cuda" / "exits"
    text = (real / "gpu_memory_refused_foreign_process.log").read_text()
    got = classify(1, None, text, starting=True)
    assert got.reason == "gpu_memory_insufficient"
    assert got.excerpt.startswith("(EngineCore pid=3185) ValueError: Free memory on device cuda:0")
    assert got.excerpt is not None
    assert "RuntimeError" not in got.excerpt
