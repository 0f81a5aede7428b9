"""Start order, timed: instances on distinct devices start in parallel, co-tenants one by one.

    python -m benchmarks.launch [--startup-s 2.0] [--runs 5] [--instances 8] [--cotenants 4]

The Engine (supervisor/vsup/engine) starts vLLM emulators (tests/programs/vllm_emulator.py, not
vLLM) whose start-up takes `--startup-s` seconds before their port answers, as vLLM's refuses
connections until it is ready. The devices are GPU indices in the specs (`gpus = [i]`): the
engine orders starts by `spec.devices` only, and the emulator touches no GPU, so fake indices
are fine here. Health is checked every 0.05 s. Each figure is the median over `--runs` runs of
`await engine.apply(specs, wait=True)` (spawn to every instance ready), a fresh engine each run:

- `single_s`: one instance;
- `parallel_N_s`: N instances on N distinct GPUs (should be ~ single_s: they start together);
- `cotenant_M_s`: M instances sharing one GPU (one after another: each starts after the
  previous answers /health 200);
- `sequential_N_s`: the naive way, N instances one after another (N on one device).
`parallel_ratio` = parallel_N_s / single_s (target: close to 1; `parallel_extra_s` is what
the N spawns add, on this machine's 2 cores), `cotenant_ratio` = cotenant_M_s / single_s (~M),
`speedup` = sequential_N_s / parallel_N_s.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from vsup.clock import SystemClock  # noqa: E402
from vsup.engine import Engine, EngineSettings  # noqa: E402
from vsup.layout.spec import InstanceSpec, RestartPolicy  # noqa: E402

from benchmarks.common import (  # noqa: E402
    EMULATOR,
    PYTHON,
    TOKEN_VAR,
    free_ports,
    kill_token,
    last_line,
    median,
    new_token,
)


def specs(gpus: list[int], startup_s: float, token: str) -> list[InstanceSpec]:
    ports = free_ports(len(gpus))
    return [
        InstanceSpec(
            name=f"e{i:02d}",
            model="bench/emulated",
            command=(PYTHON, str(EMULATOR)),
            host="127.0.0.1",
            port=ports[i],
            gpus=(g,),
            gpu_memory_utilization=None,
            args={"startup-s": startup_s},
            env={TOKEN_VAR: token},
            restart=RestartPolicy(policy="never"),
            start_timeout_s=120,
            stop_grace_s=5,
            health_interval_s=0.05,
        )
        for i, g in enumerate(gpus)
    ]


async def one_start(gpus: list[int], startup_s: float, token: str) -> float:
    with tempfile.TemporaryDirectory(prefix="vsup-launch-") as tmp:
        engine = Engine(
            SystemClock(), Path(tmp) / "logs", settings=EngineSettings(health_timeout_s=1.0)
        )
        try:
            batch = specs(gpus, startup_s, token)
            t0 = time.monotonic()
            await engine.apply(batch, wait=True)
            took = time.monotonic() - t0
            states = {n: i.state for n, i in engine.instances.items()}
            if set(states.values()) != {"ready"}:
                raise RuntimeError(f"not all ready: {states}")
            return took
        finally:
            await engine.shutdown(stop_instances=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--startup-s", type=float, default=2.0)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--instances", type=int, default=8)
    ap.add_argument("--cotenants", type=int, default=4)
    ap.add_argument("--no-sequential", action="store_true", help="skip the naive sequential run")
    args = ap.parse_args(argv)
    n, m = args.instances, args.cotenants
    cases = {
        "single_s": [0],
        f"parallel_{n}_s": list(range(n)),
        f"cotenant_{m}_s": [0] * m,
    }
    if not args.no_sequential:
        cases[f"sequential_{n}_s"] = [0] * n
    token = new_token()
    got: dict[str, list[float]] = {k: [] for k in cases}
    try:
        for run in range(args.runs):
            for key, gpus in cases.items():
                got[key].append(asyncio.run(one_start(gpus, args.startup_s, token)))
            print(
                f"run {run + 1}: " + " ".join(f"{k}={v[-1]:.2f}" for k, v in got.items()),
                flush=True,
            )
    finally:
        left = kill_token(token)
        if left:
            print(f"warning: killed {len(left)} processes left behind: {left}", file=sys.stderr)
    med = {k: median(v) for k, v in got.items()}
    single = med["single_s"]
    figures: dict[str, object] = {"startup_s": args.startup_s, **med}
    figures["parallel_ratio"] = med[f"parallel_{n}_s"] / single
    figures["parallel_extra_s"] = med[f"parallel_{n}_s"] - single
    figures["cotenant_ratio"] = med[f"cotenant_{m}_s"] / single
    if not args.no_sequential:
        figures["speedup"] = med[f"sequential_{n}_s"] / med[f"parallel_{n}_s"]
    figures["runs"] = args.runs
    print(last_line(**figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
