"""Test servers only: vLLM's CPU build forks its EngineCore, as vLLM does on a GPU.

The CPU platform sets VLLM_WORKER_MULTIPROC_METHOD=spawn in its `check_and_update_config`
(vllm/platforms/cpu.py), so the EngineCore (and each data-parallel rank) is a fresh
interpreter that imports torch, transformers and vLLM again: about half of a test server's
~22 CPU-s start. On a GPU node vLLM forks it (its default, while CUDA is not initialized in the
API server). This module, put on PYTHONPATH of the test servers that run in one-process mode
(tests/conftest.py `vllm_env`), sets the method back to `fork` right after that call, so those
servers get the process tree and the start path a GPU server at TP1 has, at ~12 CPU-s a start.

It changes nothing else. (A forked EngineCore's process title overwrites its /proc/PID/environ,
as on a GPU: vsup never reads it, and the test servers also get SPT_NOENV=1, which keeps it, for
the tests that find a home's processes by their environment.) The engine's own tests of the
three-process tree (engine/test_vllm.py) and the shipped demo layout's (test_cpu_node_vllm.py,
through its daemons' environment) use it too, without one-process mode: both children,
EngineCore and worker, forked. Where the CPU build's own start is what a test is about (the
install test), it is not used.
`VSUP_TEST_SPAWN_CORE=1` in the suite's environment leaves every server as it comes.
If vLLM no longer has what this wraps, it says so on stderr and leaves vLLM as it is.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from types import ModuleType

_TARGET = "vllm.platforms.cpu"


class _ForkCore(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != _TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_wrap(module: ModuleType) -> None:
            exec_module(module)
            platform = getattr(module, "CpuPlatform", None)
            check = getattr(platform, "check_and_update_config", None)
            if check is None:
                print(
                    f"vsup tests: {_TARGET}.CpuPlatform.check_and_update_config is gone; "
                    "the EngineCore is started as vLLM does",
                    file=sys.stderr,
                )
                return
            original = check.__func__

            def check_and_update_config(cls, vllm_config):
                original(cls, vllm_config)
                os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"

            platform.check_and_update_config = classmethod(check_and_update_config)

        spec.loader.exec_module = exec_and_wrap  # type: ignore[method-assign]
        return spec


sys.meta_path.insert(0, _ForkCore())
