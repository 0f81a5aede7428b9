# Time-sharing that serves every request (issue 38, docs/sleep.md "Wake on request"), on the
# H200: two models of the 8B shape (the same random weights served as `llama-a` and `llama-b`,
# max-num-seqs 96 and 192) at 0.90 of GPU 0 in one swap group, behind the layout's one router
# endpoint (vllm-router in its gateway mode). Two clients send requests for one model, then the
# other, switching every PHASE_S seconds for RUN_S seconds: every switch makes vsup hold the
# requests for the sleeping model, swap, and forward them. Measured: failed requests (goal 0),
# the wait of the requests that found their model asleep (p50/p99), each swap's phases from the
# journal (vsup's own figure), HBM per instance against nvidia-smi, and vLLM's own sleep +
# wake + first answer on the same two servers (benchmarks/sleep_swap.py), the floor a swap is
# compared with.
#
# On the H200 (../shared/gpu-vllm/README.md: call 1 makes /tmp/m8b and stages vllm-router), after
# building the wheel here:
#   .venv/bin/python -m build --wheel --no-isolation -o .gpuwork .
#   call 2, carry [".vllmkit-b", ".gpuwork"]: bash benchmarks/gpu_bench/timeshare_serve.sh
# The record is $OUT/timeshare/: copy it to docs/gpu-runs/DATE-h200-timeshare/.
set -u
root=$(pwd)
[ -n "${KIT_STAGED:-}" ] || source .vllmkit-b/stage.sh || exit 3 # KIT_STAGED: laid out by hand
source benchmarks/gpu_bench/common.sh # installs the wheel, VSUP_HOME, cd /tmp
REC="$OUT/timeshare"
mkdir -p "$REC"
cat >"$REC/layout.toml" <<EOF
[layout]
name = "timeshare"

[defaults]
model = "/tmp/m8b"
command = ["python3", "-m", "vllm.entrypoints.openai.api_server"]
host = "127.0.0.1"
gpu_memory_utilization = 0.90
sleep = { level = 1 }
env = { HF_HUB_OFFLINE = "1", TOKENIZERS_PARALLELISM = "false" }
start_timeout_s = 900

[router]
port = 8300
metrics_port = 8309
host = "127.0.0.1"
policy = "round_robin"
hold_s = 60
command = ["python3", "-m", "vllm_router.launch_router"]  # the kit's wheel: no console script

[[instance]]
name = "a"
port = 8301
gpus = [0]
swap_group = "g0"
args = { served-model-name = "llama-a", max-model-len = 4096, max-num-seqs = 96 }

[[instance]]
name = "b"
port = 8302
gpus = [0]
swap_group = "g0"
args = { served-model-name = "llama-b", max-model-len = 4096, max-num-seqs = 192 }
EOF

python3 - "$REC" "${RUN_S:-120}" "${PHASE_S:-10}" "$root" <<'PYEOF'
import json, os, statistics, subprocess, sys, threading, time
from pathlib import Path

import httpx

rec, RUN_S, PHASE_S = Path(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
ROOT = Path(sys.argv[4])
lines: list[str] = []
summary: dict[str, object] = {}
ROUTER = "http://127.0.0.1:8300"
MODELS = {"a": "llama-a", "b": "llama-b"}


def say(text: str) -> None:
    print(text, flush=True)
    lines.append(text)


def vsup(*args: str, timeout: float = 1200) -> subprocess.CompletedProcess:
    return subprocess.run(["python3", "-m", "vsup", *args], capture_output=True, text=True,
                          timeout=timeout)


def status() -> dict:
    return json.loads(vsup("status", "--json", timeout=60).stdout)


def smi() -> dict[int, int]:
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                          "--format=csv,noheader,nounits"], capture_output=True, text=True).stdout
    return {int(p): int(m) * 2**20 for p, m in (l.split(",") for l in out.splitlines() if l.strip())}


def group(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def memory(tag: str) -> dict:
    doc, by_pid = status(), smi()
    row = {}
    for i in doc["instances"]:
        sleep = i.get("sleep") or {}
        row[i["name"]] = {
            "sleep": sleep.get("state"), "vsup_hbm_gib": round((i["hbm_bytes"] or 0) / 2**30, 2),
            "smi_gib": round(sum(v for p, v in by_pid.items() if group(p) == i["pid"]) / 2**30, 2),
        }
    total = round(sum(by_pid.values()) / 2**30, 2)
    say(f"HBM {tag}: {row}; nvidia-smi total {total} GiB")
    return {"instances": row, "smi_total_gib": total}


def pct(values: list[float], p: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return round(values[min(len(values) - 1, max(0, round(p / 100 * len(values) + 0.5) - 1))], 3)


t0 = time.monotonic()
up = vsup("up", str(rec / "layout.toml"), "--detach", "--wait", "--yes", "--timeout", "1500",
          timeout=1600)
say(f"vsup up: rc {up.returncode} in {time.monotonic() - t0:.0f} s")
if up.returncode != 0:
    say(up.stdout + up.stderr)
    raise SystemExit(4)
summary["up_s"] = round(time.monotonic() - t0, 1)
summary["hbm_after_up"] = memory("after up")

# vsup's swap against vLLM's own sleep + wake + first answer on the same two servers (two
# warm-up swaps apart: a server's first level-1 sleep pins its host buffer, 9-14 s).
bench = subprocess.run(["true"], capture_output=True, text=True) if os.environ.get("SKIP_SWAP_BENCH") else subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sleep_swap.py"), "--home",
                        os.environ["VSUP_HOME"], "--pair", "a", "b", "--runs", "6",
                        "--warmup", "2"], capture_output=True, text=True, timeout=600)
