#!/usr/bin/env bash
# Issue 5's GPU checks and numbers, in two device calls back to back (after staging, see
# ../shared/device/README.md, beside the checkout and outside this repository):
#   source .carry/env/setup.sh && TANDEM_COMMIT=<sha> PART=A bash bench/device/issue5.sh
#   source .carry/env/setup.sh && TANDEM_COMMIT=<sha> PART=B bash bench/device/issue5.sh
# A: the GPU tests (kernels, graphs, sampling in fused rounds), a step and a fused-round profile, and
#    tandem bench at batch 1 and 4 (16 prompts per dataset); B: tandem bench at batch 16 and 64 (64 prompts),
#    speculation forced on at those sizes (--spec-max-batch none, why the default stops at 3), the
#    transformers baselines at batch 1, and a Poisson arrival load with and without a round token budget.
# C (the summary run): the fused-round GPU tests, then tandem bench over batch 1, 4, 16 and 64 twice, a short
#    pass first so every kernel specialization and graph bucket has been compiled once on the machine, then
#    the measured pass (64 prompts per dataset).
# D (prefill graphs, co-located Step on fused rounds): the GPU graph and fused-round tests, the prefill profile
#    (64 / 256 / 1,024-token prompts), then tandem bench at batch 1 and 4 after a warm-up pass (16 prompts).
# E (counter-based coins): the GPU sampling tests, then tandem bench at temperature 0.7 (HumanEval, batch 1-64,
#    64 prompts) after a warm-up pass; with BASE=DIR (an older tree, e.g. `git archive` into .carry/base) the
#    same bench there instead, for an A/B on one machine.
# F (the row argmax kernel): the GPU kernel, graph and sampling tests, fused-round profiles (greedy and
#    sampled, batch 1 and 4), then tandem bench at batch 1 and 4 (HumanEval, T 0 and 0.7, 32 prompts) after a
#    warm-up pass; with BASE=DIR only the profiles and the bench, in that tree.
# G (a round's prompts through their prefill graphs): the GPU graph tests, then tandem bench at batch 1, 4 and 8
#    (HumanEval, greedy, 32 prompts) after a warm-up pass, and a Poisson arrival load (ShareGPT, 24 requests/s,
#    batch 16) with and without a 256-token round budget; with BASE=DIR the benches only, in that tree.
# H (the split merge inside the attention launch): the GPU kernel and graph tests, step and fused-round
#    profiles (batch 1 and 4), then tandem bench at batch 1 and 4 (HumanEval, greedy, 32 prompts) after a
#    warm-up pass; with BASE=DIR the profiles and the bench only, in that tree.
# I (an EAGLE head's first drafts in its own graphs): the GPU graph tests, the first-rounds profile (prefill,
#    then the first drafts, 64- and 256-token prompts), then tandem bench at batch 1 and 4 (HumanEval, greedy,
#    32 prompts) after a warm-up pass; with BASE=DIR the profile and the bench only, in that tree.
# J (fused rounds launched ahead): the GPU graph tests, then tandem bench at batch 1 and 4 (HumanEval, greedy, 32
#    prompts) after a warm-up pass, and the same with --pipeline-max-batch 0 (every round read before the next).
# K (sampled rounds launched ahead too): the GPU graph and sampling tests, then J's two benches at temperature 0.7.
# L (the open batch-64 question, bench/RESULTS.md): plain decoding at batch 64 long enough to outlast the
#    captures (HumanEval, greedy, 128 prompts: two full waves, 256 new tokens) after a warm-up pass, three times; with BASE=DIR the
#    same in that tree (alternate the two in calls of one lease).
# The kernels and rounds of a tree: F (GPU tests, round profiles, bench at batch 1 and 4, T 0 and 0.7).
# torch attention for prompts (no flashinfer JIT on a fresh machine); every step has its own time limit.
source "$(dirname "$0")/env.sh"
name=${NAME:-h100}-${TANDEM_COMMIT:-dev}
bench() {  # seconds, name, flags...
  timeout "$1" python3 -m cli.main bench --name "$2" --max-tokens 128 --attention torch --device cuda \
    --out-dir "$OUT" "${@:3}" > "$OUT/$2.log" 2>&1
  grep -E '^\{' "$OUT/$2.log" | cut -c1-200; echo "bench $2 done at $SECONDS s"
}
gpu_tests() {  # seconds ($TESTS_S overrides), pytest args...: into $OUT/gpu-tests.log
  timeout "${TESTS_S:-$1}" python3 -m pytest -q "${@:2}" > "$OUT/gpu-tests.log" 2>&1
  tail -3 "$OUT/gpu-tests.log"; echo "tests done at $SECONDS s"
}
tests_or_base() {  # as gpu_tests; with BASE=DIR (an older tree) no tests, and the rest runs in that tree
  if [ -z "${BASE:-}" ]; then gpu_tests "$@"; else cd "$BASE" && export PYTHONPATH="$PWD:$PYTHONPATH"; fi
}
warm_bench() {  # warm-up seconds, warm-up prompts, seconds ($MAIN_S overrides), name, prompts, grid...:
  # a short pass first (24 tokens: every kernel and graph bucket of the grid compiled and captured), then the measured one
  OUT_MAIN=$OUT; OUT=/tmp/warm; mkdir -p $OUT
  bench "$1" "warm" "${@:6}" --num-prompts "$2" --max-tokens 24 > /dev/null; OUT=$OUT_MAIN
  echo "warm-up pass done at $SECONDS s"
  bench "${MAIN_S:-$3}" "$4" "${@:6}" --num-prompts "$5"
}
if [ "${PART:-A}" = L ]; then
  tests_or_base 200 tests/gpu/test_gpu_kernels.py
  OUT_MAIN=$OUT; OUT=/tmp/warm; mkdir -p $OUT
  bench 100 warm --drafts none --baselines none --temperatures 0 --dataset humaneval --batch-sizes 64 \
    --num-prompts 64 --max-tokens 24 > /dev/null; OUT=$OUT_MAIN
  for i in 1 2 3; do
    bench 150 "$name-bs64-plain-$i" --drafts none --baselines none --temperatures 0 --dataset humaneval \
      --batch-sizes 64 --num-prompts 128 --max-tokens 256
  done
