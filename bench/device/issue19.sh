#!/usr/bin/env bash
# Tandem beside vLLM 0.26.0 on one GPU (issue 19), in device calls of one lease. Stage first, on your machine:
#   bash ../shared/device/stage.sh && bash bench/device/stage_peers.sh
# (this recipe needs ../shared, beside the checkout and outside this repository: the model, flashinfer and the runtime wheels come from its stage.sh), put every
# chunk both print on the machine, back to back, then one call per part:
#   carry [".carry/env"]  command: source .carry/env/setup.sh && source .carry/env/peers.sh && \
#                                  TANDEM_COMMIT=<sha> PART=A bash bench/device/issue19.sh
# A: the peer's import check; Tandem on SmolLM2 (HumanEval, 64 prompts, batch 1/4/16/64, T 0 and 0.7: plain, the
#    EAGLE head, n-gram); Tandem plain on the Llama-3.2-1B shape.
# B: vLLM on SmolLM2, the same cases: plain, n-gram speculation on the host and on the GPU.
# C: Tandem plain on the Llama-3.1-8B shape; the GPU time of a step of k + 1 = 5 tokens per row against 1
#    (bench.step_profile) on both shapes; vLLM plain on both shapes (dummy weights).
# D: served: tandem bench-serve, Tandem's gateway (co-located) and vLLM's OpenAI server (plain, n-gram), the same
#    client processes and prompts, concurrency 1/8/64, greedy, beside the in-process engine.
# Compare with `python -m bench.compare $OUT/*.json`. Prompts go through torch attention (no flashinfer JIT on a
# fresh machine); every step has its own time limit.
source "$(dirname "$0")/env.sh"
name=${NAME:-h100}-${TANDEM_COMMIT:-dev}
reap() {  # a step cut short by its limit must not leave a vLLM engine holding the GPU for the next
  pkill -9 -f 'bench.peers.vllm_runner|vllm.entrypoints|VLLM::' 2>/dev/null; sleep 1
}
bench() {  # seconds, name, flags...
  timeout "$1" python3 -m cli.main bench --name "$2" --attention torch --device cuda --out-dir "$OUT" "${@:3}" \
    > "$OUT/$2.log" 2>&1
  reap; grep -E '^\{' "$OUT/$2.log" | cut -c1-200; echo "bench $2 done at $SECONDS s"
}
smollm=(--dataset humaneval --num-prompts 64 --batch-sizes 1,4,16,64 --temperatures 0,0.7 --max-tokens 128)
shapes=(--dataset humaneval --num-prompts 64 --batch-sizes 1,4,16,64 --temperatures 0 --max-tokens 64)
case "${PART:-A}" in
  A)
    PYTHONPATH="$TANDEM_PEER_PYTHONPATH:$PYTHONPATH" timeout 90 python3 bench/device/peer_import_check.py \
      > "$OUT/peer-check.log" 2>&1; echo "peer check rc=$?"; tail -3 "$OUT/peer-check.log"
    bench 300 "$name-smollm2-tandem" "${smollm[@]}" --drafts none,auto,ngram --baselines none
    bench 150 "$name-llama1b-tandem" --model synthetic:llama-3.2-1b "${shapes[@]}" --drafts none --baselines none ;;
  B)
    bench 570 "$name-smollm2-vllm" "${smollm[@]}" --drafts '' --baselines vllm,vllm-ngram,vllm-ngram-gpu ;;
  C)
    bench 150 "$name-llama8b-tandem" --model synthetic:llama-3.1-8b "${shapes[@]}" --drafts none --baselines none
    for m in llama-3.2-1b llama-3.1-8b; do
      timeout 50 python3 -m bench.step_profile --model "synthetic:$m" --batch 1,4,16,64 --q-len 1,5 --iters 50 \
        --top 0 --out "$OUT/$name-${m}-verify-cost.json" 2>&1 | grep -E '^triton'; echo "profile $m done at $SECONDS s"
    done
    bench 140 "$name-llama1b-vllm" --model synthetic:llama-3.2-1b "${shapes[@]}" --drafts '' --baselines vllm
    bench 160 "$name-llama8b-vllm" --model synthetic:llama-3.1-8b "${shapes[@]}" --drafts '' --baselines vllm ;;
  D)
    timeout 560 python3 -m cli.main bench-serve --name "$name-served" --servers tandem-colocated,vllm,vllm-ngram \
      --concurrency 1,8,64 --max-tokens 128 --client-processes 4 --in-process --attention torch --device cuda \
      --out-dir "$OUT" > "$OUT/$name-served.log" 2>&1
    reap; grep -E '^\{' "$OUT/$name-served.log" | cut -c1-200; echo "served done at $SECONDS s" ;;
esac
# a call returns at most 8 files: the JSON rows as they are, the logs and tables in one archive
cd "$OUT" && rm -f ./*.png && tar czf "logs-${PART:-A}.tgz" ./*.log ./*.md 2>/dev/null; rm -f ./*.log ./*.md; ls "$OUT"
