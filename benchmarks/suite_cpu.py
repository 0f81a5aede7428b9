"""CPU-seconds of a test-suite run per test module and kind of process (docs/testing.md).

Every process the run starts carries a tag in its environment (`VSUP_PROF_TAG`), and the test
module that started it in `PYTEST_CURRENT_TEST` (pytest sets it; daemons and the vLLMs they
start inherit it). This samples /proc once a second and adds each tagged process's CPU to its
module: a pytest worker's own CPU goes to the module of its newest child. A process that lives
less than a sample is counted through its parent's children's times.

    python -m benchmarks.suite_cpu TAG OUT.json &          # stops when OUT.json.stop exists
    VSUP_PROF_TAG=TAG make test PYTEST_ARGS="--durations=0"
    touch OUT.json.stop

OUT.json: `by_module`, `by_kind` (vllm-api, vllm-core for the EngineCores and workers, daemon,
pytest, vsup-cli, bench-client, emulator, ...), `detail`, and the machine's busy CPU-seconds
beside the tagged ones (what else ran), and `untagged_by_kind`: the CPU of untagged processes by
kind (an SSH session's or a cleared environment's processes lose the tag; so does anything else
the machine ran meanwhile).
"""

from __future__ import annotations

import collections
import json
import os
import sys
import time
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def kind(cmd: str) -> str:
    if cmd.startswith("VLLM::") or "multiprocessing" in cmd:
        return "vllm-core"  # EngineCore, workers, DP ranks (spawned, then retitled)
    if "vllm.entrypoints" in cmd or "vsup.vllmserve" in cmd:
        return "vllm-api"
    if "vllm" in cmd and "bench" in cmd:
        return "bench-client"
    if "emulator" in cmd:
        return "emulator"
    if "vllm-router" in cmd or "vllm_router" in cmd:
        return "router"
    if "vsup" in cmd and " daemon" in cmd:
        return "daemon"
    if "pytest" in cmd or "execnet" in cmd or "exec(eval(sys.stdin" in cmd:
        return "pytest"
    if "vsup" in cmd:
        return "vsup-cli"
    if "sshd" in cmd or cmd.startswith("ssh"):
        return "ssh"
    return "other"


def largest(counts: dict) -> list:
    return sorted(counts.items(), key=lambda kv: -kv[1])


def busy_cpu_s() -> float:
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v) - v[3] - v[4]) / TICK


def main(tag: str, out: Path) -> None:
    info: dict[tuple[int, str], tuple[bool, str, str, int]] = {}
    last: dict[tuple[int, str], tuple[float, float, int]] = {}
    by_module: collections.defaultdict[str, float] = collections.defaultdict(float)
    by_kind: collections.defaultdict[str, float] = collections.defaultdict(float)
    detail: collections.defaultdict[tuple[str, str], float] = collections.defaultdict(float)
    newest_child: dict[int, str] = {}
    untagged: collections.defaultdict[str, float] = collections.defaultdict(float)
    untagged_last: dict[tuple[int, str], float] = {}
    me = os.getpid()
    t0, busy0 = time.time(), busy_cpu_s()
    while True:
        seen: dict[tuple[int, str], tuple[float, float, int]] = {}
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                fields = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            key = (int(d), fields[19])
            if key not in info:
                try:
                    raw = Path(f"/proc/{d}/environ").read_bytes().decode("utf-8", "replace")
                    cmd = Path(f"/proc/{d}/cmdline").read_bytes().replace(b"\0", b" ")
                except OSError:
                    continue
                env = dict(x.split("=", 1) for x in raw.split("\0") if "=" in x)
                test = env.get("PYTEST_CURRENT_TEST", "")
                module = test.split("::")[0].rsplit("/", 1)[-1] if test else "?"
                tagged = env.get("VSUP_PROF_TAG") == tag
                text = cmd.decode("utf-8", "replace").strip()
                info[key] = (tagged, module, kind(text), int(fields[1]))
                if tagged and module != "?":
                    newest_child[int(fields[1])] = module
            tagged, module, what, ppid = info[key]
            own = (int(fields[11]) + int(fields[12])) / TICK
            if tagged:
                children = (int(fields[13]) + int(fields[14])) / TICK
                seen[key] = (own, children, ppid)
            elif key[0] != me:
                # what else ran (a process that lost the tag: an SSH session's, a cleared
                # environment's): its own CPU by kind, started or grown since the sampler began
                base = untagged_last.get(key)
                if base is None and time.time() - t0 <= 3:
                    base = own
                untagged[what] += own - (base or 0.0)
                untagged_last[key] = own
        # a process gone since the last sample: its parent's children's times now hold it
        gone: collections.defaultdict[int, float] = collections.defaultdict(float)
        for key, (own, children, ppid) in last.items():
            if key not in seen:
                gone[ppid] += own + children
        for key, (own, children, _ppid) in seen.items():
            _tagged, module, what, _ = info[key]
            before = last.get(key)
            if before is None:
                d_own, d_children = (own, children) if time.time() - t0 > 3 else (0.0, 0.0)
            else:
                d_own, d_children = own - before[0], children - before[1]
            d_children = max(0.0, d_children - gone.get(key[0], 0.0))
            if what == "pytest":
                module = newest_child.get(key[0], "?")
            for label, value in ((what, d_own), (f"{what} (short children)", d_children)):
                if value > 0:
                    by_module[module] += value
                    by_kind[label] += value
                    detail[(module, label)] += value
        last = seen
        out.write_text(
            json.dumps(
                {
                    "elapsed_s": round(time.time() - t0, 1),
                    "machine_busy_cpu_s": round(busy_cpu_s() - busy0, 1),
                    "tagged_cpu_s": round(sum(by_module.values()), 1),
                    "by_module": [(m, round(v, 1)) for m, v in largest(by_module)],
                    "by_kind": [(k, round(v, 1)) for k, v in largest(by_kind)],
                    "detail": [(m, k, round(v, 1)) for (m, k), v in largest(detail)[:200]],
                    "untagged_by_kind": [(k, round(v, 1)) for k, v in largest(untagged)],
                },
                indent=0,
            )
        )
        if Path(f"{out}.stop").exists():
            return
        time.sleep(1)


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
