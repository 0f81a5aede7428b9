# Call 3 of the H200 run: `vsup bench` of one instance at 0.90 vs two at 0.45 on GPU 0, 1000
# prompts of 512 in / 256 out, all at once; a dashboard screenshot while the pair serves.
source .vllmkit-b/stage.sh || exit 3
source benchmarks/gpu_bench/common.sh
(
    for _ in $(seq 1 600); do
        sleep 2
        python3 -m vsup status --json 2>/dev/null | python3 -c '
import json, sys
ii = json.load(sys.stdin)["instances"]
busy = len(ii) == 2 and all(i["state"] == "ready" and (i["requests_running"] or 0) > 0 for i in ii)
sys.exit(0 if busy else 1)' 2>/dev/null || continue
        sleep 5
        python3 -m vsup tui --screenshot "$OUT/bench-2x045.svg" --size 160x45
        python3 -m vsup status --json >"$OUT/bench_status_2x045.json"
        break
    done
) &
t0=$(date +%s)
python3 -m vsup bench /tmp/h200-1x090.toml /tmp/h200-2x045.toml \
    --num-prompts 1000 --input-len 512 --output-len 256 --seed 0 --yes \
    --json "$OUT/bench.json" --markdown "$OUT/bench.md" --out-dir /tmp/bench-out 2>&1 | tee "$OUT/bench.txt"
echo "bench rc=${PIPESTATUS[0]} after $(($(date +%s) - t0)) s"
python3 -m vsup down --yes >/dev/null 2>&1
wait
