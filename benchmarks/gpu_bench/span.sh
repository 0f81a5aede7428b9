# One vLLM server across two "nodes" on a GPU (issue 40, docs/fleet.md "One server across
# nodes"): two daemons on one machine (two VSUP_HOMEs, each given its node's copy of the layout
# with `[layout] node`, as `vsup fleet up` writes it), data parallel 2 with one rank per "node",
# both ranks on GPU 0 at 0.40 of its memory each. What it records:
#   up      both daemons apply their part at once; `vsup up --wait` of each
#   check   each rank answers a request (vLLM's X-data-parallel-rank header); what each node's
#           status says
#   follower the follower's vLLM SIGKILLed: the head's /health still 200 while rank 1 is gone;
#           seconds until the head's probe restarts the unit and both ranks answer again
#   head    the head's vLLM SIGKILLed: seconds until both ranks answer again
#   down    `vsup down` on both: nothing left on the GPU (nvidia-smi)
# The SSH transport of `vsup fleet up` is what the CPU test proves (tests/integration/fleet/
# test_span_vllm.py); the device has no sshd, so each node's daemon gets its copy directly.
#
# On the device (../shared/gpu-vllm/README.md; KIT_STAGED=1 when the kit was laid out by hand):
#   .venv/bin/python -m build --wheel --no-isolation -o .gpuwork .
#   bash benchmarks/gpu_bench/span.sh up check follower head down
# Both ranks share GPU 0, so each gets a fixed KV cache (`kv-cache-memory-bytes`): two vLLMs
# profiling one GPU's memory at once each count the other's allocations as their own, and the
# first try (0.40 each, no fixed KV cache) saw the follower find "No available memory for the
# cache blocks". On real nodes each rank has its own GPUs and `gpu_memory_utilization` does.
# The record is $OUT/span/: copy it to docs/gpu-runs/DATE-CARD-span/.
set -u
[ -n "${KIT_STAGED:-}" ] || source .vllmkit-b/stage.sh || exit 3
if [ -z "${VSUP_INSTALLED:-}" ]; then
  source benchmarks/gpu_bench/common.sh # installs the wheel, cd /tmp
fi
cd /tmp || exit 1
export PYTHONUNBUFFERED=1
REC="$OUT/span"
mkdir -p "$REC"
PORT=8400
RPC=8455

layout() { # layout NODE
  cat <<EOF
[layout]
name = "span"
node = "$1"

[[instance]]
name = "big"
model = "/tmp/m1b"
command = ["python3", "-m", "vllm.entrypoints.openai.api_server"]
host = "127.0.0.1"
gpus = [0]
port = $PORT
gpu_memory_utilization = 0.40
args = { served-model-name = "llama", max-model-len = 2048, kv-cache-memory-bytes = 8589934592 }
env = { HF_HUB_OFFLINE = "1", TOKENIZERS_PARALLELISM = "false" }
start_timeout_s = 900
stop_grace_s = 10
stall_after_s = 15
canary_interval_s = 3
restart = { policy = "on-failure", backoff_s = 2, backoff_max_s = 10, max_failures = 10 }
span = { ranks = { gpu01 = 1, gpu02 = 1 }, address = "127.0.0.1", rpc_port = $RPC }
EOF
}
mkdir -p /tmp/vh1 /tmp/vh2 && chmod 700 /tmp/vh1 /tmp/vh2
layout gpu01 >"$REC/gpu01.toml"
layout gpu02 >"$REC/gpu02.toml"

for phase in "$@"; do
  case $phase in
  up)
    (VSUP_HOME=/tmp/vh1 python3 -m vsup up "$REC/gpu01.toml" --detach --wait --yes --timeout 800 >"$REC/up-gpu01.txt" 2>&1; echo "exit $?" >>"$REC/up-gpu01.txt") &
    (VSUP_HOME=/tmp/vh2 python3 -m vsup up "$REC/gpu02.toml" --detach --wait --yes --timeout 800 >"$REC/up-gpu02.txt" 2>&1; echo "exit $?" >>"$REC/up-gpu02.txt") &
    t0=$(date +%s)
    wait
    echo "both up --wait returned after $(($(date +%s) - t0)) s" | tee -a "$REC/lines.txt"
    tail -2 "$REC/up-gpu01.txt" "$REC/up-gpu02.txt"
    ;;
  down)
    (VSUP_HOME=/tmp/vh1 python3 -m vsup down --yes >"$REC/down-gpu01.txt" 2>&1) &
    (VSUP_HOME=/tmp/vh2 python3 -m vsup down --yes >"$REC/down-gpu02.txt" 2>&1) &
    wait
    sleep 3
    cat "$REC/down-gpu01.txt" "$REC/down-gpu02.txt" >"$REC/down.txt"
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv >>"$REC/down.txt" 2>&1
    pgrep -a -f "VLLM::|vllm.entrypoints|vsup.vllmserve" >>"$REC/down.txt" 2>&1 ||
      echo "no vLLM process left" >>"$REC/down.txt"
    cat "$REC/down.txt"
    ;;
  *)
    python3 - "$REC" "$phase" "$PORT" <<'PYEOF'