(rec / "sleep_swap.txt").write_text(bench.stdout + bench.stderr)
say(f"sleep_swap: rc {bench.returncode}: {bench.stdout.strip().splitlines()[-1:]}")
summary["sleep_swap_last_line"] = (bench.stdout.strip().splitlines() or [""])[-1]
summary["hbm_after_swaps"] = memory("after the swaps")
# sleep_swap.py ends with swaps by hand behind vsup's back: tell vsup which one vLLM says is awake
with httpx.Client(timeout=60) as c:
    awake = next(n for n, p in (("a", 8301), ("b", 8302))
                 if not c.get(f"http://127.0.0.1:{p}/is_sleeping").json()["is_sleeping"])
other = "b" if awake == "a" else "a"
say(f"awake after the swaps (vLLM says): {awake}; `vsup wake {awake}`: {vsup('wake', awake).stdout.strip()}")

# Two clients; the model they ask for switches every PHASE_S seconds, starting with the sleeper.
results: list[dict] = []
stop = threading.Event()
start = time.monotonic()
first_model = other


def model_now() -> str:
    k = int((time.monotonic() - start) // PHASE_S)
    return first_model if k % 2 == 0 else awake


def client() -> None:
    with httpx.Client(timeout=300) as c:
        while not stop.is_set():
            name = model_now()
            body = {"model": MODELS[name], "prompt": "the quick brown fox", "max_tokens": 32,
                    "ignore_eos": True}
            sent = time.monotonic()
            try:
                r = c.post(ROUTER + "/v1/completions", json=body)
                code: object = r.status_code
                why = "" if r.status_code == 200 else r.text[:300]
            except httpx.HTTPError as exc:
                code, why = type(exc).__name__, str(exc)[:300]
            results.append({"sent": sent - start, "s": time.monotonic() - sent, "code": code,
                            "model": name, "why": why})
            time.sleep(0.25)


threads = [threading.Thread(target=client, daemon=True) for _ in range(2)]
for t in threads:
    t.start()
time.sleep(RUN_S / 2)
summary["hbm_mid_run"] = memory("mid-run")
time.sleep(RUN_S / 2)
stop.set()
for t in threads:
    t.join(300)

# A request was held when it was sent before the first answer of its phase came back.
held, direct = [], []
phases = int(RUN_S // PHASE_S) + 1
for k in range(phases):
    lo, hi = k * PHASE_S, (k + 1) * PHASE_S
    mine = [r for r in results if lo <= r["sent"] < hi]
    answered = [r["sent"] + r["s"] for r in mine if r["code"] == 200]
    first = min(answered) if answered else hi
    held += [r for r in mine if r["sent"] < first]
    direct += [r for r in mine if r["sent"] >= first]
failed = [r for r in results if r["code"] != 200]
summary["requests_total"] = len(results)
summary["requests_failed"] = len(failed)
summary["failed_examples"] = failed[:5]
summary["held_requests"] = len(held)
summary["held_wait_p50_s"] = pct([r["s"] for r in held], 50)
summary["held_wait_p99_s"] = pct([r["s"] for r in held], 99)
summary["direct_p50_s"] = pct([r["s"] for r in direct], 50)
summary["direct_p99_s"] = pct([r["s"] for r in direct], 99)
say(f"requests {len(results)}, failed {len(failed)}; held {len(held)}: wait p50 "
    f"{summary['held_wait_p50_s']} s, p99 {summary['held_wait_p99_s']} s; the others p50 "
    f"{summary['direct_p50_s']} s, p99 {summary['direct_p99_s']} s")
doc = status()
(rec / "status_after_run.json").write_text(json.dumps(doc, indent=1))
summary["holders"] = (doc.get("router") or {}).get("holders")

journal = [json.loads(l) for l in Path("/tmp/vsup-home/journal.jsonl").read_text().splitlines()
           if l.strip()]
kinds = ("sleep", "wake", "swap", "sleep_failed", "wake_failed", "group_wait", "hold_wake",
         "hold_end")
mine = [e for e in journal if e.get("kind") in kinds]
(rec / "journal_sleep.jsonl").write_text("\n".join(json.dumps(e) for e in mine) + "\n")
wakes = [e for e in mine if e.get("kind") == "hold_end" and e.get("took_s") is not None]
took = [float(e["took_s"]) for e in wakes]
summary["hold_wakes"] = len(wakes)
summary["hold_wake_took_median_s"] = round(statistics.median(took), 2) if took else None
summary["hold_wake_took_s"] = took
say(f"swaps on request: {len(wakes)}, median {summary['hold_wake_took_median_s']} s: {took}")
summary["hbm_end_of_run"] = memory("end of run")
subprocess.run(["python3", "-m", "vsup", "tui", "--screenshot", str(rec / "dashboard.svg"),
                "--size", "160x45"], timeout=120)

(rec / "summary.json").write_text(json.dumps(summary, indent=1))
(rec / "lines.txt").write_text("\n".join(lines) + "\n")
PYEOF
python3 -m vsup down --yes >/dev/null 2>&1
true
