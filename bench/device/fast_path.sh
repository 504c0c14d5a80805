#!/usr/bin/env bash
# The fast path's GPU checks and numbers in one device call (issue 5), after staging:
#   source .carry/env/setup.sh && TANDEM_COMMIT=<sha> bash bench/device/fast_path.sh
# 1) the GPU tests ($TESTS; TESTS=none skips); 2) bench.step_profile: one captured step with the Triton
# kernels and with plain torch ops ($PROFILE_OPS), its GPU time and kernels; 3) tandem bench with CUDA
# graphs ($DRAFTS x $BATCHES x $TEMPS on HumanEval and ShareGPT, transformers $BASELINES; torch attention
# for the prompts, so no flashinfer JIT; $ROUNDS: fused-round profiles per drafter); with AB=1 the same again with --no-fused-rounds; 4) with time
# left before $CALL_S, eval-draft of the default drafter at k = 4 (issue 4).
# Everything lands under $OUT; each step has its own time limit so a slow one cannot eat the call.
source "$(dirname "$0")/env.sh"
tandem=(python3 -m cli.main)
if [ "${TESTS:-}" != none ]; then
  timeout "${TESTS_S:-170}" python3 -m pytest -q ${TESTS:-tests/gpu/test_gpu_kernels.py tests/gpu/test_gpu_graphs.py} \
    > "$OUT/gpu-tests.log" 2>&1
  tail -4 "$OUT/gpu-tests.log"; echo "tests done at $SECONDS s"
fi
for ops in ${PROFILE_OPS-triton torch}; do
  timeout "${PROFILE_S:-75}" python3 -m bench.step_profile --batch "${PROFILE_BATCH:-1,64}" --q-len 1,5 --iters 100 \
    --aux "${PROFILE_AUX:-}" $([ "$ops" = torch ] && echo --torch-ops) --out "$OUT/step-$ops.json" 2>&1 | grep -v Warning
done
for draft in ${ROUNDS-none auto}; do  # whole fused rounds: step, fused run and graph replay, kernels
  timeout "${PROFILE_S:-75}" python3 -m bench.step_profile --round "$draft" --batch "${ROUND_BATCH:-1,16,64}" --iters 50 \
    --out "$OUT/round-$draft.json" 2>&1 | grep -v Warning
done
echo "profiles done at $SECONDS s"
bench() {  # name, extra flags
  timeout "${BENCH_S:-200}" "${tandem[@]}" bench --name "$1" --drafts "${DRAFTS:-none,auto}" \
    --baselines "${BASELINES:-none}" --temperatures "${TEMPS:-0}" --dataset "${DATASETS:-humaneval,sharegpt}" \
    --num-prompts "${NUM_PROMPTS:-8}" --batch-sizes "${BATCHES:-1,8}" --max-tokens 128 --attention torch \
    --device cuda --out-dir "$OUT" "${@:2}" > "$OUT/$1.log" 2>&1
  grep -E '^\{' "$OUT/$1.log" | cut -c1-220; echo "bench $1 done at $SECONDS s"
}
[ "${DRAFTS:-}" = skip ] || bench "${NAME:-h100-fast-path}-${TANDEM_COMMIT:-dev}"
[ -z "${AB:-}" ] || bench "${NAME:-h100-fast-path}-${TANDEM_COMMIT:-dev}-stepwise" --no-fused-rounds
left=$(( ${CALL_S:-580} - SECONDS ))
if [ "$left" -gt 60 ]; then
  timeout "$left" "${tandem[@]}" eval-draft --draft auto --k 4 --temperature 0,0.7 --dataset sharegpt,humaneval \
    --num-prompts 32 --max-tokens 128 --batch-size 32 --attention torch --device cuda \
    --out "$OUT/eval-draft-h100.json" 2>&1 | grep -E '^\|'
fi
echo "done in $SECONDS s"
