# A hung engine on the GPU: the kept 1 x 0.90 instance (bench_reverse.sh) gets stall_after_s =
# 15 (a live field: no restart), serves a steady load, and its EngineCore is SIGSTOPped: how
# long until vsup flags it stalled, what /health says meanwhile, and that SIGCONT clears it.
source .vllmkit-b/stage.sh || exit 3
source benchmarks/gpu_bench/common.sh
sed 's/^start_timeout_s = 500$/start_timeout_s = 500\nstall_after_s = 15/' /tmp/h200-1x090.toml >/tmp/h200-1x090-stall.toml
python3 -m vsup up /tmp/h200-1x090-stall.toml --detach --wait --yes --timeout 400
st() { python3 -m vsup status --json | python3 -c "import json,sys; i=json.load(sys.stdin)['instances'][0]; print(i['state'], i['stalled'], i['stalled_for_s'], i['requests_running'], i['requests_waiting'], i['pid'])"; }
st
python3 -m vllm.entrypoints.cli.main bench serve --backend vllm --base-url http://127.0.0.1:8100 \
    --model llama8b --tokenizer /tmp/m8b --dataset-name random --random-input-len 512 \
    --random-output-len 1024 --num-prompts 300 --request-rate 20 --ignore-eos >"$OUT/stall_load.txt" 2>&1 &
load=$!
# freeze only once vLLM counts requests running: a hang that begins while the instance is idle
# is not seen (the engine sends the gauges; a frozen one sends none: VLLM-FACTS, issue 18)
for _ in $(seq 1 90); do
    python3 -m vsup status --json | python3 -c "import json,sys; i=json.load(sys.stdin)['instances'][0]; sys.exit(0 if (i['requests_running'] or 0) > 0 else 1)" && break
    sleep 1
done
sleep 3
core=$(pgrep -f '^VLLM::EngineCore' | head -1)
echo "EngineCore pid $core; SIGSTOP"; st
kill -STOP "$core"; t0=$(date +%s.%N)
trap 'kill -CONT $core 2>/dev/null' EXIT
for _ in $(seq 1 45); do
    s=$(st); code=$(curl -s -o /dev/null -w '%{http_code}' -m 2 http://127.0.0.1:8100/health)
    echo "t=$(python3 -c "print(round($(date +%s.%N)-$t0,1))") health=$code $s"
    case "$s" in "ready True"*) break ;; esac
    sleep 1
done
python3 -m vsup tui --screenshot "$OUT/stall.svg" --size 160x45
python3 -m vsup status --json >"$OUT/stall_status.json"
kill -CONT "$core"; t1=$(date +%s.%N); echo "SIGCONT"
for _ in $(seq 1 60); do
    s=$(st); echo "t=$(python3 -c "print(round($(date +%s.%N)-$t1,1))") $s"
    case "$s" in "ready False"*) break ;; esac
    sleep 1
done
timeout 200 tail --pid=$load -f /dev/null; kill $load 2>/dev/null
grep -E "Successful requests|Failed requests|Output token throughput" "$OUT/stall_load.txt"
grep -E '"(stalled|stall_cleared)"' "$VSUP_HOME/journal.jsonl"
python3 -m vsup down --yes
