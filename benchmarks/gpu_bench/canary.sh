# Canary upgrades on a GPU (issue 39, docs/canary.md): two replicas of a 1B-shape model (random
# weights, bf16) at 0.40 of GPU 0 behind the layout's router, under a steady load of 16
# concurrent clients, while layouts are rolled over them with `canary_s = 45` and the gate's
# default thresholds. Each phase applies one layout with `vsup up --wait` and records what the
# clients saw (requests, failures, latency), the gate's words (the journal's `canary` events) and
# the rollout's end:
#   up       the base layout (max-num-seqs 128, CUDA graphs)
#   bad      max-num-seqs 4 under the same load: the canary queues; the gate must roll it back
#   neutral  an environment variable only: the gate must pass and the rollout go on
#   eager    enforce-eager (no CUDA graphs) on the neutral layout: what the gate says of it
#   down     vsup down
#
# On the device (../shared/gpu-vllm/README.md; the kit laid out by hand, KIT_STAGED=1, see
# docs/gpu-runs/2026-12-06-h100-canary/README.md for the calls), after building the wheel here:
#   .venv/bin/python -m build --wheel --no-isolation -o .gpuwork .
#   bash benchmarks/gpu_bench/canary.sh up bad      (one call)
#   bash benchmarks/gpu_bench/canary.sh neutral eager down   (the next call, same warm machine)
# The record is $OUT/canary/: copy it to docs/gpu-runs/DATE-CARD-canary/.
set -u
root=$(pwd)
[ -n "${KIT_STAGED:-}" ] || source .vllmkit-b/stage.sh || exit 3 # KIT_STAGED: laid out by hand
if [ -z "${VSUP_INSTALLED:-}" ]; then
  source benchmarks/gpu_bench/common.sh # installs the wheel, VSUP_HOME, cd /tmp
else
  export VSUP_HOME=/tmp/vsup-home PYTHONUNBUFFERED=1
  cd /tmp || exit 1
fi
REC="$OUT/canary"
mkdir -p "$REC"

layout() { # layout NAME EXTRA_ARGS EXTRA_ENV
  cat <<EOF
[layout]
name = "canary-$1"
canary_s = 45

[defaults]
model = "/tmp/m1b"
command = ["python3", "-m", "vllm.entrypoints.openai.api_server"]
host = "127.0.0.1"
gpu_memory_utilization = 0.40
env = { HF_HUB_OFFLINE = "1", TOKENIZERS_PARALLELISM = "false"$3 }
start_timeout_s = 900

[router]
port = 8300
metrics_port = 8309
host = "127.0.0.1"
policy = "round_robin"
command = ["python3", "-m", "vllm_router.launch_router"]  # the kit's wheel: no console script

[[instance]]
name = "a"
port = 8301
gpus = [0]
args = { served-model-name = "llama", max-model-len = 2048$2 }

[[instance]]
name = "b"
port = 8302
gpus = [0]
args = { served-model-name = "llama", max-model-len = 2048$2 }
EOF
}
layout base ", max-num-seqs = 128" "" >"$REC/up.toml"
layout bad ", max-num-seqs = 4" "" >"$REC/bad.toml"
layout neutral ", max-num-seqs = 128" ', VSUP_PROOF = "neutral"' >"$REC/neutral.toml"
layout eager ", max-num-seqs = 128, enforce-eager = true" ', VSUP_PROOF = "neutral"' >"$REC/eager.toml"

for phase in "$@"; do
  if [ "$phase" = down ]; then
    python3 -m vsup down --yes >"$REC/down.txt" 2>&1
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv >>"$REC/down.txt" 2>&1
    cat "$REC/down.txt"
    continue
  fi
  python3 - "$REC" "$phase" <<'PYEOF'
import json, os, random, statistics, subprocess, sys, threading, time
from pathlib import Path

import httpx

rec, phase = Path(sys.argv[1]), sys.argv[2]
ROUTER = "http://127.0.0.1:8300"
CLIENTS = 16
lines: list[str] = []


def say(text: str) -> None:
    print(f"[{phase}] {text}", flush=True)
    lines.append(text)


