#!/usr/bin/env bash
# The fast path's GPU checks and numbers in one device call (issue 5), after staging:
#   source .carry/env/setup.sh && TANDEM_COMMIT=<sha> bash bench/device/fast_path.sh
# 1) tests/gpu/test_gpu_graphs.py; 2) tandem bench with CUDA graphs: plain, the default drafter
# and n-gram on HumanEval and ShareGPT, bs 1/8/64, greedy (torch attention for the prompts, so
# no flashinfer JIT); 3) how fast the engine generator answers 512 training prompts (issue 4).
# Everything lands under $OUT; each step has its own time limit so a slow one cannot eat the call.
set -uo pipefail
export TANDEM_CACHE=${TANDEM_CACHE:-/root/stage/payload} TQDM_MININTERVAL=${TQDM_MININTERVAL:-60}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
tandem=(python3 -m cli.main)
SECONDS=0
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout "${TESTS_S:-150}" python3 -m pytest -q tests/gpu/test_gpu_graphs.py > "$OUT/gpu-tests.log" 2>&1
tail -3 "$OUT/gpu-tests.log"; echo "tests done at $SECONDS s"
timeout "${BENCH_S:-300}" "${tandem[@]}" bench --name "h100-fast-path-${TANDEM_COMMIT:-dev}" --drafts none,auto,ngram \
  --baselines none --temperatures 0 --dataset humaneval,sharegpt --num-prompts 8 --batch-sizes 1,8,64 \
  --max-tokens 128 --attention torch --device cuda --out-dir "$OUT" > "$OUT/bench.log" 2>&1
grep -E '^\{' "$OUT/bench.log" | cut -c1-160; echo "bench done at $SECONDS s"
timeout "${GEN_S:-90}" "${tandem[@]}" train-draft --kind eagle --out /tmp/gen-probe --generator engine \
  --num-prompts 512 --gen-batch-size 256 --max-new-tokens 256 --time-budget 1 --val-prompts 0 \
  --corpus /tmp/gen-probe.npz 2>&1 | tr '\r' '\n' | grep "answered" | tee "$OUT/generator.log"
echo "done in $SECONDS s"