import json, os, signal, subprocess, sys, time
from pathlib import Path

import httpx

rec, phase, port = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
base = f"http://127.0.0.1:{port}"
lines = []


def say(text):
    print(f"[{phase}] {text}", flush=True)
    lines.append(f"[{phase}] {text}")


def status(home):
    out = subprocess.run([sys.executable, "-m", "vsup", "status", "--json"], env=dict(os.environ, VSUP_HOME=home),
                         capture_output=True, text=True, timeout=60)
    return json.loads(out.stdout)["instances"][0]


def served_by(rank, timeout=10.0):
    try:
        r = httpx.post(f"{base}/v1/completions", headers={"X-data-parallel-rank": str(rank)},
                       json={"model": "llama", "prompt": "hello", "max_tokens": 8}, timeout=timeout)
        return r.status_code == 200 and bool(r.json()["choices"])
    except httpx.HTTPError:
        return False


def health():
    try:
        return httpx.get(f"{base}/health", timeout=5).status_code
    except httpx.HTTPError as exc:
        return type(exc).__name__


if phase == "check":
    for home, node in (("/tmp/vh1", "gpu01"), ("/tmp/vh2", "gpu02")):
        inst = status(home)
        (rec / f"status-{node}.json").write_text(json.dumps(inst, indent=1))
        shown = subprocess.run([sys.executable, "-m", "vsup", "status"], env=dict(os.environ, VSUP_HOME=home),
                               capture_output=True, text=True, timeout=60).stdout
        (rec / f"status-{node}.txt").write_text(shown)
        say(f"{node}: {inst['state']}, span {json.dumps({k: inst['span'][k] for k in ('node', 'head', 'start_rank', 'ranks', 'size')})}")
    t = time.monotonic(); ok0 = served_by(0); t0 = time.monotonic() - t
    t = time.monotonic(); ok1 = served_by(1); t1 = time.monotonic() - t
    say(f"rank 0 answered: {ok0} ({t0 * 1000:.0f} ms); rank 1 (the other node) answered: {ok1} ({t1 * 1000:.0f} ms)")
else:
    home = "/tmp/vh2" if phase == "follower" else "/tmp/vh1"
    before = {n: status(h) for n, h in (("gpu01", "/tmp/vh1"), ("gpu02", "/tmp/vh2"))}
    victim = before["gpu02" if phase == "follower" else "gpu01"]["pid"]
    assert served_by(0) and served_by(1), "the unit does not serve before the kill"
    os.killpg(os.getpgid(victim), signal.SIGKILL)
    t0 = time.monotonic()
    say(f"SIGKILL of the {phase}'s vLLM (pid {victim}, its process group)")
    if phase == "follower":
        time.sleep(2)
        h = health()
        hung = not served_by(1, timeout=10)
        say(f"2 s after: the head's /health says {h}; a request for rank 1 hangs: {hung}")
    seen = []
    while time.monotonic() - t0 < 600:
        s = {n: status(h) for n, h in (("gpu01", "/tmp/vh1"), ("gpu02", "/tmp/vh2"))}
        key = tuple((n, s[n]["state"], s[n]["pid"]) for n in s)
        if not seen or seen[-1][1] != key:
            seen.append((round(time.monotonic() - t0, 1), key))
            say(f"{seen[-1][0]} s: " + ", ".join(f"{n} {st} pid {p}" for n, st, p in key))
        if all(s[n]["state"] == "ready" for n in s) and s[phase == "follower" and "gpu02" or "gpu01"]["pid"] != victim:
            if served_by(0, 10) and served_by(1, 10):
                say(f"both ranks answer again {time.monotonic() - t0:.1f} s after the kill, without a person")
                break
        time.sleep(1)
    else:
        say("the unit did not serve again within 600 s")
    for n, h in (("gpu01", "/tmp/vh1"), ("gpu02", "/tmp/vh2")):
        j = Path(h) / "journal.jsonl"
        if j.exists():
            (rec / f"{phase}-journal-{n}.jsonl").write_text(j.read_text())
        inst = status(h)
        say(f"{n}: restarts {inst['restarts']}, last exit {json.dumps(inst.get('last_exit'))}")
with open(rec / "lines.txt", "a") as f:
    f.write("\n".join(lines) + "\n")
PYEOF
    ;;
  esac
done
