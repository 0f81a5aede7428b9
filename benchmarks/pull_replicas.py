"""Eight replicas of one hub model started by the daemon, with and without the pull step.

    python -m benchmarks.pull_replicas [--replicas 8] [--shards 4] [--shard-mib 32]
                                       [--rate-mib 64] [--runs 3]

The hub is the tests' fake hub (tests/fakehub) on 127.0.0.1 serving a sharded model (noise
weights, an index, config and tokenizer), each transfer held to `--rate-mib` MiB/s to stand in
for a network. The replicas are vLLM emulators with `--load-model` (tests/programs): like vLLM
0.32 they find the model's files before they listen, and for a hub id fetch them with
huggingface_hub (snapshot_download under a per-model file lock, as vLLM's
download_weights_from_hf does). Each mode starts from an empty cache and a new daemon:

- `pull`: `vsup up` as shipped: the daemon pulls the model once (control/pulls.py), then starts
  every replica from the local snapshot with HF_HUB_OFFLINE=1;
- `no_pull`: `vsup up --no-pull`: the replicas are given the hub id and download it themselves,
  inside their start (what start_timeout_s then measures).

Figures per mode (medians over `--runs`): bytes the hub sent (MiB), its requests (file GETs,
HEADs, API calls), seconds from the apply to every replica ready, and the longest replica start
(spawn to ready, the engine's `startup_s`: the part start_timeout_s covers).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.common import (  # noqa: E402
    EMULATOR,
    PYTHON,
    TOKEN_VAR,
    Daemon,
    bench_home,
    free_ports,
    last_line,
    median,
    new_token,
)
from tests.fakehub.models import sharded_repo  # noqa: E402
from tests.fakehub.server import FakeHub  # noqa: E402

MiB = 2**20
MODEL = "bench/sharded"


def layout(ports: list[int], token: str) -> str:
    cmd = json.dumps([PYTHON, str(EMULATOR)])
    text = f"""[layout]
name = "pull-bench"

[defaults]
model = "{MODEL}"
command = {cmd}
host = "127.0.0.1"
health_interval_s = 0.2
start_timeout_s = 600
args = {{ load-model = true }}
env = {{ {TOKEN_VAR} = "{token}" }}
restart = {{ policy = "never" }}
"""
    for i, port in enumerate(ports):
        text += f'\n[[instance]]\nname = "r{i}"\ngpus = []\nport = {port}\n'
    return text


def one_run(mode: str, args: argparse.Namespace, repo: object) -> dict[str, float]:
    token = new_token()
    with FakeHub([repo], rate_bps=args.rate_mib * MiB) as hub, bench_home() as home:  # type: ignore[list-item]
        scratch = Path(tempfile.mkdtemp(prefix="vsup-pull-bench-"))
        saved = dict(os.environ)
        os.environ.pop("HF_HUB_OFFLINE", None)
        os.environ.update(
            HF_ENDPOINT=hub.url,
            HF_HUB_CACHE=str(scratch / "cache"),
            HF_HOME=str(scratch / "hf-home"),
            HF_HUB_DISABLE_PROGRESS_BARS="1",
        )
        try:
            daemon = Daemon(home, token)
            try:
                path = home / "layout.toml"
                path.write_text(layout(free_ports(args.replicas), token))
                t0 = time.monotonic()
                answer = daemon.client.apply(path.read_text(), str(path), pull=mode == "pull")
                assert not answer.get("errors"), answer
                status = daemon.wait_states(("ready", "failed"), timeout=900)
                all_ready = time.monotonic() - t0
                bad = [i["name"] for i in status["instances"] if i["state"] != "ready"]
                if bad:
                    raise RuntimeError(f"{mode}: not ready: {bad} (see {home}/logs)")
                events = [json.loads(x) for x in (home / "journal.jsonl").read_text().splitlines()]
                startups = [e["startup_s"] for e in events if e["kind"] == "ready"]
                pulled = [e for e in events if e["kind"] == "pull_done"]
            finally:
                daemon.close()
        finally:
            os.environ.clear()
            os.environ.update(saved)
        reqs = list(hub.requests)
        return {
            "mib": hub.bytes_sent() / MiB,
            "gets": sum(1 for r in reqs if r.method == "GET" and "/resolve/" in r.path),
            "heads": sum(1 for r in reqs if r.method == "HEAD"),
            "api": sum(1 for r in reqs if r.path.startswith("/api/models/")),
            "all_ready_s": all_ready,
            "startup_max_s": max(startups),
            "pull_s": float(pulled[0]["elapsed_s"]) if pulled else 0.0,
        }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--replicas", type=int, default=8)
    p.add_argument("--shards", type=int, default=4)
    p.add_argument("--shard-mib", type=int, default=32)
    p.add_argument("--rate-mib", type=float, default=64.0, help="per transfer, MiB/s")
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args(argv)
    repo = sharded_repo(MODEL, [args.shard_mib * MiB] * args.shards)
    size = sum(len(b) for b in repo.files.values()) / MiB
    results: dict[str, list[dict[str, float]]] = {"pull": [], "no_pull": []}
    for run in range(args.runs):
        for mode in ("pull", "no_pull") if run % 2 == 0 else ("no_pull", "pull"):
            r = one_run(mode, args, repo)
            results[mode].append(r)
            print(f"run {run + 1} {mode}: " + ", ".join(f"{k} {v:.2f}" for k, v in r.items()))
    figures: dict[str, object] = {
        "replicas": args.replicas,
        "model_mib": round(size, 1),
        "runs": args.runs,
    }
    for mode, rs in results.items():
        for key in rs[0]:
            figures[f"{mode}_{key}"] = round(median([r[key] for r in rs]), 2)
    print(
        f"{args.replicas} replicas of a {size:.0f} MiB model ({args.shards} shards), hub at "
        f"{args.rate_mib:g} MiB/s per transfer, medians of {args.runs} runs:"
    )
    for mode in results:
        print(
            f"  {mode:8s} hub sent {figures[f'{mode}_mib']} MiB in {figures[f'{mode}_gets']} "
            f"GETs, {figures[f'{mode}_heads']} HEADs, {figures[f'{mode}_api']} API calls; all "
            f"ready after {figures[f'{mode}_all_ready_s']} s; longest start (spawn to ready) "
            f"{figures[f'{mode}_startup_max_s']} s"
        )
    print(last_line(**figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
