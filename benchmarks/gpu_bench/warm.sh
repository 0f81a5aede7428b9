# Call 2 of the H200 run: NVML health against nvidia-smi, then one start of the 0.90 layout so
# that vLLM's compile cache is warm for the bench call (the machine stays warm between calls).
source .vllmkit-b/stage.sh || exit 3
repo=$PWD
source benchmarks/gpu_bench/common.sh
(cd "$repo" && timeout 60 python3 benchmarks/gpu_health_check.py --rounds 100) >"$OUT/health_check.txt" 2>&1
echo "health check rc=$?"
t0=$(date +%s)
python3 -m vsup up /tmp/h200-1x090.toml --detach --wait --yes --timeout 480
echo "up rc=$? after $(($(date +%s) - t0)) s"
python3 -m vsup status --json >"$OUT/warm_status.json"
python3 -m vsup status
grep -h "KV cache size\|Available KV\|init engine\|torch.compile took" "$VSUP_HOME"/logs/*.log | tail -6
python3 -m vsup down --yes
nvidia-smi --query-gpu=memory.used --format=csv
