"""Finding the vLLM interpreter, the client's flags and environment, and the client process
plumbing (barrier, progress, result, stop) with a small stand-in program."""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
from pathlib import Path

import psutil

from vsup.bench.client import (
    BOOTSTRAP,
    READY,
    ClientRun,
    client_argv,
    client_env,
    client_flags,
    equivalent_command,
    find_vllm_python,
)
from vsup.layout.spec import InstanceSpec

from tests.factories import instance_spec


def spec(command=("vllm", "serve"), **kw) -> InstanceSpec:
    """gpu0 listening on all interfaces (the client must still reach it on loopback)."""
    base = dict(
        model="/models/llama",
        command=tuple(command),
        host="0.0.0.0",
        port=8123,
        gpus=(0,),
        gpu_memory_utilization=0.9,
    )
    return instance_spec("gpu0", **{**base, **kw})


def test_python_commands_run_vsups_own_interpreter_directory():
    found = find_vllm_python(spec(("python", "-m", "vllm.entrypoints.openai.api_server")))
    assert Path(found.python).parent == Path(sys.executable).parent
    found = find_vllm_python(spec((sys.executable, "-m", "x")))
    assert found.python == sys.executable and "command" in found.how


def test_a_console_script_gives_the_python_of_its_shebang(tmp_path: Path):
    script = tmp_path / "bin" / "vllm"
    script.parent.mkdir()
    script.write_text(f"#!{sys.executable}\nimport sys\n")
    script.chmod(0o755)
    found = find_vllm_python(spec((str(script), "serve")))
    assert found.python == sys.executable and "shebang" in found.how
    env_script = tmp_path / "bin" / "vllm-env"
    env_script.write_text("#!/usr/bin/env python3\n")
    env_script.chmod(0o755)
    found = find_vllm_python(spec((str(env_script), "serve")))
    assert os.path.basename(found.python).startswith("python3")


def test_a_command_that_is_not_here_falls_back_to_this_interpreter():
    found = find_vllm_python(spec(("/nonexistent/vllm", "serve")))
    assert found.python == sys.executable and "own" in found.how


def test_client_flags_name_the_instance_model_tokenizer_and_result_file(tmp_path: Path):
    s = spec(args={"served-model-name": "llama", "trust-remote-code": True})
    flags = client_flags(s, ["--num-prompts", "8"], tmp_path, "gpu0.json")
    joined = " ".join(flags)
    assert "--base-url http://127.0.0.1:8123" in joined  # 0.0.0.0 -> loopback
    assert "--model /models/llama --served-model-name llama --tokenizer /models/llama" in joined
    assert "--trust-remote-code" in flags and "--ignore-eos" in flags
    assert f"--save-result --save-detailed --result-dir {tmp_path} --result-filename gpu0.json" in (
        joined
    )
    assert equivalent_command(flags).startswith("vllm bench serve --backend vllm ")
    argv = client_argv("/py", flags)
    assert argv[:3] == ["/py", "-c", BOOTSTRAP] and argv[3:] == flags


def test_client_env_has_the_layout_env_no_gpu_and_the_key_by_name(monkeypatch):
    monkeypatch.setenv("MY_KEY", "s3cret")
    monkeypatch.setenv("VLLM_API_KEY", "other")
    env = client_env(spec(env={"HF_HUB_OFFLINE": "1"}, api_key_env="MY_KEY"))
    assert env["HF_HUB_OFFLINE"] == "1" and env["CUDA_VISIBLE_DEVICES"] == ""
    assert env["OPENAI_API_KEY"] == "s3cret" and "VLLM_API_KEY" not in env


STAND_IN = textwrap.dedent(
    f"""
    import json, subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    print("{READY} 9.9.9", flush=True)
    if sys.stdin.readline().strip() != "go":
        sys.exit(3)
    for i in range(1, 5):
        sys.stderr.write(f"\\r 50%|#   | {{i}}/4 [00:01<00:01]")
        sys.stderr.flush()
    if sys.argv[1] == "hang":
        time.sleep(60)
    json.dump({{"completed": 4, "failed": 0}}, open(sys.argv[2], "w"))
    child.kill()
    """
)


def stand_in(tmp_path: Path, mode: str) -> ClientRun:
    result = tmp_path / "r.json"
    return ClientRun(
        instance="cpu0",
        argv=[sys.executable, "-c", STAND_IN, mode, str(result)],
        env=dict(os.environ),
        log_path=tmp_path / "c.log",
        result_path=result,
        total=4,
    )


def test_the_client_waits_at_the_barrier_then_reports_progress_and_its_result(tmp_path: Path):
    c = stand_in(tmp_path, "ok")
    c.start()
    assert c.wait_ready(30) and c.vllm_version == "9.9.9"
    time.sleep(0.3)
    assert c.poll() is None and c.result() is None  # nothing runs before "go"
    assert not c.measuring
    c.go()
    assert c.wait(30) == 0
    assert c.done_requests == 4 and c.measuring
    assert c.result() == {"completed": 4, "failed": 0}
    assert "4/4 [" in (tmp_path / "c.log").read_text()


def test_the_measured_run_starts_after_the_clients_test_request(tmp_path: Path):
    c = stand_in(tmp_path, "ok")
    for line in ("Starting initial single prompt test run...", "Initial test run completed."):
        c._line(line)
    assert not c.measuring
    c._line("  0%|          | 0/8 [00:00<?, ?it/s]")  # another bar (warm-ups): not ours
    assert not c.measuring and c.done_requests == 0
    c._line("Starting main benchmark run...")
    assert c.measuring


def test_stopping_a_client_ends_its_whole_process_group(tmp_path: Path):
    c = stand_in(tmp_path, "hang")
    c.start()
    assert c.wait_ready(30)
    group = os.getpgid(c.proc.pid)
    c.go()
    time.sleep(0.3)
    c.stop(grace=2)
    assert c.poll() is not None
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        left = []
        for p in psutil.process_iter(["pid"]):
            try:
                if os.getpgid(p.pid) == group and p.status() != psutil.STATUS_ZOMBIE:
                    left.append(p.pid)
            except (ProcessLookupError, psutil.Error):
                pass
        if not left:
            break
        time.sleep(0.1)
    assert not left
    assert "exit status" in c.failure() or c.failure()


def test_a_client_that_fails_before_the_barrier_says_why(tmp_path: Path):
    c = ClientRun(
        instance="cpu0",
        argv=[sys.executable, "-c", "raise SystemExit('ModuleNotFoundError: no vllm here')"],
        env=dict(os.environ),
        log_path=tmp_path / "c.log",
        result_path=tmp_path / "r.json",
        total=4,
    )
    c.start()
    assert not c.wait_ready(30)
    c.wait(10)
    assert c.failure() == "ModuleNotFoundError: no vllm here"
    assert json.dumps(c.command_line)
