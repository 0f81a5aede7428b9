# A freeze that begins while the instance is idle (issue 26), on the GPU: one 0.90 instance of the
# 8B shape with stall_after_s = 15 and vLLM's load tracking (vsup adds the flag), warmed by one
# request, then SIGSTOP of its EngineCore while idle; a few seconds later 20 requests. Measured:
# the time from the first request to `stalled` (expected within stall_after_s + one poll), what
# /health said meanwhile, the time from SIGCONT to the flag clearing, and how many requests
# failed. Then the same freeze without load tracking (args enable-server-load-tracking = false,
# a restart) and canary_interval_s = 5: the time to `stalled` with no request at all.
#
# On the H200 (../shared/gpu-vllm/README.md: call 1 makes /tmp/m8b), after building the wheel:
#   .venv/bin/python -m build --wheel --no-isolation -o .gpuwork .
#   call 2, carry [".vllmkit-b", ".gpuwork"]: bash benchmarks/gpu_bench/stall_idle.sh
# The record is $OUT/stall_idle/ (README.md with the summary, status JSON, journal lines, the
# dashboard while stalled): copy it to docs/gpu-runs/DATE-h200-stall-idle/.
#
# On this project's CPU machines (the same logic, the CPU vLLM and the tiny model; run it under
# the heavy lock):  STALL_IDLE_CPU=1 bash benchmarks/gpu_bench/stall_idle.sh
set -u
if [ "${STALL_IDLE_CPU:-0}" = 1 ]; then
    PY=${PY:-$PWD/.venv/bin/python}
    OUT=${OUT:-$(mktemp -d -t stall-idle-XXXXXX)}
    export VSUP_HOME=$(mktemp -d /tmp/vsup-stall-idle-XXXXXX) PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
    MODEL=$("$PY" -c 'import sys, tempfile; from pathlib import Path; from vsup.demo.tinymodel import generate; print(generate(Path(tempfile.mkdtemp()) / "tiny-llama"))')
    AFTER=5 CANARY=2 N=6 MAX_TOKENS=20
    PLACE='gpus = []'
    EXTRA='env = { VLLM_CPU_KVCACHE_SPACE = "1", TOKENIZERS_PARALLELISM = "false" }