elif [ "${PART:-A}" = K ]; then
  tests_or_base 300 tests/gpu/test_gpu_graphs.py tests/gpu/test_gpu_fused_sampling.py
  warm_bench 100 16 150 "$name-sampled-bs1-4" 32 --drafts none,auto --baselines none --temperatures 0.7 \
    --dataset humaneval --batch-sizes 1,4
  bench 150 "$name-sampled-unpipelined-bs1-4" --drafts none,auto --baselines none --temperatures 0.7 \
    --dataset humaneval --num-prompts 32 --batch-sizes 1,4 --pipeline-max-batch 0
elif [ "${PART:-A}" = J ]; then
  tests_or_base 240 tests/gpu/test_gpu_graphs.py
  warm_bench 100 16 150 "$name-bs1-4" 32 --drafts none,auto --baselines none --temperatures 0 --dataset humaneval \
    --batch-sizes 1,4
  bench 150 "$name-unpipelined-bs1-4" --drafts none,auto --baselines none --temperatures 0 --dataset humaneval \
    --num-prompts 32 --batch-sizes 1,4 --pipeline-max-batch 0
elif [ "${PART:-A}" = I ]; then
  tests_or_base 200 tests/gpu/test_gpu_graphs.py
  timeout 100 python3 -m bench.step_profile --prefill 64,256 --round auto --iters 10 --top 12 \
    --out "$OUT/first-rounds.json" 2>&1 | grep -E "^prefill"
  warm_bench 100 16 150 "$name-bs1-4" 32 --drafts none,auto --baselines none --temperatures 0 --dataset humaneval \
    --batch-sizes 1,4
elif [ "${PART:-A}" = H ]; then
  tests_or_base 200 tests/gpu/test_gpu_kernels.py tests/gpu/test_gpu_graphs.py
  timeout 100 python3 -m bench.step_profile --batch 1,4 --q-len 1,5 --iters 100 --top 6 --out "$OUT/step.json" 2>&1 \
    | grep -vi warn
  timeout 100 python3 -m bench.step_profile --round auto --batch 1,4 --iters 50 --top 6 --out "$OUT/round.json" 2>&1 \
    | grep -vi warn
  echo "profiles done at $SECONDS s"
  [ -n "${NO_BENCH:-}" ] && { echo "done in $SECONDS s"; exit 0; }
  warm_bench 100 16 150 "$name-bs1-4" 32 --drafts none,auto --baselines none --temperatures 0 --dataset humaneval \
    --batch-sizes 1,4
