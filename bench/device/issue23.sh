#!/usr/bin/env bash
# Speculation at every batch size (issue 23) on the GPU, after staging (../shared/device/README.md,
# outside this repository: stage.sh's chunks put on the machine), one device call per part:
#   source .carry/env/setup.sh && TANDEM_COMMIT=<sha> PART=P bash bench/device/issue23.sh
# P: where a fused round's time goes as its rows grow: bench.step_profile --round (EAGLE head, n-gram, plain) at
#    batch 1, 4, 16, 64, greedy and T 0.7, then tandem bench speculative (policy off: --spec-max-batch 64) against
#    plain at the same batch sizes (HumanEval, 64 prompts).
# G: the GPU tests of n-gram fused rounds, then the greedy round profiles again (n-gram, EAGLE head, plain).
# T: the issue's table, one dataset a call (DATASET=humaneval or sharegpt): tandem bench none,auto,ngram at bs 1, 4,
#    16, 64, greedy and T 0.7, 64 prompts, this commit (BASE=path: and the tree there, the A/B baseline, in the same
#    call; carry it: `git archive 07c691b | tar -x -C .carry/base`, then make .carry/base/bench/run.py read ShareGPT's
#    held-out split as this tree does, `sharegpt(split="eval")` for `split="train"`; PREV=path: and that tree before
#    it, tagged -prev, at PREV_BS, default BS);
#    TREE_S: each tree's time limit (default 290 s); MIN_S=S: this tree's cases repeated to S seconds (--min-seconds;
#    the other trees' bench has no such flag); PIPE=N: and this tree with --pipeline-max-batch N at bs 16 and 64,
#    greedy; BS=1,4: those batch sizes only; CONT=1: and this tree with continuous admission (NUM prompts, default
#    160: HumanEval has 164), a wave's tail gone.
# V: rounds launched ahead through rows finishing (chained rows compacted, room counted down on the device): the GPU
#    tests of rounds launched ahead, then tandem bench at bs 1, 4, 16, 64, greedy, speculation at every size
#    (--spec-max-batch 64) and plain, HumanEval 64 prompts: BASE=path's tree, then this one.
# Q: where a continuous batch's speculative round goes at 16 and 64 rows: bench.step_profile --round auto and none at
#    batch 16 and 64 (greedy), then tandem bench with continuous admission, speculation at every size, HumanEval
#    (NUM, default 256, prompts), greedy, plain and the EAGLE head, sampled by py-spy record (raw stacks; carry
#    [".carry/env", ".whl"]).
# R: arrivals gathered (--admit-group G, for each G of ADMIT, default 1,4,8): tandem bench with continuous admission,
#    speculation at every size (--spec-max-batch 64), HumanEval (NUM, default 512, prompts), greedy (TEMPS), plain and
#    the EAGLE head (DRAFTS), at BS (default 16,64).
# S: several speculative rounds a replay (--spec-rounds): the GPU tests of replays of two rounds and of rounds launched
#    ahead, then R's tandem bench (ADMISSION, default continuous) for each ROUNDS:GROUP of CONFIGS (default
#    1:1,2:1,2:8,3:8; --spec-rounds-min-batch 16), plain, the EAGLE head and n-gram (DRAFTS); BASE=path: that tree
#    too (carried, from 4fe4763 on), before this one, each config, after a warm-up load; NO_TESTS=1: no tests.
# W: waves at every size (--spec-max-batch 64), HumanEval 64 prompts, greedy, BS (default 16,64), plain, the EAGLE head
#    and n-gram: --spec-rounds 1, then this tree's default.
# M: the default batch limit, waves: tandem bench at BS (default 4,16), none,auto,ngram, greedy and T 0.7, 64 prompts,
#    DATASET (default humaneval), with --spec-max-batch 8 and then 16 (one tree, this one).
# Y: py-spy over one continuous load (bs 64, 1024 prompts, the EAGLE head, --spec-rounds ROUNDS, default 1), in
#    BASE=path's tree and then this one (carry [".carry/env", ".whl", BASE]).
# F: a wave's prompts packed into prefill replays: bench.prefill_buckets (what a replay costs by rows x length), then
#    tandem bench at BS (default 16,64), plain and the EAGLE head (DRAFTS), greedy, 64 prompts of DATASET, --min-seconds
#    MIN_S (default 2), in PREV=path's tree and this one in turn, ORDER (default "prev new prev new"), after a warm-up.
# X: draft trees (--spec-tree): tandem bench at BS (default 1,4,16), greedy (TEMPS: e.g. 0,0.7), 64 prompts of
#    DATASET, --min-seconds MIN_S (default 2): plain and the EAGLE head's chain, then plain and the head with each tree
#    of TREES (default 2,2,1,1 and 3,2,1,1, separated by spaces), one process each; NO_TESTS=1 skips
#    tests/gpu/test_gpu_tree.py first; ADMISSION=continuous (default waves) with NUM prompts (default 64; HumanEval has
#    164).
# K: where a tree round's time goes: bench.step_profile --round auto at BS (default 1,4), greedy (TEMP: sampled), the
#    chain (k 4) and each tree of TREES (default 2,2,1,1; k its depth), 40 kernels each, and the first tree again with
#    torch.topk picking the children (the drafter before kernels.topk_rows); then tests/gpu/test_gpu_tree.py and the
#    topk_rows and tree_sample_accept GPU tests (NO_TESTS=1: not; TESTS_S: their time limit, default 300 s).
#    X's trees take k from their depth too (neither passes --k: a tree's k is its depth).
source "$(dirname "$0")/env.sh"
name=${NAME:-h100}-${TANDEM_COMMIT:-dev}
case "${PART:-P}" in
  P)
    for d in auto ngram none; do
      for t in 0 0.7; do
        [ "$d" = none ] && [ "$t" = 0.7 ] && continue
        timeout 150 python3 -m bench.step_profile --round $d --temperature $t --batch 1,4,16,64 --iters 100 --top 10 \
          --out "$OUT/profile-$d-$t.json" > "$OUT/profile-$d-$t.log" 2>&1
        grep -E '^round' "$OUT/profile-$d-$t.log" || tail -5 "$OUT/profile-$d-$t.log"
      done
    done
    echo "profiles done at $SECONDS s"
    timeout 300 python3 -m cli.main bench --name "$name-forced" --dataset humaneval --num-prompts 64 \
      --batch-sizes 1,4,16,64 --drafts none,auto,ngram --baselines none --temperatures 0,0.7 --spec-max-batch 64 \
      --attention torch --device cuda --out-dir "$OUT" > "$OUT/$name-forced.log" 2>&1
    tail -30 "$OUT/$name-forced.md" 2>/dev/null || tail -20 "$OUT/$name-forced.log"; echo "bench done at $SECONDS s" ;;
  X)
    [ -n "${NO_TESTS:-}" ] || { timeout 300 python3 -m pytest -q -x tests/gpu/test_gpu_tree.py > "$OUT/$name-tree-tests.log" 2>&1;
      tail -3 "$OUT/$name-tree-tests.log"; echo "tests done at $SECONDS s"; }
    ds=${DATASET:-humaneval} adm=${ADMISSION:-waves}
    for tree in chain ${TREES:-2,2,1,1 3,2,1,1}; do
      tag="$name-$ds-$adm-tree-$(echo "$tree" | tr -d ,)"
      if [ "$tree" = chain ]; then more=(--drafts none,auto); else more=(--drafts none,auto --spec-tree "$tree"); fi
      timeout 200 python3 -m cli.main bench --name "$tag" --dataset "$ds" --num-prompts "${NUM:-64}" \
        --batch-sizes "${BS:-1,4,16}" "${more[@]}" --baselines none --temperatures "${TEMPS:-0}" --admission "$adm" \
        --min-seconds "${MIN_S:-2}" --attention torch --device cuda --out-dir "$OUT" > "$OUT/$tag.log" 2>&1
      grep -E '^\|' "$OUT/$tag.md" | cut -d'|' -f2-14 || tail -20 "$OUT/$tag.log"; echo "$tag done at $SECONDS s"
    done ;;
  K)
    prof=(python3 -m bench.step_profile --round auto --temperature "${TEMP:-0}" --batch "${BS:-1,4}" --iters 50 --top 40)
    set -- ${TREES:-2,2,1,1}
    for tree in chain "$@" "torch-topk:$1"; do
      tag="$name-profile-$(echo "$tree" | tr -d ,:)"
      case "$tree" in
        chain) timeout 120 "${prof[@]}" --out "$OUT/$tag.json" > "$OUT/$tag.log" 2>&1 ;;
        torch-topk:*) timeout 120 python3 -c "import runpy, sys, torch; from engine.models import ops
