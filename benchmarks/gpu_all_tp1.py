"""One TP1 instance per GPU on a real NVIDIA node, planned by `vsup plan --gpus all --per-gpu 1`.

The run the 8-GPU issue asks for, written for any GPU count (it runs on a 2-GPU machine
today and unchanged on an 8-GPU one). The instances are the vLLM *emulator*
(tests/programs/vllm_emulator.py) with a set start-up time and HBM held with torch by the server
and by its EngineCore-like child: the parallel-start figure needs start-up times that do not
vary, which only the emulator gives. Real vLLM on the GPU: benchmarks/gpu_real.py.

    python3 benchmarks/gpu_all_tp1.py --out DIR [--startup-s 8]

Checks: the planned layout validates; a single instance's start time; all N start in parallel
and are all ready within 1.2x of the single start; each instance's memory appears on its own GPU
and no other; SIGKILL of two instances' parents at once - both come back on their own GPUs after
their memory is released; `vsup down` releases all HBM and leaves no process.
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

HBM_GIB = 6.0
CHILD_GIB = 3.0


def emulator_layout(planned: Path, out: Path, startup_s: float, only: list[str] | None) -> None:
    """The planned layout, its command swapped for the emulator (the only change)."""
    from vsup.layout import load_layout, save_layout
    from vsup.telemetry.gpu import node_facts

    layout = load_layout(planned)
    cmd = [
        "python3",
        str(EMULATOR),
        "--startup-s",
        str(startup_s),
        "--hbm-gib",
        str(HBM_GIB),
        "--child-hbm-gib",
        str(CHILD_GIB),
    ]
    layout = layout.with_defaults(
        {**layout.defaults, "command": cmd, "restart": {"policy": "on-failure", "backoff_s": 1}}
    )
    if only is not None:
        for name in list(layout.instance_names):
            if name not in only:
                layout = layout.without_instance(name)
    save_layout(layout.relocated(out), out, node=node_facts())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path(tempfile.mkdtemp(prefix="gpu-all-")))
    p.add_argument("--startup-s", type=float, default=8.0)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    home = Path(tempfile.mkdtemp(prefix="vsup-all-", dir="/tmp"))
    os.environ["VSUP_HOME"] = str(home)

    before = smi_gpus()
    n = len(before)
    planned = home / "planned.toml"
    vsup(
        "plan",
        "--model",
        "meta-llama/Llama-3.1-8B-Instruct",
        "--params",
        "8",
        "--dtype",
        "bfloat16",
        "--max-model-len",
        "8192",
        "--gpus",
        "all",
        "--per-gpu",
        "1",
        "-o",
        str(planned),
    )
    print(planned.read_text())
    vsup("validate", str(planned))

    # A single instance first: the reference start time.
    single = home / "single.toml"
    emulator_layout(planned, single, args.startup_s, only=["gpu0"])
    t0 = time.time()
    vsup("up", str(single), "--detach", "--wait", "--timeout", "300")
    single_s = time.time() - t0
    vsup("down")

    full = home / "all.toml"
    emulator_layout(planned, full, args.startup_s, only=None)
    seq0 = max([e.get("seq", 0) for e in journal(home)] or [0])
    t0 = time.time()
    vsup("up", str(full), "--detach", "--wait", "--timeout", "300")
    all_s = time.time() - t0
    ev = [e for e in journal(home) if e.get("seq", 0) > seq0]
    spawns = sorted(ts(e) for e in ev if e["kind"] == "spawn")
    check(
        f"all {n} instances ready within 1.2x of one",
        all_s <= 1.2 * single_s,
        f"one: {single_s:.2f}s, all {n}: {all_s:.2f}s (x{all_s / single_s:.2f}); spawns "
        f"spread over {spawns[-1] - spawns[0]:.3f}s",
    )

    def settled():
        st = status()
        return st if all(i["hbm_bytes"] for i in st["instances"]) else None

    st = wait_for(settled, 90, "HBM figures for every instance")
    apps = smi_apps()
    (args.out / "status_all.json").write_text(json.dumps(st, indent=1))
    for inst in st["instances"]:
        pids = tree_pids(inst["pid"])
        mine = [a for a in apps if a["pid"] in pids]
        gpus_held = sorted({a["gpu"] for a in mine})
        check(
            f"{inst['name']} memory only on GPU {inst['gpus']}",
            gpus_held == inst["gpus"],
            f"{sum(a['used_mib'] for a in mine)} MiB over pids {sorted(pids)} on GPUs "
            f"{gpus_held}; vsup says {inst['hbm_bytes'] / 2**20:.0f} MiB",
        )
    screenshot(args.out / f"all-tp1-{n}gpu-160x45.svg", (160, 45))

    # SIGKILL two parents at once (or the one there is).
    victims = [i for i in st["instances"]][:2]
    victim_pids = {v["name"]: v["pid"] for v in victims}
    seq1 = max(e.get("seq", 0) for e in journal(home))
    for v in victims:
        os.kill(v["pid"], signal.SIGKILL)

    def back():
        s = status()
        now = {i["name"]: i for i in s["instances"]}
        return (
            s
            if all(
                now[n]["state"] == "ready" and now[n]["pid"] != pid
                for n, pid in victim_pids.items()
            )
            else None
        )

    st2 = wait_for(back, 240, "both killed instances ready again")
    ev = [e for e in journal(home) if e.get("seq", 0) > seq1]
    (args.out / "journal_after_kills.json").write_text(json.dumps(ev, indent=1))
    for v in victims:
        mine = [e for e in ev if e.get("instance") == v["name"]]
        rel = next((e for e in mine if e["kind"] == "gpu_release"), None)
        spawn = next((e for e in mine if e["kind"] == "spawn"), None)
        now = next(i for i in st2["instances"] if i["name"] == v["name"])
        check(
            f"{v['name']} back on GPU {v['gpus']} after its memory was released",
            rel is not None
            and rel.get("released") is True
            and spawn is not None
            and ts(spawn) >= ts(rel)
            and now["gpus"] == v["gpus"],
            f"gpu_release {rel and {k: rel[k] for k in ('released', 'waited_s') if k in rel}}"
            f", new pid {now['pid']}",
        )

    pids_before_down: set[int] = set()
    for i in status()["instances"]:
        if i["pid"]:
            pids_before_down |= tree_pids(i["pid"])
    vsup("down")
    time.sleep(1.0)
    after = smi_gpus()
    left = [q for q in pids_before_down if alive(q)]
    check("vsup down leaves no process", not left, f"left: {left}")
    for uuid, g in after.items():
        check(
            f"GPU {g['index']} memory released",
            g["used_mib"] <= before[uuid]["used_mib"],
            f"before {before[uuid]['used_mib']} MiB, after {g['used_mib']} MiB",
        )

    failed = [r for r in results if not r[1]]
    summary = (
        f"gpus={n} single_s={single_s:.2f} all_s={all_s:.2f} "
        f"ratio={all_s / single_s:.2f} checks={len(results)} failed={len(failed)}"
    )
    (args.out / "gpu_all_tp1.txt").write_text(
        "\n".join(f"{'PASS' if ok else 'FAIL'} {n_}: {d}" for n_, ok, d in results)
        + "\n"
        + summary
        + "\n"
    )
    print(summary)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