elif [ "${PART:-A}" = G ]; then
  tests_or_base 150 tests/gpu/test_gpu_graphs.py
  warm_bench 100 16 150 "$name-bs1-8" 32 --drafts none,auto --baselines none --temperatures 0 --dataset humaneval \
    --batch-sizes 1,4,8
  bench 150 "$name-arrivals" --drafts none,auto --baselines none --temperatures 0 --dataset sharegpt \
    --num-prompts 48 --batch-sizes 16 --arrival-rate 24 --round-token-budgets 0,256
elif [ "${PART:-A}" = F ]; then
  tests_or_base 200 tests/gpu/test_gpu_kernels.py tests/gpu/test_gpu_fused_sampling.py tests/gpu/test_gpu_graphs.py
  for t in 0 0.7; do
    timeout 100 python3 -m bench.step_profile --round auto --temperature $t --batch 1,4 --iters 50 --top 12 \
      --out "$OUT/round-T$t.json" 2>&1 | grep -E "^round"
  done
  warm_bench 100 16 200 "$name-bs1-4" 32 --drafts none,auto --baselines none --temperatures 0,0.7 \
    --dataset humaneval --batch-sizes 1,4
elif [ "${PART:-A}" = E ]; then
  tests_or_base 200 "tests/gpu/test_gpu_kernels.py::test_philox_random_rows_compiled_equal_the_reference" \
    tests/gpu/test_gpu_fused_sampling.py "tests/gpu/test_gpu_graphs.py::test_fused_rounds_captured_equal_plain_greedy"
  warm_bench 120 64 200 "$name-sampled" 64 --drafts none,auto --baselines none --temperatures 0.7 \
    --dataset humaneval --batch-sizes 1,4,16,64
elif [ "${PART:-A}" = D ]; then
  gpu_tests 200 tests/gpu/test_gpu_graphs.py tests/gpu/test_gpu_fused_sampling.py
  timeout 90 python3 -m bench.step_profile --prefill 64,256,1024 --iters 10 --out "$OUT/prefill.json" 2>&1 \
    | grep -E "^prefill"
  warm_bench 100 16 150 "$name-bs1-4" 16 --drafts none,auto --baselines none --temperatures 0 \
    --dataset humaneval,sharegpt --batch-sizes 1,4
elif [ "${PART:-A}" = C ]; then
  gpu_tests 120 tests/gpu/test_gpu_fused_sampling.py "tests/gpu/test_gpu_graphs.py::test_fused_rounds_captured_equal_plain_greedy"
  warm_bench 120 64 260 "$name" 64 --drafts none,auto --baselines none --temperatures 0,0.7 \
    --dataset humaneval,sharegpt --batch-sizes 1,4,16,64
elif [ "${PART:-A}" = A ]; then
  gpu_tests 210 tests/gpu/test_gpu_kernels.py tests/gpu/test_gpu_graphs.py tests/gpu/test_gpu_fused_sampling.py
  timeout 60 python3 -m bench.step_profile --batch 1 --q-len 1 --iters 100 --out "$OUT/step.json" 2>&1 | grep -v Warn
  timeout 90 python3 -m bench.step_profile --round auto --batch 1,64 --iters 50 --out "$OUT/round-auto.json" 2>&1 \
    | grep -v Warn
  echo "profiles done at $SECONDS s"
  bench 200 "$name-bs1-4" --drafts none,auto --baselines none --temperatures 0,0.7 --dataset humaneval,sharegpt \
    --num-prompts 16 --batch-sizes 1,4
else
  bench 150 "$name-bs16-64" --drafts none,auto --baselines none --temperatures 0,0.7 --dataset humaneval,sharegpt \
    --num-prompts 64 --batch-sizes 16,64
  bench 60 "$name-always-spec" --drafts auto --baselines none --temperatures 0 --dataset humaneval \
    --num-prompts 64 --batch-sizes 16,64 --spec-max-batch none
  bench 200 "$name-hf" --drafts none,auto --baselines hf-eager,hf-static-compile,hf-prompt-lookup --temperatures 0 \
    --dataset humaneval --num-prompts 4 --batch-sizes 1
  bench 100 "$name-arrivals" --drafts none,auto --baselines none --temperatures 0 --dataset sharegpt \
    --num-prompts 48 --batch-sizes 16 --arrival-rate 24 --round-token-budgets 0,256
fi
echo "done in $SECONDS s"