ops.topk = lambda x, b: torch.topk(x, b, dim=-1).indices
sys.argv = sys.argv[1:]; runpy.run_module('bench.step_profile', run_name='__main__')" "${prof[@]:2}" \
            --spec-tree "${tree#*:}" --out "$OUT/$tag.json" > "$OUT/$tag.log" 2>&1 ;;
        *) timeout 120 "${prof[@]}" --spec-tree "$tree" --out "$OUT/$tag.json" > "$OUT/$tag.log" 2>&1 ;;
      esac
      echo "$tree:"; grep -E '^round' "$OUT/$tag.log" || tail -5 "$OUT/$tag.log"
    done
    echo "profiles done at $SECONDS s"
    [ -n "${NO_TESTS:-}" ] || { timeout "${TESTS_S:-300}" python3 -m pytest -q -s tests/gpu/test_gpu_tree.py \
      tests/gpu/test_gpu_kernels.py::test_topk_rows_compiled_equal_a_stable_sort \
      tests/gpu/test_gpu_kernels.py::test_tree_sample_accept_compiled_equals_the_torch_steps \
      > "$OUT/$name-tree-tests.log" 2>&1;
      grep -E "^\{'chain'|passed|failed" "$OUT/$name-tree-tests.log" | cut -c1-600; echo "tests done at $SECONDS s"; } ;;
  F)
    [ -n "${NO_PROBE:-}" ] || { timeout 150 python3 -m bench.prefill_buckets > "$OUT/$name-prefill-buckets.log" 2>&1;
      cat "$OUT/$name-prefill-buckets.log" | cut -c1-120; }
    ds=${DATASET:-humaneval}
    timeout 100 python3 -m cli.main bench --name warm --dataset "$ds" --num-prompts 64 --batch-sizes 64 --drafts none \
      --baselines none --temperatures 0 --attention torch --device cuda --out-dir /tmp/warm > /dev/null 2>&1
    for t in ${ORDER:-prev new prev new}; do
      tree=$([ "$t" = prev ] && echo "$PREV" || echo .); tag="$name-$ds-prefill-$t-$SECONDS"
      (cd "$tree" && timeout 200 python3 -m cli.main bench --name "$tag" --dataset "$ds" --num-prompts 64 \
        --batch-sizes "${BS:-16,64}" --drafts "${DRAFTS:-none,auto}" --baselines none --temperatures 0 \
        --min-seconds "${MIN_S:-2}" --attention torch --device cuda --out-dir "$OUT" > "$OUT/$tag.log" 2>&1)
      grep -E '^\|' "$OUT/$tag.md" | cut -d'|' -f2-14 || tail -20 "$OUT/$tag.log"; echo "$tag done at $SECONDS s"
    done ;;
  G)
    timeout 400 python3 -m pytest -q -x tests/gpu/test_gpu_graphs.py tests/gpu/test_gpu_fused_sampling.py -k "ngram" \
      > "$OUT/gpu-tests.log" 2>&1; tail -3 "$OUT/gpu-tests.log"
    for d in ngram auto none; do
      timeout 100 python3 -m bench.step_profile --round $d --batch 1,4,16,64 --iters 100 --top 10 \
        --out "$OUT/profile-$d-0.json" > "$OUT/profile-$d-0.log" 2>&1
      grep -E '^round' "$OUT/profile-$d-0.log" || tail -5 "$OUT/profile-$d-0.log"
    done ;;
  T)
    ds=${DATASET:-humaneval}
    for tree in . ${PREV:-} ${BASE:-}; do
      tag=$name-$ds$([ "$tree" = . ] || { [ "$tree" = "${PREV:-}" ] && echo -prev || echo -base; })
      bs=${BS:-1,4,16,64}; [ "$tree" = "${PREV:-}" ] && bs=${PREV_BS:-$bs}
      more=(); [ "$tree" = . ] && [ -n "${MIN_S:-}" ] && more=(--min-seconds "$MIN_S")
      (cd "$tree" && timeout "${TREE_S:-290}" python3 -m cli.main bench --name "$tag" --dataset "$ds" --num-prompts 64 \
        --batch-sizes "$bs" --drafts none,auto,ngram --baselines none --temperatures 0,0.7 "${more[@]}" \
        --attention torch --device cuda --out-dir "$OUT" > "$OUT/$tag.log" 2>&1)
      grep -E '^\|' "$OUT/$tag.md" | cut -d'|' -f2-11 || tail -20 "$OUT/$tag.log"; echo "$tag done at $SECONDS s"
    done
    if [ -n "${PIPE:-}" ]; then  # rounds launched ahead at every batch size, this tree: greedy, bs 16 and 64
      tag="$name-$ds-pipe$PIPE"
      timeout 120 python3 -m cli.main bench --name "$tag" --dataset "$ds" --num-prompts 64 --batch-sizes 16,64 \
        --drafts none,auto,ngram --baselines none --temperatures 0 --pipeline-max-batch "$PIPE" --attention torch \
        --device cuda --out-dir "$OUT" > "$OUT/$tag.log" 2>&1
      grep -E '^\|' "$OUT/$tag.md" | cut -d'|' -f2-9 || tail -20 "$OUT/$tag.log"; echo "$tag done at $SECONDS s"
    fi
    if [ -n "${CONT:-}" ]; then  # this tree with continuous admission (no waves, as the gateway serves)
      tag="$name-$ds-cont"
      timeout "${TREE_S:-290}" python3 -m cli.main bench --name "$tag" --dataset "$ds" --num-prompts "${NUM:-160}" \
        --batch-sizes "${BS:-1,4,16,64}" --drafts none,auto,ngram --baselines none --temperatures 0,0.7 \
        --admission continuous ${MIN_S:+--min-seconds "$MIN_S"} --attention torch --device cuda --out-dir "$OUT" \
        > "$OUT/$tag.log" 2>&1
      grep -E '^\|' "$OUT/$tag.md" | cut -d'|' -f2-11 || tail -20 "$OUT/$tag.log"; echo "$tag done at $SECONDS s"
    fi ;;
  Q)
    for d in auto none; do
      timeout 100 python3 -m bench.step_profile --round $d --batch 16,64 --iters 100 --top 12 \
        --out "$OUT/profile-$d-0.json" > "$OUT/profile-$d-0.log" 2>&1
      grep -E '^round' "$OUT/profile-$d-0.log" || tail -5 "$OUT/profile-$d-0.log"
    done
    timeout 200 python3 -m cli.main bench --name "$name-cont" --dataset humaneval --num-prompts "${NUM:-256}" \
      --batch-sizes 16,64 --drafts none,auto --baselines none --temperatures 0 --spec-max-batch 64 \
      --admission continuous --attention torch --device cuda --out-dir "$OUT" > "$OUT/$name-cont.log" 2>&1
    grep -E '^\|' "$OUT/$name-cont.md" | cut -d'|' -f2-14 || tail -20 "$OUT/$name-cont.log"; echo "bench at $SECONDS s"
    python3 -m pip install -q --no-index --no-deps --target /tmp/spy .whl/py_spy-*.whl && export PATH=/tmp/spy/bin:$PATH
    timeout 150 py-spy record -r 200 --nonblocking -f raw -o "$OUT/pyspy-cont64.txt" -- python3 -m cli.main bench \
      --name "$name-cont64" --dataset humaneval --num-prompts 1024 --batch-sizes 64 --drafts auto --baselines none \
      --temperatures 0 --spec-max-batch 64 --admission continuous --attention torch --device cuda --out-dir "$OUT" \
      > "$OUT/$name-cont64.log" 2>&1
    grep -E '^\|' "$OUT/$name-cont64.md" | cut -d'|' -f2-14; echo "done at $SECONDS s" ;;
  M)
    for smb in 8 16; do
      tag="$name-${DATASET:-humaneval}-smb$smb"
      timeout 280 python3 -m cli.main bench --name "$tag" --dataset "${DATASET:-humaneval}" --num-prompts 64 \
        --batch-sizes "${BS:-4,16}" --drafts none,auto,ngram --baselines none --temperatures 0,0.7 \
        --spec-max-batch $smb --attention torch --device cuda --out-dir "$OUT" > "$OUT/$tag.log" 2>&1
      grep -E '^\|' "$OUT/$tag.md" | cut -d'|' -f2-14 || tail -20 "$OUT/$tag.log"; echo "$tag at $SECONDS s"
    done ;;
  Y)
    python3 -m pip install -q --no-index --no-deps --target /tmp/spy .whl/py_spy-*.whl && export PATH=/tmp/spy/bin:$PATH
    for tree in ${BASE:-} .; do
      tag="$name-spy-rounds${ROUNDS:-1}$([ "$tree" = . ] || echo -base)"
      (cd "$tree" && timeout 150 py-spy record -r 200 --nonblocking -f raw -o "$OUT/$tag.txt" -- python3 -m cli.main \
        bench --name "$tag" --dataset humaneval --num-prompts 1024 --batch-sizes 64 --drafts auto --baselines none \
        --temperatures 0 --spec-max-batch 64 --spec-rounds "${ROUNDS:-1}" --admission continuous --attention torch \
        --device cuda --out-dir "$OUT" > "$OUT/$tag.log" 2>&1)
      grep -E '^\|' "$OUT/$tag.md" | cut -d'|' -f2-14; echo "$tag at $SECONDS s"
    done ;;
  R)
    for g in $(echo "${ADMIT:-1,4,8}" | tr , ' '); do
      tag="$name-group$g"
      timeout 200 python3 -m cli.main bench --name "$tag" --dataset humaneval --num-prompts "${NUM:-512}" \
        --batch-sizes "${BS:-16,64}" --drafts "${DRAFTS:-none,auto}" --baselines none --temperatures "${TEMPS:-0}" \
        --spec-max-batch 64 --admission continuous --admit-group "$g" --attention torch --device cuda \
        --out-dir "$OUT" > "$OUT/$tag.log" 2>&1
      grep -E '^\|' "$OUT/$tag.md" | cut -d'|' -f2-14 || tail -20 "$OUT/$tag.log"; echo "$tag at $SECONDS s"
    done ;;
  S)
    [ -n "${NO_TESTS:-}" ] || timeout 240 python3 -m pytest -q -x tests/gpu/test_gpu_graphs.py \
      -k "two_rounds or launched_ahead" > "$OUT/gpu-tests-S.log" 2>&1; tail -3 "$OUT/gpu-tests-S.log"
    echo "tests at $SECONDS s"
    [ -n "${BASE:-}" ] && timeout 100 python3 -m cli.main bench --name warm --dataset humaneval --num-prompts 128 \
      --batch-sizes 64 --drafts auto --baselines none --temperatures 0 --spec-max-batch 64 --attention torch \
      --device cuda --out-dir /tmp > /dev/null 2>&1  # the first process of a call reads slow
    for c in $(echo "${CONFIGS:-1:1,2:1,2:8,3:8}" | tr , ' '); do
      for tree in ${BASE:-} .; do
        r=${c%%:*}; g=${c##*:}; tag="$name-rounds$r-group$g$([ "$tree" = . ] || echo -base)"
        (cd "$tree" && timeout 200 python3 -m cli.main bench --name "$tag" --dataset humaneval \
          --num-prompts "${NUM:-512}" --batch-sizes "${BS:-16,64}" --drafts "${DRAFTS:-none,auto,ngram}" \
          --baselines none --temperatures 0 --spec-max-batch 64 --admission "${ADMISSION:-continuous}" \
          --spec-rounds "$r" --admit-group "$g" --attention torch --device cuda --out-dir "$OUT" > "$OUT/$tag.log" 2>&1)
        grep -E '^\|' "$OUT/$tag.md" | cut -d'|' -f2-14 || tail -20 "$OUT/$tag.log"; echo "$tag at $SECONDS s"
      done
    done ;;
  W)
    for r in 1 default; do
      tag="$name-waves-rounds$r"
      timeout 100 python3 -m cli.main bench --name "$tag" --dataset humaneval --num-prompts 64 --batch-sizes "${BS:-16,64}" \
        --drafts none,auto,ngram --baselines none --temperatures 0 --spec-max-batch 64 \
        $([ $r = default ] || echo --spec-rounds $r) --attention torch --device cuda --out-dir "$OUT" > "$OUT/$tag.log" 2>&1
      grep -E '^\|' "$OUT/$tag.md" | cut -d'|' -f2-14 || tail -20 "$OUT/$tag.log"; echo "$tag at $SECONDS s"
    done ;;
  V)
    timeout 200 python3 -m pytest -q -x tests/gpu/test_gpu_graphs.py tests/gpu/test_gpu_fused_sampling.py \
      -k "launched_ahead or captured_sampled_rounds" > "$OUT/gpu-tests.log" 2>&1; tail -3 "$OUT/gpu-tests.log"
    echo "tests done at $SECONDS s"
    for tree in ${BASE:-} .; do
      tag=$([ "$tree" = . ] && echo "$name-forced" || echo "$name-forced-base")
      (cd "$tree" && timeout 190 python3 -m cli.main bench --name "$tag" --dataset humaneval --num-prompts 64 \
        --batch-sizes 1,4,16,64 --drafts none,auto,ngram --baselines none --temperatures 0 --spec-max-batch 64 \
        --attention torch --device cuda --out-dir "$OUT" > "$OUT/$tag.log" 2>&1)
      grep -E '^\|' "$OUT/$tag.md" | cut -d'|' -f2-12 || tail -20 "$OUT/$tag.log"; echo "$tag done at $SECONDS s"
    done ;;
esac
cd "$OUT" && rm -f ./*.png && tar czf "logs-${PART:-P}.tgz" ./*.log 2>/dev/null && rm -f ./*.log; ls "$OUT"
