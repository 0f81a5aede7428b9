# `vsup tune` on one H200 (benchmarks/tune_h200.md). A device call lasts at most 10 minutes and
# the tune takes longer (six candidates, ~1-1.5 min to start each): `start` runs it detached
# (setsid nohup: it outlives the call, as vsup's daemon does) and follows it for 9 minutes;
# `follow` follows it again in the next call (same warm machine) and copies the results to $OUT
# once it ended. TUNE_BUDGET, TUNE_PROMPTS and TUNE_REPEATS shrink it to the device time left
# (the 2026-12-02 run: TUNE_BUDGET=11m TUNE_PROMPTS=300 TUNE_REPEATS=1). Needs `source .vllmkit-b/stage.sh` done in the call (see common.sh).
set -u
source .vllmkit-b/stage.sh || exit 3
RUN=/tmp/tune-run
SLO="ttft_p99<=2s,tpot_p99<=100ms"
follow() {
    local t_end=$(($(date +%s) + ${1:-540}))
    while [ "$(date +%s)" -lt "$t_end" ]; do
        if [ -f "$RUN/rc" ]; then
            echo "tune rc=$(cat "$RUN/rc")"
            cp -r "$RUN"/tune.* "$RUN"/best.toml "$RUN"/tune.txt "$OUT"/ 2>/dev/null
            cp "$RUN"/out/result.json "$RUN"/out/tune.log "$OUT"/ 2>/dev/null
            python3 -m vsup down --yes >/dev/null 2>&1
            return 0
        fi
        sleep 10
    done
    tail -3 "$RUN/tune.txt"
    echo "still running: call \`bash benchmarks/gpu_bench/tune_h200.sh follow\` again"
}
case "${1:-start}" in
start)
    # installs vsup's wheel (only here: `follow` must not replace it under the running tune)
    source benchmarks/gpu_bench/common.sh
    rm -rf "$RUN" && mkdir -p "$RUN"
    # --warmups 0 when this vLLM's client lacks --num-warmups (the kit's 0.26 should have it)
    warm=2
    python3 -m vllm.entrypoints.cli.main bench serve --help 2>/dev/null | grep -q -- --num-warmups || warm=0
    setsid nohup bash -c "python3 -m vsup tune /tmp/h200-tune-base.toml --slo '$SLO' \
        --num-prompts ${TUNE_PROMPTS:-600} --input-len 512 --output-len 256 --request-rate 20 \
        --seed 0 --min-prompts 100 --repeats ${TUNE_REPEATS:-2} --warmups $warm \
        --budget ${TUNE_BUDGET:-20m} --yes \
        --out-dir $RUN/out --json $RUN/tune.json --markdown $RUN/tune.md --plot $RUN/tune.svg \
        -o $RUN/best.toml >$RUN/tune.txt 2>&1; echo \$? >$RUN/rc" </dev/null >/dev/null 2>&1 &
    follow 540
    ;;
follow)
    export VSUP_HOME=/tmp/vsup-home PYTHONUNBUFFERED=1
    cd /tmp || exit 1
    follow 560
    ;;
*) echo "usage: tune_h200.sh [start|follow]"; exit 2 ;;
esac
