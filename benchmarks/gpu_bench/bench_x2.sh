# The two-GPU comparison (not run yet: no two-GPU machine was lent): 2 x TP1 vs 1 x TP2 vs two
# instances at 0.45 on GPU 0, on nvidia-h200-x2 after call 1 of the README (the model).
source .vllmkit-b/stage.sh || exit 3
source benchmarks/gpu_bench/common.sh
cp "$here"/h200x2-*.toml /tmp/
t0=$(date +%s)
python3 -m vsup bench /tmp/h200x2-2xtp1.toml /tmp/h200x2-1xtp2.toml /tmp/h200-2x045.toml \
    --num-prompts 1000 --input-len 512 --output-len 256 --seed 0 --yes \
    --json "$OUT/bench_x2.json" --markdown "$OUT/bench_x2.md" --out-dir /tmp/bench-out 2>&1 | tee "$OUT/bench_x2.txt"
echo "bench rc=${PIPESTATUS[0]} after $(($(date +%s) - t0)) s"
python3 -m vsup down --yes >/dev/null 2>&1
