# The second H200 sample, layouts in the other order (2 x 0.45 first), on a fresh machine; the
# last layout (1 x 0.90) is kept for stall.sh. A screenshot while the pair serves (the bench's
# progress line in the header).
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
        python3 -m vsup tui --screenshot "$OUT/bench2-2x045.svg" --size 160x45
        python3 -m vsup status --json >"$OUT/bench2_status_2x045.json"
        break
    done
) &
t0=$(date +%s)
python3 -m vsup bench /tmp/h200-2x045.toml /tmp/h200-1x090.toml \
    --num-prompts 1000 --input-len 512 --output-len 256 --seed 0 --yes --keep \
    --json "$OUT/bench2.json" --markdown "$OUT/bench2.md" --out-dir /tmp/bench-out 2>&1 | tee "$OUT/bench2.txt"
echo "bench rc=${PIPESTATUS[0]} after $(($(date +%s) - t0)) s"
wait
