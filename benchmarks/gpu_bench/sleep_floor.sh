# Where a swap's time goes on the H200 (docs/sleep.md "Where a swap's time goes", issue 38):
# two 8B-shape servers at 0.90 of GPU 0 in one swap group behind vllm-router (the layout of
# sleep_swap.sh), swapped by vsup and then by hand with vLLM's own endpoints:
# benchmarks/sleep_swap.py in its running-daemon mode, the release read from NVML.
#
# On the H200 (../shared/gpu-vllm/README.md), after building the wheel here
# (.venv/bin/python -m build --wheel --no-isolation -o .gpuwork .):
#   call 1, carry [".vllmkit-a"]: source .vllmkit-a/stage.sh && python3 .vllmkit-a/mk_model.py /tmp/m8b 8b
#   call 2, carry [".vllmkit-b", ".gpuwork"]: bash benchmarks/gpu_bench/sleep_floor.sh
# The record is $OUT/sleep_floor/ (the benchmark's output and the daemon's journal).
set -u
root=$(pwd)
source .vllmkit-b/stage.sh || exit 3
source benchmarks/gpu_bench/common.sh # installs the wheel, VSUP_HOME, cd /tmp
REC="$OUT/sleep_floor"
mkdir -p "$REC"
cat >"$REC/layout.toml" <<LAYOUT
[layout]
name = "sleep-floor"

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
command = ["python3", "-m", "vllm_router.launch_router"]

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
LAYOUT
python3 -m vsup up "$REC/layout.toml" --detach --wait --yes --timeout 480 >"$REC/up.txt" 2>&1 || {
    cat "$REC/up.txt"
    exit 4
}
python3 "$root/benchmarks/sleep_swap.py" --home "$VSUP_HOME" --pair a b --runs 6 --warmup 2 \
    2>&1 | tee "$REC/sleep_swap.txt"
python3 -m vsup events >"$REC/events.txt" 2>&1
python3 -m vsup down --yes >/dev/null 2>&1 || true
