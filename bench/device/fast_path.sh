#!/usr/bin/env bash
# The fast path's GPU checks and numbers in one device call (issue 5), after staging:
#   source .carry/env/setup.sh && TANDEM_COMMIT=<sha> bash bench/device/fast_path.sh
# 1) the GPU tests of the kernels and the graphs; 2) bench.step_profile: one captured step with the
# Triton kernels and with plain torch ops (A/B), its GPU time and kernels; 3) tandem bench with CUDA
# graphs: plain and the default drafter, HumanEval and ShareGPT, greedy (torch attention for the
# prompts, so no flashinfer JIT); 4) eval-draft of the default drafter at k = 4 (issue 4).
# Everything lands under $OUT; each step has its own time limit so a slow one cannot eat the call.
set -uo pipefail
export TANDEM_CACHE=${TANDEM_CACHE:-/root/stage/payload} TQDM_MININTERVAL=${TQDM_MININTERVAL:-60}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
tandem=(python3 -m cli.main)
SECONDS=0
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout "${TESTS_S:-170}" python3 -m pytest -q ${TESTS:-tests/gpu/test_gpu_kernels.py tests/gpu/test_gpu_graphs.py} \
  > "$OUT/gpu-tests.log" 2>&1
tail -4 "$OUT/gpu-tests.log"; echo "tests done at $SECONDS s"
for ops in triton torch; do
  timeout "${PROFILE_S:-75}" python3 -m bench.step_profile --batch "${PROFILE_BATCH:-1,64}" --q-len 1,5 --iters 100 \
    $([ $ops = torch ] && echo --torch-ops) --out "$OUT/step-$ops.json" 2>&1 | grep -v Warning
done
echo "profiles done at $SECONDS s"
timeout "${BENCH_S:-150}" "${tandem[@]}" bench --name "h100-fast-path-${TANDEM_COMMIT:-dev}" --drafts "${DRAFTS:-none,auto}" \
  --baselines none --temperatures 0 --dataset humaneval,sharegpt --num-prompts 8 --batch-sizes "${BATCHES:-1,8}" \
  --max-tokens 128 --attention torch --device cuda --out-dir "$OUT" > "$OUT/bench.log" 2>&1
grep -E '^\{' "$OUT/bench.log" | cut -c1-200; echo "bench done at $SECONDS s"
left=$(( ${CALL_S:-580} - SECONDS ))
if [ "$left" -gt 60 ]; then
  timeout "$left" "${tandem[@]}" eval-draft --draft auto --k 4 --temperature 0,0.7 --dataset sharegpt,humaneval \
    --num-prompts 32 --max-tokens 128 --batch-size 32 --attention torch --device cuda \
    --out "$OUT/eval-draft-h100-run4.json" 2>&1 | grep -E '^\|' 
fi
echo "done in $SECONDS s"
