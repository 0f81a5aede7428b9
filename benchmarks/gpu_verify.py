"""GPU verification on a real NVIDIA node: pinning, HBM attribution, co-tenant start order, memory
release after an orphaning SIGKILL, and `vsup down` releasing everything.

The same checks against real vLLM are in benchmarks/gpu_real.py (run that one first). This
script keeps the vLLM *emulator* (tests/programs/vllm_emulator.py) for what only it can do:
a set HBM per process and a set start-up time, on cue, on any number of GPUs, in seconds. It
allocates a set amount of HBM with torch on the GPU it is given, starts a child that holds more
(as EngineCore does, in the same process group, alive after its parent is SIGKILLed), answers
/health and serves a recorded vLLM /metrics payload.
Everything else is the real vsup: CLI, daemon, engine, NVML probe, journal.

    python3 benchmarks/gpu_verify.py --out DIR

Checks (each printed as PASS/FAIL with its figures; exit 1 if any fails):
 1. start order: co-tenants of GPU 0 start one after the other (the second spawns after the
    first is ready); GPU 1's instance starts in parallel with GPU 0's first;
 2. pinning: every pid of an instance's tree holds memory only on that instance's GPU;
 3. per-instance HBM in `vsup status --json` == the sum over its pids in
    `nvidia-smi --query-compute-apps` (MiB rounding: 1 MiB per process);
 4. per-GPU used/total in `vsup status --json` within 1% of `nvidia-smi --query-gpu`;
 5. SIGKILL of an instance's parent: its child still holds HBM right after; vsup kills the
    group, sees NVML release the memory, then spawns the instance again on the same GPU;
 6. `vsup down`: no process of ours left, every GPU back to its used memory before the run.
It also saves the dashboard (SVG) as the daemon shows this node.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.gpulib import (
    EMULATOR,
    MiB,
    alive,
    check,
    journal,
    results,
    screenshot,
    smi_apps,
    smi_gpus,
    status,
    tree_pids,
    ts,
    vsup,
    wait_for,
)


def layout_text(gpu_count: int) -> str:
    def inst(name: str, gpu: int, port: int, hbm: float, child: float, util: float) -> str:
        cmd = [
            "python3",
            str(EMULATOR),
            "--startup-s",
            "3",
            "--hbm-gib",
            str(hbm),
            "--child-hbm-gib",
            str(child),
        ]
        return (
            f'[[instance]]\nname = "{name}"\ngpus = [{gpu}]\nport = {port}\n'
            f"gpu_memory_utilization = {util}\ncommand = {json.dumps(cmd)}\n\n"
        )

    text = (
        '[layout]\nname = "gpu-verify"\n\n[defaults]\nmodel = "emulated/vllm-emulator"\n'
        "pull = false\n"  # the emulator loads no model: nothing for the daemon to pull
        'host = "127.0.0.1"\nstart_timeout_s = 180\nstop_grace_s = 10\n'
        'restart = { policy = "on-failure", backoff_s = 1, max_failures = 5 }\n\n'
    )
    text += inst("gpu0a", 0, 8300, 4, 2, 0.45)
    text += inst("gpu0b", 0, 8301, 3, 1, 0.45)
    if gpu_count > 1:
        text += inst("gpu1", 1, 8302, 5, 2, 0.9)
    return text


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path(tempfile.mkdtemp(prefix="gpu-verify-")))
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    home = Path(tempfile.mkdtemp(prefix="vsup-gpu-", dir="/tmp"))
    os.environ["VSUP_HOME"] = str(home)
    layout = home / "gpu-verify.toml"

    before = smi_gpus()
    gpu_count = len(before)
    print(
        f"GPUs: {gpu_count}; used before (MiB): "
        f"{ {g['index']: g['used_mib'] for g in before.values()} }"
    )
    layout.write_text(layout_text(gpu_count))
    print(layout.read_text())
    vsup("validate", str(layout), check_rc=True)

    # 1. start order
    t0 = time.time()
    vsup("up", str(layout), "--detach", "--wait", "--timeout", "300")
    all_ready_s = time.time() - t0
    ev = journal(home)
    spawn = {e["instance"]: ts(e) for e in ev if e["kind"] == "spawn"}
    ready = {e["instance"]: ts(e) for e in ev if e["kind"] == "ready"}
    print(json.dumps({"spawn": spawn, "ready": ready, "all_ready_s": all_ready_s}, indent=1))
    check(
        "co-tenants start one after the other",
        spawn["gpu0b"] >= ready["gpu0a"],
        f"gpu0a ready at +{ready['gpu0a'] - spawn['gpu0a']:.2f}s, gpu0b spawned "
        f"+{spawn['gpu0b'] - spawn['gpu0a']:.2f}s after gpu0a's spawn "
        f"({spawn['gpu0b'] - ready['gpu0a']:.3f}s after its readiness)",
    )
    if gpu_count > 1:
        check(
            "another GPU starts in parallel",
            spawn["gpu1"] < ready["gpu0a"],
            f"gpu1 spawned {spawn['gpu1'] - spawn['gpu0a']:+.3f}s from gpu0a's spawn, "
            f"before gpu0a was ready (+{ready['gpu0a'] - spawn['gpu0a']:.2f}s)",
        )

    # 2-4. pinning and attribution, once every instance's memory is visible to NVML
    def settled():
        st = status()
        return st if all(i["hbm_bytes"] for i in st["instances"]) else None

    time.sleep(3)
    st = wait_for(settled, 60, "HBM figures for every instance")
    apps = smi_apps()
    gpus_now = smi_gpus()
    (args.out / "status_ready.json").write_text(json.dumps(st, indent=1))
    for inst in st["instances"]:
        pids = tree_pids(inst["pid"])
        mine = [a for a in apps if a["pid"] in pids]
        on_other = [a for a in mine if a["gpu"] not in inst["gpus"]]
        check(
            f"{inst['name']} pinned to GPU {inst['gpus']}",
            not on_other and bool(mine),
            f"pids {sorted(pids)} hold memory on GPUs {sorted({a['gpu'] for a in mine})}",
        )
        smi_sum = sum(a["used_mib"] for a in mine)
        vsup_mib = inst["hbm_bytes"] / MiB
        check(
            f"{inst['name']} HBM == nvidia-smi sum over its pids",
            abs(vsup_mib - smi_sum) <= len(mine) + 0.01 and inst["hbm_source"] == "process",
            f"vsup {inst['hbm_bytes']} B = {vsup_mib:.1f} MiB ({inst['hbm_source']}), "
            f"nvidia-smi {smi_sum} MiB over {len(mine)} pids",
        )
    by_index = {g["index"]: g for g in gpus_now.values()}
    for g in st["gpus"]:
        ref = by_index[g["index"]]
        used_mib, total_mib = g["hbm_used_bytes"] / MiB, g["hbm_total_bytes"] / MiB
        ok = (
            abs(used_mib - ref["used_mib"]) <= max(0.01 * ref["used_mib"], 1)
            and abs(total_mib - ref["total_mib"]) <= 0.01 * ref["total_mib"]
        )
        check(
            f"GPU {g['index']} used/total matches nvidia-smi",
            ok,
            f"vsup {used_mib:.0f}/{total_mib:.0f} MiB, nvidia-smi "
            f"{ref['used_mib']}/{ref['total_mib']} MiB",
        )

    for size in ((160, 45), (80, 24)):
        screenshot(args.out / f"gpu-node-h200-{size[0]}x{size[1]}.svg", size, select="gpu0b")

    # 5. SIGKILL of gpu0a's parent: the child keeps HBM; vsup sweeps, waits, restarts
    victim = next(i for i in st["instances"] if i["name"] == "gpu0a")
    pid = victim["pid"]
    orphans = tree_pids(pid) - {pid}
    seq0 = max(e.get("seq", 0) for e in journal(home))
    # The daemon is paused (SIGSTOP) around the kill so the orphan can be seen holding its
    # memory: running, vsup sweeps it within milliseconds, before any outside look.
    daemon_pid = st["supervisor"]["pid"]
    os.kill(daemon_pid, signal.SIGSTOP)
    try:
        t_kill = time.time()
        os.kill(pid, signal.SIGKILL)
        held = wait_for(
            lambda: [a for a in smi_apps() if a["pid"] in orphans], 10, "the orphan in nvidia-smi"
        )
        parent_gone = not alive(pid)
    finally:
        os.kill(daemon_pid, signal.SIGCONT)
    check(
        "after SIGKILL of the parent its child still holds HBM",
        bool(held) and parent_gone,
        f"parent {pid} gone: {parent_gone}; orphans {sorted(orphans)} hold "
        f"{sum(a['used_mib'] for a in held)} MiB",
    )

    def back():
        s = status()
        i = next(x for x in s["instances"] if x["name"] == "gpu0a")
        return s if i["state"] == "ready" and i["pid"] != pid else None

    st2 = wait_for(back, 240, "gpu0a ready again")
    ev = [e for e in journal(home) if e.get("seq", 0) > seq0 and e.get("instance") == "gpu0a"]
    (args.out / "journal_after_kill.json").write_text(json.dumps(ev, indent=1))
    kinds = [e["kind"] for e in ev]
    exit_ev = next((e for e in ev if e["kind"] == "exit"), None)
    rel = next((e for e in ev if e["kind"] == "gpu_release"), None)
    respawn = next((e for e in ev if e["kind"] == "spawn"), None)
    print("journal after the kill:", kinds)
    check(
        "exit classified killed", bool(exit_ev) and exit_ev.get("reason") == "killed", f"{exit_ev}"
    )
    check(
        "memory released before the new spawn",
        rel is not None
        and rel.get("released") is True
        and respawn is not None
        and ts(respawn) >= ts(rel),
        f"release {rel}; spawn at +{(ts(respawn) - t_kill) if respawn else float('nan'):.2f}s"
        f" after the kill",
    )
    left = [a for a in smi_apps() if a["pid"] in orphans]
    check(
        "the orphaned child is gone",
        not left and not any(alive(o) for o in orphans),
        f"left: {left}",
    )
    inst2 = next(x for x in st2["instances"] if x["name"] == "gpu0a")
    check(
        "restarted on the same GPU",
        inst2["gpus"] == [0] and inst2["restarts"] >= 1,
        f"pid {pid} -> {inst2['pid']}, gpus {inst2['gpus']}, restarts {inst2['restarts']}",
    )

    # 6. down releases everything
    pids_before_down = set()
    for i in status()["instances"]:
        if i["pid"]:
            pids_before_down |= tree_pids(i["pid"])
    vsup("down")
    time.sleep(1.0)
    after = smi_gpus()
    leftover = [p for p in pids_before_down if alive(p)]
    apps_after = [a for a in smi_apps() if a["pid"] in pids_before_down]
    check(
        "vsup down leaves no process",
        not leftover and not apps_after,
        f"left: {leftover}, on GPUs: {apps_after}",
    )
    for uuid, g in after.items():
        check(
            f"GPU {g['index']} memory back to its level before the run",
            g["used_mib"] <= before[uuid]["used_mib"],
            f"before {before[uuid]['used_mib']} MiB, after {g['used_mib']} MiB",
        )

    failed = [r for r in results if not r[1]]
    summary = f"checks={len(results)} failed={len(failed)} all_ready_s={all_ready_s:.1f}"
    (args.out / "gpu_verify.txt").write_text(
        "\n".join(f"{'PASS' if ok else 'FAIL'} {n}: {d}" for n, ok, d in results) + "\n" + summary
    )
    print(summary)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