def pct(values: list[float], p: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return round(values[min(len(values) - 1, max(0, round(p / 100 * len(values) + 0.5) - 1))], 3)


journal = Path(os.environ["VSUP_HOME"]) / "journal.jsonl"
seen = len(journal.read_text().splitlines()) if journal.exists() else 0
results: list[dict] = []
stop = threading.Event()
start = time.monotonic()


def client(n: int) -> None:
    rnd = random.Random(n)
    with httpx.Client(timeout=300) as c:
        while not stop.is_set():
            prompt = " ".join(f"w{rnd.randrange(3, 120000)}" for _ in range(64))
            body = {"model": "llama", "prompt": prompt, "max_tokens": 64, "ignore_eos": True}
            sent = time.monotonic()
            try:
                r = c.post(ROUTER + "/v1/completions", json=body)
                code: object = r.status_code
                why = "" if r.status_code == 200 else r.text[:300]
            except httpx.HTTPError as exc:
                code, why = type(exc).__name__, str(exc)[:300]
            results.append({"sent": sent - start, "s": time.monotonic() - sent, "code": code,
                            "why": why})


load = phase != "up"
threads = [threading.Thread(target=client, args=(n,), daemon=True) for n in range(CLIENTS)]
if load:
    for t in threads:
        t.start()
    time.sleep(10)  # a steady load before the change
t0 = time.monotonic()
up = subprocess.run(["python3", "-m", "vsup", "up", str(rec / f"{phase}.toml"), "--yes", "--wait",
                     "--timeout", "1500", "--detach"],
                    capture_output=True, text=True, timeout=1600)
took = time.monotonic() - t0
say(f"vsup up {phase}.toml: rc {up.returncode} in {took:.0f} s")
(rec / f"{phase}-up.txt").write_text(up.stdout + up.stderr)
if load:
    time.sleep(10)  # the load goes on after the rollout ended
    stop.set()
    for t in threads:
        t.join(300)
status = json.loads(subprocess.run(["python3", "-m", "vsup", "status", "--json"],
                                   capture_output=True, text=True, timeout=60).stdout)
(rec / f"{phase}-status.json").write_text(json.dumps(status, indent=1))
events = [json.loads(l) for l in journal.read_text().splitlines()[seen:] if l.strip()]
mine = [e for e in events if e.get("kind") in ("canary", "rollout", "rollout_wave", "instance_exit",
                                               "restart", "apply")]
(rec / f"{phase}-journal.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
ev = subprocess.run(["python3", "-m", "vsup", "events", "--since", "15m"], capture_output=True,
                    text=True, timeout=60)
(rec / f"{phase}-events.txt").write_text(ev.stdout + ev.stderr)
summary = {"phase": phase, "up_rc": up.returncode, "up_s": round(took, 1),
           "rollout": status.get("rollout"),
           "canary_events": [e for e in events if e.get("kind") == "canary"]}
if load:
    failed = [r for r in results if r["code"] != 200]
    ok = [r["s"] for r in results if r["code"] == 200]
    summary.update(requests=len(results), failed=len(failed), failed_examples=failed[:5],
                   latency_p50_s=pct(ok, 50), latency_p99_s=pct(ok, 99))
    say(f"requests {len(results)}, failed {len(failed)}; latency p50 {summary['latency_p50_s']} s,"
        f" p99 {summary['latency_p99_s']} s")
for e in summary["canary_events"]:
    say(f"canary event: {e.get('decision')} / {e.get('action')} after {e.get('watched_s')} s: {e.get('reason')}")
ro = status.get("rollout") or {}
say(f"rollout: state {ro.get('state')}, canary_state {ro.get('canary_state')}, "
    f"verdict {ro.get('verdict')!r}, failure {ro.get('failure')!r}")
say("instances: " + ", ".join(f"{i['name']} {i['state']}" + (" (old spec)" if i.get("outdated") else "")
                               for i in status["instances"]))
(rec / f"{phase}-summary.json").write_text(json.dumps(summary, indent=1))
with open(rec / "lines.txt", "a") as f:
    f.write("".join(f"[{phase}] {l}\n" for l in lines))
PYEOF
done
true
