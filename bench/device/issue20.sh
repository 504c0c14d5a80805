#!/usr/bin/env bash
# The engine restructured (issue 20) on the GPU, in two device calls of one lease, after staging
# (../shared/device/README.md, outside this repository: bash ../shared/device/stage.sh, its chunks put on the machine):
#   source .carry/env/setup.sh && TANDEM_COMMIT=<sha> PART=T bash bench/device/issue20.sh
#   source .carry/env/setup.sh && TANDEM_COMMIT=<sha> PART=AB BASE=.carry/base BASE_COMMIT=07c691b \
#     bash bench/device/issue20.sh                  (carry .carry/base: `git archive 07c691b | tar -x -C .carry/base`)
# T: every GPU test (tests/gpu, the shipped configuration's among them) into gpu-tests.log.
# AB: tandem bench at batch 1, 4 and 64 (HumanEval, T 0 and 0.7, plain and the EAGLE head, 64 prompts) in this tree,
#    in BASE, and in this tree again, each after a warm-up pass; then a per-request k of 2 on the k = 4 graph against
#    a k = 2 graph and against eager rounds (--no-fused-rounds), batch 1.
source "$(dirname "$0")/env.sh"
name=${NAME:-h100}-${TANDEM_COMMIT:-dev}
here=$PWD
bench() {  # seconds, name, flags...
  timeout "$1" python3 -m cli.main bench --name "$2" --attention torch --device cuda --out-dir "$OUT" \
    --dataset humaneval --baselines none "${@:3}" > "$OUT/$2.log" 2>&1
  grep -E '^\{' "$OUT/$2.log" | cut -c1-160; echo "bench $2 done at $SECONDS s"
}
grid=(--drafts none,auto --temperatures 0,0.7 --batch-sizes 1,4,64 --num-prompts 64 --max-tokens 128)
pass() {  # tree, name: a warm-up pass (24 tokens: kernels compiled on this machine), then the measured one
  (cd "$1" && export PYTHONPATH="$PWD:$PYTHONPATH" OUT_KEEP=$OUT && OUT=/tmp/warm && mkdir -p $OUT &&
    bench 120 warm "${grid[@]}" --max-tokens 24 > /dev/null && OUT=$OUT_KEEP && bench 200 "$2" "${grid[@]}")
}
case "${PART:-T}" in
  T)
    timeout 560 python3 -m pytest -q tests/gpu > "$OUT/$name-gpu-tests.log" 2>&1
    tail -5 "$OUT/$name-gpu-tests.log"; echo "tests done at $SECONDS s" ;;
  AB)
    pass "$here" "$name-ab1"
    TANDEM_COMMIT=${BASE_COMMIT:-base} pass "$BASE" "${NAME:-h100}-${BASE_COMMIT:-base}-ab"
    pass "$here" "$name-ab2"
    bench 90 "$name-request-k2" --drafts auto --temperatures 0 --batch-sizes 1 --num-prompts 32 --request-k 2
    bench 90 "$name-graph-k2" --drafts auto --temperatures 0 --batch-sizes 1 --num-prompts 32 --k 2
    bench 120 "$name-eager-k2" --drafts auto --temperatures 0 --batch-sizes 1 --num-prompts 32 --k 2 \
      --no-fused-rounds ;;
esac
# a call returns at most 8 files: the JSON rows, the logs in one archive
cd "$OUT" && rm -f ./*.png ./*.md && tar czf "logs-${PART:-T}.tgz" ./*.log 2>/dev/null && rm -f ./*.log; ls "$OUT"