args = { dtype = "float32", enforce-eager = true, max-model-len = 2048'
    cd /tmp || exit 1
else
    source .vllmkit-b/stage.sh || exit 3
    source benchmarks/gpu_bench/common.sh  # installs the wheel, VSUP_HOME, cd /tmp
    PY=python3 MODEL=/tmp/m8b AFTER=15 CANARY=5 N=20 MAX_TOKENS=256
    PLACE='gpus = [0]
gpu_memory_utilization = 0.90'
    EXTRA='env = { HF_HUB_OFFLINE = "1", TOKENIZERS_PARALLELISM = "false" }
args = { served-model-name = "llama8b", max-model-len = 4096'
fi
export PY
REC="$OUT/stall_idle"
mkdir -p "$REC"
layout() {  # $1: extra args (after the table's first keys), $2: extra instance keys
    cat <<EOF
[layout]
name = "stall-idle"

[[instance]]
name = "g0"
model = "$MODEL"
command = ["$PY", "-m", "vllm.entrypoints.openai.api_server"]
host = "127.0.0.1"
port = 8100
$PLACE
$EXTRA$1 }
start_timeout_s = 900
stall_after_s = $AFTER
restart = { policy = "on-failure", backoff_s = 5, max_failures = 2 }
$2
EOF
}
layout "" "" >"$REC/layout-tracking.toml"
layout ", enable-server-load-tracking = false" "canary_interval_s = $CANARY" >"$REC/layout-canary.toml"

t0=$(date +%s)
"$PY" -m vsup up "$REC/layout-tracking.toml" --detach --wait --yes --timeout 900 || exit 4
echo "up after $(($(date +%s) - t0)) s"

# The measuring is Python: timestamps, threads for the requests, status every 0.25 s.
"$PY" - "$REC" "$AFTER" "$N" "$MAX_TOKENS" <<'PYEOF'
import json, os, signal, subprocess, sys, threading, time
from pathlib import Path

import httpx

rec, after, n, max_tokens = Path(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
py = os.environ.get("PY", sys.executable)
base = "http://127.0.0.1:8100"
lines: list[str] = []
summary: dict[str, object] = {"stall_after_s": after, "requests": n}


def say(text: str) -> None:
    print(text, flush=True)
    lines.append(text)


def vsup(*args: str) -> str:
    return subprocess.run([py, "-m", "vsup", *args], capture_output=True, text=True, timeout=120).stdout


def inst() -> dict:
    return json.loads(vsup("status", "--json"))["instances"][0]


def health() -> object:
    try:
        return httpx.get(base + "/health", timeout=2).status_code
    except httpx.HTTPError as exc:
        return type(exc).__name__


def engine_core(api_pid: int) -> int:
    out = subprocess.run(["pgrep", "-g", str(os.getpgid(api_pid)), "-f", "^VLLM::EngineCore"],
                         capture_output=True, text=True).stdout.split()
    if not out:
        raise SystemExit(f"no VLLM::EngineCore in the group of {api_pid}")
    return int(out[0])


def until(pred, timeout: float, every: float = 0.25):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = pred()
        if got:
            return got
        time.sleep(every)
    return None


model = httpx.get(base + "/v1/models", timeout=30).json()["data"][0]["id"]
answers: list[object] = []


def one() -> None:
    body = {"model": model, "prompt": "the quick brown fox", "max_tokens": max_tokens, "ignore_eos": True}
    try:
        answers.append(httpx.post(base + "/v1/completions", json=body, timeout=600).status_code)
    except httpx.HTTPError as exc:
        answers.append(type(exc).__name__)


def phase(name: str, with_requests: bool) -> None:
    answers.clear()
    one()  # warm, and proof that it serves
    if not until(lambda: (lambda i: i["stalled"] is False and not i["requests_running"])(inst()), 60):
        say(f"{name}: never idle and judged; giving up")
        return
    i = inst()
    say(f"{name}: ready, load_tracking={i['load_tracking']}, requests_in_flight={i['requests_in_flight']}")
    core = engine_core(i["pid"])
    os.kill(core, signal.SIGSTOP)
    t_stop = time.monotonic()
    say(f"{name}: SIGSTOP EngineCore pid {core} while idle")
    try:
        health_seen = []
        threads: list[threading.Thread] = []
        t_req = None
        if with_requests:
            quiet = until(lambda: inst()["stalled"], 3)  # nothing waits yet: not stalled
            say(f"{name}: 3 s frozen, no request: stalled={bool(quiet)}")
            threads = [threading.Thread(target=one, daemon=True) for _ in range(n)]
            t_req = time.monotonic()
            for t in threads:
                t.start()

        def flagged():
            health_seen.append(health())
            got = inst()
            return got if got["stalled"] else None

        hit = until(flagged, after + 120)
        start = t_req if t_req is not None else t_stop
        took = time.monotonic() - start
        if hit is None:
            say(f"{name}: NOT stalled within {after + 120:.0f} s")
            summary[f"{name}_stalled_s"] = None
        else:
            what = "first request" if t_req is not None else "SIGSTOP"
            say(f"{name}: {what} -> stalled {took:.1f} s (evidence {hit['stall_evidence']}, "
                f"requests_in_flight {hit['requests_in_flight']}, running {hit['requests_running']}); "
                f"/health meanwhile {sorted(set(map(str, health_seen)))}")
            summary[f"{name}_stalled_s"] = round(took, 1)
            summary[f"{name}_evidence"] = hit["stall_evidence"]
            (rec / f"{name}_status.json").write_text(vsup("status", "--json"))
            subprocess.run([py, "-m", "vsup", "tui", "--screenshot", str(rec / f"{name}.svg"),
                            "--size", "160x45"], timeout=120)
    finally:
        os.kill(core, signal.SIGCONT)
    t_cont = time.monotonic()
    cleared = until(lambda: inst()["stalled"] is False, 120)
    took = time.monotonic() - t_cont
    say(f"{name}: SIGCONT -> cleared {took:.1f} s" if cleared else f"{name}: did not clear in 120 s")
    summary[f"{name}_cleared_s"] = round(took, 1) if cleared else None
    for t in threads:
        t.join(600)
    ok = sum(1 for a in answers if a == 200)
    failed = len(answers) - ok
    say(f"{name}: requests answered {ok}, failed {failed} ({sorted(set(map(str, answers)))})")
    summary[f"{name}_requests_failed"] = failed


phase("tracking", with_requests=True)
(rec / "summary.json").write_text(json.dumps(summary, indent=1))
(rec / "lines.txt").write_text("\n".join(lines) + "\n")
PYEOF

echo "--- without load tracking, canary_interval_s = $CANARY (a restart)"
"$PY" -m vsup up "$REC/layout-canary.toml" --detach --wait --yes --timeout 900 || exit 5
"$PY" - "$REC" "$AFTER" <<'PYEOF'
import json, os, signal, subprocess, sys, time
from pathlib import Path

rec, after = Path(sys.argv[1]), float(sys.argv[2])
py = os.environ.get("PY", sys.executable)


def inst() -> dict:
    out = subprocess.run([py, "-m", "vsup", "status", "--json"], capture_output=True, text=True).stdout
    return json.loads(out)["instances"][0]


end = time.monotonic() + 120
while time.monotonic() < end and inst()["stalled"] is not False:
    time.sleep(0.5)
i = inst()
core = int(subprocess.run(["pgrep", "-g", str(os.getpgid(i["pid"])), "-f", "^VLLM::EngineCore"],
                          capture_output=True, text=True).stdout.split()[0])
os.kill(core, signal.SIGSTOP)
t0 = time.monotonic()
try:
    hit = None
    while time.monotonic() - t0 < after + 120:
        got = inst()
        if got["stalled"]:
            hit = got
            break
        time.sleep(0.25)
    took = time.monotonic() - t0
finally:
    os.kill(core, signal.SIGCONT)
t1 = time.monotonic()
while time.monotonic() - t1 < 120 and inst()["stalled"]:
    time.sleep(0.25)
cleared = time.monotonic() - t1
line = (f"canary: load_tracking={i['load_tracking']}; SIGSTOP while idle, no request -> "
        + (f"stalled {took:.1f} s (evidence {hit['stall_evidence']})" if hit else "NOT stalled")
        + f"; SIGCONT -> cleared {cleared:.1f} s")
print(line, flush=True)
summary = json.loads((rec / "summary.json").read_text())
summary.update(canary_stalled_s=round(took, 1) if hit else None, canary_cleared_s=round(cleared, 1))
(rec / "summary.json").write_text(json.dumps(summary, indent=1))
with open(rec / "lines.txt", "a") as f:
    f.write(line + "\n")
PYEOF

grep -hE '"kind": ?"(stalled|stall_cleared|stall_restart)"' "$VSUP_HOME/journal.jsonl" >"$REC/journal_stall.jsonl"
"$PY" -m vsup down --yes
{
    echo "# A freeze while idle, then requests ($(date -u +%Y-%m-%d), $(hostname))"
    echo
    echo '```'
    cat "$REC/lines.txt"
    echo '```'
    echo
    echo "summary.json: $(tr -d '\n ' <"$REC/summary.json")"
    echo
    echo "Files: layout-*.toml (the two layouts), tracking_status.json and tracking.svg (while"
    echo "stalled), journal_stall.jsonl (the stall events). Script: benchmarks/gpu_bench/stall_idle.sh."
} >"$REC/README.md"
echo "=== summary"
cat "$REC/lines.txt"
echo "record: $REC"
if [ "${STALL_IDLE_CPU:-0}" = 1 ]; then rm -rf "$VSUP_HOME"; fi
