# Time-sharing one GPU with vLLM's sleep mode (issue 27, docs/sleep.md), on the H200: two
# configurations of the 8B shape (max-num-seqs 96 and 192, one served name) at 0.90 each in one
# swap group on GPU 0, behind vllm-router. Measured: `vsup up` (b starts, sleeps, then a starts),
# HBM per process from nvidia-smi and from vsup before and after each sleep, five swaps back and
# forth (`vsup swap`, which ends when the woken server has answered a completion) under a light
# load through the router, what became of the requests in flight when each swap began (they
# must all finish: vsup drains before the sleep) and of those sent during the gap (vllm-router
# answers 503 while no member is awake), and the cold start a swap replaces (`vsup stop b`, then
# `vsup wake b`: a sleeps, b starts from nothing).
#
# On the H200 (../shared/gpu-vllm/README.md: call 1 makes /tmp/m8b and stages vllm-router), after
# building the wheel here:
#   .venv/bin/python -m build --wheel --no-isolation -o .gpuwork .
#   call 2, carry [".vllmkit-b", ".gpuwork"]: bash benchmarks/gpu_bench/sleep_swap.sh
# The record is $OUT/sleep_swap/: copy it to docs/gpu-runs/DATE-h200-sleep-swap/.
set -u
source .vllmkit-b/stage.sh || exit 3
source benchmarks/gpu_bench/common.sh # installs the wheel, VSUP_HOME, cd /tmp
REC="$OUT/sleep_swap"
mkdir -p "$REC"
cat >"$REC/layout.toml" <<EOF
[layout]
name = "sleep-swap"

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
command = ["python3", "-m", "vllm_router.launch_router"]  # the kit's wheel: no console script

[[instance]]
name = "a"
port = 8301
gpus = [0]
swap_group = "g0"
args = { served-model-name = "llama8b", max-model-len = 4096, max-num-seqs = 96 }

[[instance]]
name = "b"
port = 8302
gpus = [0]
swap_group = "g0"
args = { served-model-name = "llama8b", max-model-len = 4096, max-num-seqs = 192 }
EOF

python3 - "$REC" <<'PYEOF'
import json, os, statistics, subprocess, sys, threading, time
from pathlib import Path

import httpx

rec = Path(sys.argv[1])
lines: list[str] = []
summary: dict[str, object] = {}
ROUTER = "http://127.0.0.1:8300"


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
            # the memory is the EngineCore's, a child in the API server's process group
            "smi_gib": round(sum(v for p, v in by_pid.items() if group(p) == i["pid"]) / 2**30, 2),
        }
    total = round(sum(by_pid.values()) / 2**30, 2)
    say(f"HBM {tag}: {row}; nvidia-smi total {total} GiB")
    return {"instances": row, "smi_total_gib": total}


t0 = time.monotonic()
up = vsup("up", str(rec / "layout.toml"), "--detach", "--wait", "--yes", "--timeout", "1500",
          timeout=1600)
say(f"vsup up: rc {up.returncode} in {time.monotonic() - t0:.0f} s")
if up.returncode != 0:
    say(up.stdout + up.stderr)
    raise SystemExit(4)
summary["up_s"] = round(time.monotonic() - t0, 1)
summary["hbm_after_up"] = memory("after up")

# a light load through the router: (sent, done, status) per request
results: list[tuple[float, float, object]] = []
stop = threading.Event()


def client() -> None:
    body = {"model": "llama8b", "prompt": "the quick brown fox", "max_tokens": 64,
            "ignore_eos": True}
    with httpx.Client(timeout=300) as c:
        while not stop.is_set():
            sent = time.monotonic()
            try:
                code: object = c.post(ROUTER + "/v1/completions", json=body).status_code
            except httpx.HTTPError as exc:
                code = type(exc).__name__
            results.append((sent, time.monotonic(), code))
            time.sleep(0.25)


threads = [threading.Thread(target=client, daemon=True) for _ in range(2)]
for t in threads:
    t.start()
time.sleep(5)
swaps = []
pair = ("a", "b")
for n in range(5):
    src, dst = pair if n % 2 == 0 else pair[::-1]
    began = time.monotonic()
    out = vsup("swap", src, dst)
    ended = time.monotonic()
    took = ended - began
    swaps.append({"from": src, "to": dst, "rc": out.returncode, "s": round(took, 2),
                  "said": out.stdout.strip().splitlines()})
    say(f"swap {src} -> {dst}: rc {out.returncode} in {took:.2f} s: {out.stdout.strip()} {out.stderr.strip()}")
    if n == 0:
        summary["hbm_after_first_swap"] = memory("after the first swap")
    swaps[-1]["began"], swaps[-1]["ended"] = began, ended
    time.sleep(4)
stop.set()
for t in threads:
    t.join(300)
in_flight, gap = [], []
for s in swaps:
    in_flight += [r for r in results if r[0] < s["began"] < r[1]]
    gap += [r for r in results if s["began"] <= r[0] <= s["ended"]]
lost = [r for r in in_flight if r[2] != 200]
gap_failed = [r for r in gap if r[2] != 200]
ok_times = [s["s"] for s in swaps if s["rc"] == 0]
summary["swaps"] = [{k: v for k, v in s.items() if k not in ("began", "ended")} for s in swaps]
summary["swap_median_s"] = round(statistics.median(ok_times), 2) if ok_times else None
summary["requests_total"] = len(results)
summary["requests_failed"] = sum(1 for r in results if r[2] != 200)
summary["in_flight_at_swap"] = len(in_flight)
summary["in_flight_lost"] = len(lost)
summary["sent_in_gap"] = len(gap)
summary["gap_answers"] = sorted({str(r[2]) for r in gap})
say(f"swaps: median {summary['swap_median_s']} s of {ok_times}; requests {len(results)}, "
    f"in flight when a swap began {len(in_flight)} (lost {len(lost)}), sent during a swap "
    f"{len(gap)} (answers {summary['gap_answers']})")
(rec / "status_after_swaps.json").write_text(json.dumps(status(), indent=1))

# the cold start a swap replaces: b stopped, then woken (a sleeps, b starts from nothing)
awake = next(i["name"] for i in status()["instances"] if (i["sleep"] or {}).get("state") == "awake")
other = "b" if awake == "a" else "a"
vsup("stop", other, timeout=300)
t0 = time.monotonic()
out = vsup("wake", other)
cold = time.monotonic() - t0
say(f"cold: `vsup wake {other}` of a stopped member: rc {out.returncode} in {cold:.1f} s: {out.stdout.strip()}")
summary["cold_start_s"] = round(cold, 1)
summary["hbm_end"] = memory("at the end")
subprocess.run(["python3", "-m", "vsup", "tui", "--screenshot", str(rec / "dashboard.svg"),
                "--size", "160x45"], timeout=120)
journal = Path("/tmp/vsup-home/journal.jsonl").read_text().splitlines()
kinds = ("sleep", "wake", "swap", "sleep_failed", "wake_failed", "group_wait")
(rec / "journal_sleep.jsonl").write_text(
    "\n".join(l for l in journal if any(f'"kind":"{k}"' in l for k in kinds)) + "\n")
(rec / "summary.json").write_text(json.dumps(summary, indent=1))
(rec / "lines.txt").write_text("\n".join(lines) + "\n")
PYEOF
python3 -m vsup down --yes >/dev/null 2>&1
cp "$REC/layout.toml" "$REC/layout-used.toml" 2>/dev/null
true
