#!/usr/bin/env bash
# Serving at engine speed (issue 21) on the GPU, after staging (../shared/device/README.md, outside this repository:
# stage.sh's chunks put on the machine), one device call per part:
#   source .carry/env/setup.sh && TANDEM_COMMIT=<sha> PART=A bash bench/device/issue21.sh
# The served stacks make throwaway certificates (rpc/certs.py: cryptography), which the GPU image lacks (2026-12-07):
# stage with TANDEM_STAGE_EXTRA_WHEELS="cryptography cffi pycparser".
# A: tandem bench-serve: the co-located and the split stack (default drafter, k 4) beside the in-process engine on
#    the same prompts, concurrency 1, 8 and 64, greedy and T 0.7 (HumanEval, 128 new tokens, 4 client processes).
# B: the co-located stack at concurrency 64, then the split stack's rounds at batch 8 with the n-gram drafter, early
#    drafts on and off (tandem bench-services), with the verifier's and the gateway's Python stacks sampled meanwhile (py-spy dump, from the carried .whl:
#    carry [".carry/env", ".whl"]) into pyspy.txt.
# D: tandem bench-serve, greedy (TEMPS=0,0.7: and sampled): co-located, split with the verifier calling its drafter (--direct-draft) and split
#    with the gateway running the rounds, beside the in-process engine (as A, one temperature).
# E: speculation at every batch size (TANDEM_SPEC_MAX_BATCH=none) co-located vs split --direct-draft, c 8 and 64
#    greedy, and c 1 at T 0.7; then the GPU tests of padded verify rounds.
# F: where a split round's time goes: tandem bench-services, co-located vs --direct-draft, batch 1 and 8 with
#    speculation at every size, the default drafter and n-gram (round ms, Draft call ms, the drafter's own ms).
# G: F's split-direct rows alone, then again with every service process switching threads every 0.5 ms instead of
#    Python's 5 ms (a sitecustomize.py on PYTHONPATH; an experiment, not a setting): is the Draft call's wait the GIL?
# H: the split-direct stack at concurrency 1, T 0.7, with the verifier and the drafter sampled by py-spy record
#    (raw stacks into pyspy-*.txt; carry [".carry/env", ".whl"]).
# I (a machine with two GPUs, nvidia-h100-x2): D's co-located stack on cuda:0 beside the split stack (--direct-draft)
#    with its drafter on cuda:1, greedy, and the in-process engine.
# J: co-located at c 8 and 64, greedy and T 0.7, beside the in-process engine, with the verifier's rows by reason and
#    fused rounds (launched ahead or not) per load; then c 64 greedy over 1,024 prompts with the verifier and the
#    gateway sampled by py-spy record (--threads --idle, raw; carry [".carry/env", ".whl"]).
# K: co-located at c 64 greedy over 512 prompts (with the in-process engine), the verifier's engine-thread seconds by
#    phase (rounds, between rounds, idle) per load; then again with every process switching threads every 0.5 ms.
# L: A/B of the co-located stack served (c 1, 8, 64, greedy; TEMPS=0,0.7 for sampled too) beside the in-process
#    engine: this tree, then BASE=path's (carried), one bench-serve each.
# M: the client's share: this tree's co-located stack at c 8 and 64 greedy with PROCS (default 4,8) client processes
#    (gRPC streams on an event loop per process), beside the in-process engine; then BASE=path's tree (threads
#    per stream) at c 64 with BASE_PROCS (default 16) processes.
# N: the in-process engine at batch 64 (1,024 HumanEval prompts, greedy) sampled by py-spy record; then A/B of the
#    co-located stack served at c 8 and 64 greedy: BASE=path's tree and this one, twice in turn, the verifier of the
#    last run sampled at c 64 (carry [".carry/env", ".whl", BASE]).
# O: A/B of the co-located stack served at c 8 and 64 greedy over NUM (default 512) prompts a load, beside the
#    in-process engine: BASE=path's tree, then this one (at most 8 files come back: logs in one archive).
# P: A/B in alternation: a warm-up load first (the first process of a call reads slow: kernels compiled, clocks),
#    then BASE=path's tree and NEW=path's tree (default: this one) in turn, REPS (default 2) times each (ABBA):
#    bench-serve co-located at c 8 and 64 greedy over NUM (default 384) prompts, beside the in-process engine.
#    GATEWAYS=N: the stacks with N gateway processes (trees from df9c163 on). KIND=inproc: tandem bench instead, bs
#    BS (default 1,4,16,64), TEMPS (default 0), DRAFTS (default none,auto,ngram), speculation at every size, NUM
#    prompts (default 128) of DATASET (default humaneval: 164 at most), ADMISSION (waves, continuous; trees from 6eb199d
#    on), TO seconds a run (default 150).
# Q: where a served round's time goes against an in-process one, this tree: the in-process engine at batch 64 (512
#    HumanEval prompts, greedy) under py-spy record (--threads --idle, raw); then the co-located stack at c 64 over
#    1,024 prompts with its verifier recorded 4 s mid-load (carry [".carry/env", ".whl"]).
# R: gateway processes, this tree: the co-located stack with GATEWAYS (default 1,2,2,1) gateway processes sharing
#    its port (tandem serve --gateways), c 8 and 64 greedy over NUM (default 512) prompts a load, beside the
#    in-process engine.
# S: the co-located stack with 2 gateway processes at c 64 greedy (512 prompts): Python's default thread switch
#    interval (5 ms) against 0.5 ms in every process (a sitecustomize.py on PYTHONPATH; an experiment), ABBA.
# U: where a served c 64 round's time goes with two gateways, this tree: the in-process engine at batch 64 (512
#    HumanEval prompts, greedy, plain) admitted in waves and continuously; then the co-located stack with 2 gateway
#    processes at c 64 over 2,048 prompts, its verifier recorded by py-spy three times mid-load: the thread holding
#    the GIL (--gil), every thread (--threads --idle) and every thread with native frames (--native: a thread
#    waiting for the GIL shows take_gil) (carry [".carry/env", ".whl"]).
# W: the verifier's CPUs: the co-located stack with 2 gateway processes at c 64 greedy (NUM, default 1,024 prompts)
#    as the OS places its processes, against the verifier pinned to two physical cores of its own (every logical
#    CPU of them) and everything else (gateways, clients) to the other cores (taskset; an experiment), ABBA.
# X: the served round without gRPC (bench/device/serve_probe.py): the verifier's engine at c 64 greedy over NUM
#    (default 1,024) prompts driven by decoder.step() on one thread, by the RoundLoop on its engine thread with a
#    thread or an asyncio loop taking its outcomes, ABBA; then the co-located stack (2 gateways) on the same load.
# Y: the verifier's engine on a thread of the gRPC process (TANDEM_ENGINE_PROCESS=false) against a process of its
#    own (the default from 2026-11-26), ABBA after a warm-up: the co-located stack with GATEWAYS (default 2)
#    gateway processes at c 8 and 64 greedy over NUM (default 512) prompts a load.
# Z: the table of issue 21 at this tree: bench-serve co-located (GATEWAYS, default 2) and split --direct-draft
#    beside the in-process engine, c 1, 8 and 64 (CONC), greedy and T 0.7, default prompt counts (NUM: that many a
#    load), within TABLE_S (default 590) seconds.
# AB: A/B of BASE=path's tree and this one at c 64 greedy over NUM (default 1,024) prompts, ABBA: the engine alone
#    (serve_probe.py, decoder.step() with each stream's next prompt as its last ends) and the co-located stack with
#    2 gateway processes.
# AC: py-spy of the served verifier's engine process (and its gRPC process) at c 64, two gateways.
# AD: a plain round's steps (TANDEM_PLAIN_STEPS in STEPS, default "1 2 4 2 1"), served c 8 and 64 beside in process.
# AE: the whole of tests/gpu.
# AF: where a served request's time goes: co-located (GATEWAYS, default 2) at c 8 and 64, TEMPS (default 0), over NUM
#    (default 1,024) prompts beside the in-process engine: the client's mean TTFT and latency against a request's
#    mean time in the engine (queued, to its first tokens, its life) and the batch's mean over the rounds' time.
# AG: a round's parts timed, steps with a prefill against those without (serve_probe.py --modes step,parts), the
#    engine alone with each stream's next prompt as its last ends, at CONC (default "8 64") over NUM (default 512);
#    MODES (default step,parts; stagger: arrivals one a step). PREFILL=1 first: bench/device/prefill_probe.py.
# AH: A/B of BASE=path's tree and this one, ABBA: a prompt's prefill (prefill_probe.py) and the engine alone at c 8
#    with arrivals one a step (serve_probe.py --modes stagger, NUM default 384 prompts).
# AI: A/B of BASE=path's tree and this one (ORDER, default "base new"): AF's load (GATEWAYS, TEMPS, NUM) on each.
# AK: this tree's co-located stack at CONC (default 8) with speculation up to SPEC (default "3 8":
#    TANDEM_SPEC_MAX_BATCH=3, then 8), TEMPS (default 0,0.7), NUM (default 512) prompts, GATEWAYS (default 2), DRAFT
#    (default auto), DATASET (default humaneval).
# AJ: A/B of BASE=path's tree and this one (ORDER, default "base new new base"): co-located and split --direct-draft
#    served at CONC (default 1), TEMPS (default 0,0.7), default prompt counts, PROCS (default 1) client processes.
# AL: A/B of BASE=path's tree and this one (ORDER, default "base new"): the split stack (--direct-draft) alone with
#    GATEWAYS (default 2) gateway processes at CONC (default 1,8), TEMPS (default 0), PROCS (default 4) client processes.
# AN: A/B of BASE=path's tree and this one (ORDER, default "base new new base"): the co-located stack (GATEWAYS,
#    default 2; PROCS, default 4, client processes) at CONC (default 1,8), TEMPS (default 0,0.7), default prompt counts,
#    beside the in-process engine; TESTS=1 first: tests/gpu/test_gpu_fused_sampling.py on this tree.
# AO: the split verifier's own n-gram drafter (TANDEM_LOCAL_DRAFT) off and on, ABBA (ORDER, default "none ngram ngram
#    none"): the split stack (--direct-draft, GATEWAYS default 2, PROCS default 4) at CONC (default 1,8), TEMPS (default
#    0,0.7), NUM prompts a load (default: bench-serve's); TESTS=1 first: its GPU test
#    (tests/gpu/test_gpu_shipped_default.py -k local_one).
# AM: the co-located stack against the split one (SERVERS) where both decode plainly: CONC (default 8), TEMPS (default
#    0.7), NUM (default 1,024) prompts, 2 gateways, 4 client processes; the verifier's engine process sampled by py-spy
#    mid-load (Python stacks with idle frames, then native ones; carry [".carry/env", ".whl"]).
# AV: engine settings A/B served: the co-located stack with the defaults (A) and with ENV_B set (B, e.g.
#    "TANDEM_SPEC_MAX_BATCH=64 TANDEM_SPEC_ROUNDS=2 TANDEM_ADMIT_GROUP=8"), CONC (default 16,64), greedy, NUM (default
#    384) prompts, after a warm-up load, A B B A.
source "$(dirname "$0")/env.sh"
name=${NAME:-h100}-${TANDEM_COMMIT:-dev}
mid_run() {  # log: wait until a c 64 measurement has run 3 s
  for _ in $(seq 900); do grep -q "measuring tandem-colocated at concurrency 64" "$1" 2>/dev/null && break; sleep 0.3
  done; sleep 3; }
show() {  # results.json tag: each row's load, throughput and where its requests' time went (AF, AI)
  python3 - "$1" "$2" <<'PY'
import json, sys
keys = ("server", "concurrency", "temperature", "tokens_per_s", "served_vs_in_process", "acceptance_length",
        "ttft_ms_mean", "itl_ms_mean",
        "latency_ms_mean", "batch_mean", "rows_per_round", "engine_ms.queued", "engine_ms.first", "engine_ms.life",
        "serve_rounds.run")
for r in json.load(open(sys.argv[1])):
    row = {k: r[k] for k in keys if k in r}
    if r.get("latency_ms_mean"):  # requests in flight on average (Little's law)
        row["in_flight"] = round(r["requests_per_s"] * r["latency_ms_mean"] / 1e3, 1)
    print(sys.argv[2], row)
PY
}
spy() {  # pid out-name flags...: 3 s of py-spy's raw stacks into $OUT/pyspy-<out-name>.txt
  local pid=$1 out=$2; shift 2
  py-spy record -d 3 -f raw -o "$OUT/pyspy-$out.txt" --pid "$pid" "$@" >> "$OUT/spy.log" 2>&1; }
case "${PART:-A}" in
  A)
    timeout 570 python3 -m cli.main bench-serve --name "$name-served" --servers tandem-colocated,tandem-split \
      --concurrency 1,8,64 --temperatures 0,0.7 --max-tokens 128 --client-processes 4 --in-process \
      --attention torch --device cuda --out-dir "$OUT" > "$OUT/$name-served.log" 2>&1
    grep -E '^\{' "$OUT/$name-served.log" | cut -c1-200; echo "served done at $SECONDS s" ;;
  B)
    export TANDEM_ATTENTION=torch  # the services' prompts: no flashinfer JIT on a fresh machine
    python3 -m pip install -q --no-index --no-deps --target /tmp/spy .whl/py_spy-*.whl && export PATH=/tmp/spy/bin:$PATH
    (for i in $(seq 1 60); do sleep 3
       for p in $(pgrep -f 'cli.main (verifier|gateway)'); do
         echo "== t=$((i * 3)) s pid $p: $(tr '\0' ' ' < /proc/$p/cmdline | cut -c1-80)"; py-spy dump --pid "$p" 2>&1
       done; done) > "$OUT/pyspy.txt" 2>&1 &
    spy=$!
    timeout 150 python3 -m cli.main bench-serve --name "$name-colocated-c64" --servers tandem-colocated \
      --concurrency 64 --max-tokens 128 --client-processes 4 --attention torch --device cuda --out-dir "$OUT" \
      > "$OUT/$name-colocated-c64.log" 2>&1
    grep -E '^\{' "$OUT/$name-colocated-c64.log" | cut -c1-200; echo "co-located done at $SECONDS s"
    timeout 330 python3 -m cli.main bench-services --name "$name-split-bs8" --draft ngram --k 4 --batch-sizes 8 \
      --max-tokens 128 --waves 2 --device cuda --out-dir "$OUT" > "$OUT/$name-split-bs8.log" 2>&1
    kill $spy; grep -E '^\{' "$OUT/$name-split-bs8.log" | cut -c1-200; echo "split done at $SECONDS s" ;;
  D)
    timeout 590 python3 -m cli.main bench-serve --name "$name-served-direct" \
      --servers tandem-colocated,tandem-split-direct,tandem-split --concurrency 1,8,64 --temperatures ${TEMPS:-0} \
      --max-tokens 128 --client-processes 4 --in-process --attention torch --device cuda --out-dir "$OUT" \
      > "$OUT/$name-served-direct.log" 2>&1
    grep -E '^\{' "$OUT/$name-served-direct.log" | cut -c1-220; echo "served done at $SECONDS s" ;;
  I)
    timeout 590 python3 -m cli.main bench-serve --name "$name-served-2gpu" \
      --servers tandem-colocated,tandem-split-direct --drafter-device cuda:1 --concurrency 1,8,64 --temperatures 0 \
      ${GATEWAYS:+--gateways $GATEWAYS} \
      --max-tokens 128 --client-processes 4 --in-process --attention torch --device cuda:0 --out-dir "$OUT" \
      > "$OUT/$name-served-2gpu.log" 2>&1
    grep -E '^\{' "$OUT/$name-served-2gpu.log" | cut -c1-220; nvidia-smi --query-gpu=index,name --format=csv,noheader
    echo "done at $SECONDS s" ;;
  E)
    TANDEM_SPEC_MAX_BATCH=none timeout 330 python3 -m cli.main bench-serve --name "$name-served-spec" \
      --servers tandem-colocated,tandem-split-direct --concurrency 8,64 --temperatures 0 \
      --max-tokens 128 --client-processes 4 --in-process --attention torch --device cuda --out-dir "$OUT" \
      > "$OUT/$name-served-spec.log" 2>&1
    grep -E '^\{' "$OUT/$name-served-spec.log" | cut -c1-220; echo "forced speculation done at $SECONDS s"
    timeout 150 python3 -m cli.main bench-serve --name "$name-served-t07" \
      --servers tandem-colocated,tandem-split-direct --concurrency 1 --temperatures 0.7 \
      --max-tokens 128 --client-processes 1 --in-process --attention torch --device cuda --out-dir "$OUT" \
      > "$OUT/$name-served-t07.log" 2>&1
    grep -E '^\{' "$OUT/$name-served-t07.log" | cut -c1-220; echo "T 0.7 done at $SECONDS s"
    timeout 100 python3 -m pytest -q -x tests/gpu/test_gpu_graphs.py -k "padded or speculative_with_graphs" 2>&1 \
      | tail -5 ;;
  F)
    for d in auto ngram; do
      TANDEM_ATTENTION=torch TANDEM_SPEC_MAX_BATCH=none timeout 280 python3 -m cli.main bench-services --name "$name-direct-$d" --draft $d \
        --modes colocated,split-direct --batch-sizes 1,8 --max-tokens 128 --waves 2 --device cuda --out-dir "$OUT" \
        > "$OUT/$name-direct-$d.log" 2>&1
      grep -E '^\{' "$OUT/$name-direct-$d.log" | cut -c1-220; echo "$d done at $SECONDS s"
    done ;;
  G)
    mkdir -p /tmp/gil && echo 'import sys; sys.setswitchinterval(0.0005)' > /tmp/gil/sitecustomize.py
    for variant in default gil; do
      for d in auto ngram; do
        pp=$PYTHONPATH; [ $variant = gil ] && pp=/tmp/gil:$PYTHONPATH
        PYTHONPATH=$pp TANDEM_ATTENTION=torch TANDEM_SPEC_MAX_BATCH=none timeout 140 python3 -m cli.main bench-services \
          --name "$name-direct-$d-$variant" --draft $d --modes split-direct --batch-sizes 1,8 --max-tokens 128 \
          --waves 2 --device cuda --out-dir "$OUT" > "$OUT/$name-direct-$d-$variant.log" 2>&1
        grep -E '^\{' "$OUT/$name-direct-$d-$variant.log" | cut -c1-220; echo "$d $variant done at $SECONDS s"
      done
    done ;;
  H)
    python3 -m pip install -q --no-index --no-deps --target /tmp/spy .whl/py_spy-*.whl && export PATH=/tmp/spy/bin:$PATH
    (until pgrep -f 'cli.main drafter' >/dev/null && pgrep -f 'cli.main verifier' >/dev/null; do sleep 1; done
     sleep ${SPY_AFTER:-50}
     for svc in verifier drafter; do
       py-spy record -r 500 -d 20 -f raw -o "$OUT/pyspy-$svc.txt" --pid "$(pgrep -f "cli.main $svc" | head -1)" \
         > /dev/null 2>&1 &
     done; wait) &
    timeout 200 python3 -m cli.main bench-serve --name "$name-served-t07-spy" --servers tandem-split-direct \
      --concurrency 1 --temperatures 0.7 --num-prompts 64 --max-tokens 128 --client-processes 1 --attention torch \
      --device cuda --out-dir "$OUT" > "$OUT/$name-spy.log" 2>&1
    wait; grep -E '^\{' "$OUT/$name-spy.log" | cut -c1-220; wc -l "$OUT"/pyspy-*.txt ;;
  J)
    timeout 300 python3 -m cli.main bench-serve --name "$name-served-counters" --servers tandem-colocated \
      --concurrency 8,64 --temperatures 0,0.7 --max-tokens 128 --client-processes 4 --in-process --attention torch \
      --device cuda --out-dir "$OUT" > "$OUT/$name-served-counters.log" 2>&1
    grep -E '^\{' "$OUT/$name-served-counters.log" | cut -c1-400; echo "counters done at $SECONDS s"
    python3 -m pip install -q --no-index --no-deps --target /tmp/spy .whl/py_spy-*.whl && export PATH=/tmp/spy/bin:$PATH
    log="$OUT/$name-spy64.log"
    (for _ in $(seq 600); do grep -q "measuring tandem-colocated at concurrency 64" "$log" 2>/dev/null && break; sleep 0.3; done; sleep 1
     for svc in verifier gateway; do
       py-spy record -r 250 -d 6 --threads --idle --nonblocking -f raw -o "$OUT/pyspy64-$svc.txt" \
         --pid "$(pgrep -f "cli.main $svc" | head -1)" > /dev/null 2>&1 &
     done; wait) &
    timeout 240 python3 -m cli.main bench-serve --name "$name-spy64" --servers tandem-colocated --concurrency 64 \
      --num-prompts 1024 --max-tokens 128 --client-processes 4 --attention torch --device cuda --out-dir "$OUT" \
      > "$log" 2>&1
    wait; grep -E '^\{' "$log" | cut -c1-400; wc -l "$OUT"/pyspy64-*.txt ;;
  K)
    mkdir -p /tmp/gil && echo 'import sys; sys.setswitchinterval(0.0005)' > /tmp/gil/sitecustomize.py
    for variant in default gil; do
      pp=$PYTHONPATH; inproc=--in-process
      [ $variant = gil ] && pp=/tmp/gil:$PYTHONPATH && inproc=
      PYTHONPATH=$pp timeout 250 python3 -m cli.main bench-serve --name "$name-c64-$variant" --servers tandem-colocated \
        --concurrency ${CONC:-64} --num-prompts 512 --max-tokens 128 --client-processes 4 $inproc --attention torch \
        --device cuda --out-dir "$OUT" > "$OUT/$name-c64-$variant.log" 2>&1
      grep -E '^\{' "$OUT/$name-c64-$variant.log" | cut -c1-500; echo "$variant done at $SECONDS s"
    done ;;
  L)
    for tree in . ${BASE:-}; do
      tag=$([ "$tree" = . ] && echo "$name-served" || echo "$name-served-base")
      (cd "$tree" && timeout 280 python3 -m cli.main bench-serve --name "$tag" --servers tandem-colocated \
        --concurrency ${CONC:-1,8,64} --temperatures ${TEMPS:-0} --max-tokens 128 --client-processes 4 --in-process \
        --attention torch --device cuda --out-dir "$OUT" > "$OUT/$tag.log" 2>&1)
      grep -E '^\{' "$OUT/$tag.log" | cut -c1-500; echo "$tag done at $SECONDS s"
    done ;;
  M)
    timeout 250 python3 -m cli.main bench-serve --name "$name-clients" --servers tandem-colocated --concurrency 8,64 \
      --temperatures 0 --max-tokens 128 --client-processes ${PROCS:-4,8} --in-process --attention torch --device cuda \
      --out-dir "$OUT" > "$OUT/$name-clients.log" 2>&1
    grep -E '^\{' "$OUT/$name-clients.log" | cut -c1-500; echo "clients done at $SECONDS s"
    if [ -n "${BASE:-}" ]; then
      (cd "$BASE" && timeout 200 python3 -m cli.main bench-serve --name "$name-clients-base" --servers tandem-colocated \
        --concurrency 64 --temperatures 0 --max-tokens 128 --client-processes ${BASE_PROCS:-16} --attention torch \
        --device cuda --out-dir "$OUT" > "$OUT/$name-clients-base.log" 2>&1)
      grep -E '^\{' "$OUT/$name-clients-base.log" | cut -c1-500; echo "base done at $SECONDS s"
    fi ;;
  N)
    python3 -m pip install -q --no-index --no-deps --target /tmp/spy .whl/py_spy-*.whl && export PATH=/tmp/spy/bin:$PATH
    timeout 150 py-spy record -r 250 --nonblocking -f raw -o "$OUT/pyspy-inproc.txt" -- python3 -m cli.main bench \
      --name "$name-inproc64" --dataset humaneval --num-prompts 1024 --batch-sizes 64 --drafts auto --baselines none \
      --temperatures 0 --attention torch --device cuda --out-dir "$OUT" > "$OUT/$name-inproc64.log" 2>&1
    grep -E '^\|' "$OUT/$name-inproc64.md" | cut -d'|' -f2-12; echo "in-process done at $SECONDS s"
    for rep in 1 2; do
      for tree in "$BASE" .; do
        tag=$([ "$tree" = . ] && echo "$name-ab$rep" || echo "$name-ab$rep-base"); log="$OUT/$tag.log"
        if [ $rep = 2 ] && [ "$tree" = . ]; then
          (for _ in $(seq 600); do grep -q "measuring tandem-colocated at concurrency 64" "$log" 2>/dev/null && break
             sleep 0.3; done; sleep 4.1
           py-spy record -r 250 -d 2 --nonblocking -f raw -o "$OUT/pyspy-served64.txt" \
             --pid "$(pgrep -f "cli.main verifier" | head -1)" > /dev/null 2>&1) &
        fi
        (cd "$tree" && timeout 150 python3 -m cli.main bench-serve --name "$tag" --servers tandem-colocated \
          --concurrency 8,64 --temperatures 0 --max-tokens 128 --client-processes 4 --attention torch --device cuda \
          --out-dir "$OUT" > "$log" 2>&1)
        grep -E '^\{' "$log" | cut -c1-400; echo "$tag done at $SECONDS s"
      done
    done; wait ;;
  O)
    for tree in "$BASE" .; do
      tag=$([ "$tree" = . ] && echo "$name-ab" || echo "$name-ab-base")
      (cd "$tree" && timeout 280 python3 -m cli.main bench-serve --name "$tag" --servers tandem-colocated \
        --concurrency 8,64 --temperatures 0 --num-prompts ${NUM:-512} --max-tokens 128 --client-processes 4 \
        --in-process --attention torch --device cuda --out-dir "$OUT" > "$OUT/$tag.log" 2>&1)
      grep -E '^\{' "$OUT/$tag.log" | cut -c1-420; echo "$tag done at $SECONDS s"
    done ;;
  S)
    mkdir -p /tmp/gil && echo 'import sys; sys.setswitchinterval(0.0005)' > /tmp/gil/sitecustomize.py
    for variant in default gil gil default; do
      pp=$PYTHONPATH; [ $variant = gil ] && pp=/tmp/gil:$PYTHONPATH
      tag="$name-switch-$variant-$SECONDS"
      PYTHONPATH=$pp timeout 140 python3 -m cli.main bench-serve --name "$tag" --servers tandem-colocated --gateways 2 \
        --concurrency 64 --temperatures 0 --num-prompts 512 --max-tokens 128 --client-processes 4 --attention torch \
        --device cuda --out-dir "$OUT" > "$OUT/$tag.log" 2>&1
      echo "$variant: $(grep -E '^\{' "$OUT/$tag.log" | cut -c1-120)"
    done; rm -f "$OUT"/*.md "$OUT"/*.png ;;
  U)
    python3 -m pip install -q --no-index --no-deps --target /tmp/spy .whl/py_spy-*.whl && export PATH=/tmp/spy/bin:$PATH
    timeout 150 python3 -m cli.main bench --name "$name-inproc64" --dataset humaneval --num-prompts 512 --batch-sizes 64 \
      --drafts none --baselines none --temperatures 0 --admission waves,continuous --attention torch --device cuda \
      --out-dir "$OUT" > "$OUT/$name-inproc64.log" 2>&1
    grep -E '^\|' "$OUT/$name-inproc64.md" | cut -d'|' -f2-12; echo "in-process done at $SECONDS s"
    log="$OUT/$name-gil64.log"
    (mid_run "$log"; pid=$(pgrep -f "cli.main verifier" | head -1)
     spy "$pid" gil -r 250 --gil --nonblocking; spy "$pid" threads -r 250 --threads --idle --nonblocking
     spy "$pid" native -r 100 --threads --idle --native) &
    timeout 300 python3 -m cli.main bench-serve --name "$name-gil64" --servers tandem-colocated --gateways 2 \
      --concurrency 64 --num-prompts 2048 --max-tokens 128 --client-processes 4 --attention torch --device cuda \
      --out-dir "$OUT" > "$log" 2>&1
    wait; grep -E '^\{' "$log" | cut -c1-400; rm -f "$OUT"/*.md "$OUT"/*.png; wc -l "$OUT"/pyspy-*.txt ;;
  AC)
    python3 -m pip install -q --no-index --no-deps --target /tmp/spy .whl/py_spy-*.whl && export PATH=/tmp/spy/bin:$PATH
    log="$OUT/$name-engine64.log"
    (mid_run "$log"; pid=$(pgrep -f "cli.main verifier" | head -1); eng=$(pgrep -P "$pid" -f spawn_main | head -1)
     echo "verifier $pid engine $eng" > "$OUT/pids.txt"
     spy "$eng" engine -r 250 --threads --idle --nonblocking; spy "$pid" grpc -r 250 --threads --idle --nonblocking
     spy "$eng" engine-native -r 100 --threads --idle --native) &
    timeout 300 python3 -m cli.main bench-serve --name "$name-engine64" --servers tandem-colocated --gateways 2 \
      --concurrency 64 --num-prompts 3072 --max-tokens 128 --client-processes 4 --attention torch --device cuda \
      --out-dir "$OUT" > "$log" 2>&1
    wait; grep -E '^\{' "$log" | cut -c1-400; rm -f "$OUT"/*.md "$OUT"/*.png; wc -l "$OUT"/pyspy-*.txt ;;
  AD)
    for st in ${STEPS:-1 2 4 2 1}; do
      TANDEM_PLAIN_STEPS=$st timeout 300 python3 -m cli.main bench-serve --name "$name-steps$st-$SECONDS" \
        --servers tandem-colocated --gateways 2 --concurrency 8,64 --temperatures ${TEMPS:-0} \
        --num-prompts ${NUM:-512} --max-tokens 128 --client-processes 4 --in-process --attention torch \
        --device cuda --out-dir "$OUT" > "$OUT/steps$st.log" 2>&1
      echo "steps $st:"; grep -E '^\{' "$OUT/steps$st.log" | cut -c1-260
    done; rm -f "$OUT"/*.md "$OUT"/*.png ;;
  AF)
    timeout 400 python3 -m cli.main bench-serve --name "$name-lives" --servers tandem-colocated \
      --gateways ${GATEWAYS:-2} --concurrency 8,64 --temperatures ${TEMPS:-0} --num-prompts ${NUM:-1024} \
      --max-tokens 128 --client-processes 4 --in-process --attention torch --device cuda --out-dir "$OUT" \
      > "$OUT/$name-lives.log" 2>&1
    show "$OUT/$name-lives.json" lives; rm -f "$OUT"/*.png ;;
  AG)
    if [ -n "$PREFILL" ]; then
      TANDEM_ATTENTION=torch timeout 200 python3 bench/device/prefill_probe.py > "$OUT/$name-prefill.log" 2>&1
      grep -vE 'Warning|warn' "$OUT/$name-prefill.log" | tail -40; echo "prefill done at $SECONDS s"
    fi
    for c in ${CONC:-8 64}; do
      TANDEM_ATTENTION=torch timeout 250 python3 bench/device/serve_probe.py --concurrency $c \
        --num-prompts ${NUM:-512} --modes ${MODES:-step,parts} > "$OUT/$name-parts$c.log" 2>&1
      grep -E '^\{' "$OUT/$name-parts$c.log"; echo "c $c done at $SECONDS s"
    done ;;
  AH)
    for t in base new new base; do
      tree=$([ $t = base ] && echo "$BASE" || echo .)
      pre="$OUT/prefill-$t-$SECONDS.log" stag="$OUT/stagger-$t-$SECONDS.log"
      (cd "$tree" && TANDEM_ATTENTION=torch timeout 120 python3 bench/device/prefill_probe.py --reps 50 \
        > "$pre" 2>&1 && TANDEM_ATTENTION=torch timeout 150 python3 \
        bench/device/serve_probe.py --concurrency 8 --num-prompts ${NUM:-384} --modes stagger > "$stag" 2>&1)
      echo "$t: $(grep -hE '^\{"prompts"|^\{"mode"' "$pre" "$stag" | tr '\n' ' ')"
    done ;;
  AI)
    for t in ${ORDER:-base new}; do
      tree=$([ $t = base ] && echo "$BASE" || echo .)
      tag="$name-ab-$t-$SECONDS"
      (cd "$tree" && timeout 280 python3 -m cli.main bench-serve --name "$tag" --servers tandem-colocated \
        --gateways ${GATEWAYS:-2} --concurrency 8,64 --temperatures ${TEMPS:-0} --num-prompts ${NUM:-1024} \
        --max-tokens 128 --client-processes 4 --in-process --attention torch --device cuda --out-dir "$OUT" \
        > "$OUT/$tag.log" 2>&1)
      show "$OUT/$tag.json" "$t"
      echo "$t done at $SECONDS s"
    done; rm -f "$OUT"/*.md "$OUT"/*.png ;;
  AK)
    for m in ${SPEC:-3 8}; do
      tag="$name-spec$m-$SECONDS"
      TANDEM_SPEC_MAX_BATCH=$m timeout 250 python3 -m cli.main bench-serve --name "$tag" --servers tandem-colocated \
        --draft ${DRAFT:-auto} --dataset ${DATASET:-humaneval} \
        --gateways ${GATEWAYS:-2} --concurrency ${CONC:-8} --temperatures ${TEMPS:-0,0.7} --num-prompts ${NUM:-512} \
        --max-tokens 128 --client-processes 4 --attention torch --device cuda --out-dir "$OUT" > "$OUT/$tag.log" 2>&1
      show "$OUT/$tag.json" "spec-max-batch $m"; echo "$m done at $SECONDS s"
    done; rm -f "$OUT"/*.md "$OUT"/*.png ;;
  AJ)
    for t in ${ORDER:-base new new base}; do
      tree=$([ $t = base ] && echo "$BASE" || echo .)
      tag="$name-split-$t-$SECONDS"
      (cd "$tree" && timeout 200 python3 -m cli.main bench-serve --name "$tag" \
        --servers tandem-colocated,tandem-split-direct --concurrency ${CONC:-1} --temperatures ${TEMPS:-0,0.7} \
        --max-tokens 128 --client-processes ${PROCS:-1} --attention torch --device cuda --out-dir "$OUT" \
        > "$OUT/$tag.log" 2>&1)
      show "$OUT/$tag.json" "$t"; echo "$t done at $SECONDS s"
    done; rm -f "$OUT"/*.md "$OUT"/*.png ;;
  AL)
    for t in ${ORDER:-base new}; do
      tree=$([ $t = base ] && echo "$BASE" || echo .)
      tag="$name-splitonly-$t-$SECONDS"
      (cd "$tree" && timeout 200 python3 -m cli.main bench-serve --name "$tag" --servers tandem-split-direct \
        --gateways ${GATEWAYS:-2} --concurrency ${CONC:-1,8} --temperatures ${TEMPS:-0} --max-tokens 128 \
        --client-processes ${PROCS:-4} --attention torch --device cuda --out-dir "$OUT" > "$OUT/$tag.log" 2>&1)
      show "$OUT/$tag.json" "$t"; echo "$t done at $SECONDS s"
    done; rm -f "$OUT"/*.md "$OUT"/*.png ;;
  AN)
    if [ -n "${TESTS:-}" ]; then
      timeout 300 python3 -m pytest -q tests/gpu/test_gpu_fused_sampling.py -p no:cacheprovider \
        > "$OUT/$name-sampling-tests.log" 2>&1; tail -3 "$OUT/$name-sampling-tests.log"; echo "tests done at $SECONDS s"
    fi
    for t in ${ORDER:-base new new base}; do
      tree=$([ $t = base ] && echo "$BASE" || echo .)
      tag="$name-colo-$t-$SECONDS"
      (cd "$tree" && timeout 200 python3 -m cli.main bench-serve --name "$tag" --servers tandem-colocated \
        --gateways ${GATEWAYS:-2} --concurrency ${CONC:-1,8} --temperatures ${TEMPS:-0,0.7} --max-tokens 128 \
        --client-processes ${PROCS:-4} --in-process --attention torch --device cuda --out-dir "$OUT" \
        > "$OUT/$tag.log" 2>&1)
      show "$OUT/$tag.json" "$t"; echo "$t done at $SECONDS s"
    done; rm -f "$OUT"/*.md "$OUT"/*.png ;;
  AO)
    if [ -n "${TESTS:-}" ]; then
      timeout 200 python3 -m pytest -q tests/gpu/test_gpu_shipped_default.py -k "local_one or outside_the_graph" \
        -p no:cacheprovider > "$OUT/$name-local-tests.log" 2>&1; tail -3 "$OUT/$name-local-tests.log"
    fi
    for d in ${ORDER:-none ngram ngram none}; do
      tag="$name-local-$d-$SECONDS"
      TANDEM_LOCAL_DRAFT=$d timeout 200 python3 -m cli.main bench-serve --name "$tag" --servers tandem-split-direct \
        --gateways ${GATEWAYS:-2} --concurrency ${CONC:-1,8} --temperatures ${TEMPS:-0,0.7} --max-tokens 128 \
        ${NUM:+--num-prompts $NUM} --client-processes ${PROCS:-4} --attention torch --device cuda --out-dir "$OUT" \
        > "$OUT/$tag.log" 2>&1
      show "$OUT/$tag.json" "local $d"; echo "$d done at $SECONDS s"
    done; rm -f "$OUT"/*.md "$OUT"/*.png ;;
  AM)
    python3 -m pip install -q --no-index --no-deps --target /tmp/spy .whl/py_spy-*.whl && export PATH=/tmp/spy/bin:$PATH
    for srv in ${SERVERS:-tandem-colocated tandem-split-direct}; do
      tag="$name-plain-$srv-$SECONDS" log="$OUT/$name-plain-$srv.log"
      (for _ in $(seq 900); do grep -q "measuring $srv at concurrency" "$log" 2>/dev/null && break; sleep 0.3; done
       sleep 3; pid=$(pgrep -f "cli.main verifier" | head -1); eng=$(pgrep -P "$pid" -f spawn_main | head -1)
       spy "$eng" "$srv" -r 250 --threads --idle --nonblocking; spy "$eng" "$srv-native" -r 100 --threads --native) &
      timeout 250 python3 -m cli.main bench-serve --name "$tag" --servers $srv --gateways 2 \
        --concurrency ${CONC:-8} --temperatures ${TEMPS:-0.7} --num-prompts ${NUM:-1024} --max-tokens 128 \
        --client-processes 4 --attention torch --device cuda --out-dir "$OUT" > "$log" 2>&1
      wait; show "$OUT/$tag.json" "$srv"; echo "$srv done at $SECONDS s"
    done; rm -f "$OUT"/*.md "$OUT"/*.png; wc -l "$OUT"/pyspy-*.txt ;;
  AE)
    timeout ${LIMIT:-560} python3 -m pytest -q tests/gpu -p no:cacheprovider > "$OUT/$name-gpu-tests.log" 2>&1
    tail -15 "$OUT/$name-gpu-tests.log" ;;
  W)
    lscpu | grep -E 'Model name|^CPU\(s\)|Thread|Core|Socket|MHz'
    vcpus=$(lscpu -p=CPU,CORE | grep -v '^#' | awk -F, '$2<2{print $1}' | paste -sd,)
    rest=$(lscpu -p=CPU,CORE | grep -v '^#' | awk -F, '$2>=2{print $1}' | paste -sd,)
    echo "verifier on CPUs $vcpus; gateways and clients on $rest"
    for variant in free pinned pinned free; do
      tag="$name-cpus-$variant-$SECONDS"; pre=()
      if [ $variant = pinned ]; then
        pre=(taskset -c "$rest")
        (for _ in $(seq 900); do p=$(pgrep -f "cli.main verifier" | head -1); [ -n "$p" ] && break; sleep 0.1; done
         sleep 0.5; taskset -a -p -c "$vcpus" "$p" > /dev/null; echo "pinned verifier $p") &
      fi
      "${pre[@]}" timeout 200 python3 -m cli.main bench-serve --name "$tag" --servers tandem-colocated --gateways 2 \
        --concurrency 64 --temperatures ${TEMPS:-0} --num-prompts ${NUM:-1024} --max-tokens 128 --client-processes 4 \
        --attention torch --device cuda --out-dir "$OUT" > "$OUT/$tag.log" 2>&1
      wait; echo "$variant: $(grep -E '^\{' "$OUT/$tag.log" | cut -c1-120)"
    done; rm -f "$OUT"/*.md "$OUT"/*.png ;;
  X)
    TANDEM_ATTENTION=torch timeout 300 python3 bench/device/serve_probe.py --concurrency 64 --num-prompts ${NUM:-1024} \
      --modes step,loop,aio,aio,loop,step > "$OUT/$name-probe.log" 2>&1
    grep -E '^\{' "$OUT/$name-probe.log"; echo "probe done at $SECONDS s"
    timeout 200 python3 -m cli.main bench-serve --name "$name-probe-served" --servers tandem-colocated --gateways 2 \
      --concurrency 64 --temperatures 0 --num-prompts ${NUM:-1024} --max-tokens 128 --client-processes 4 \
      --attention torch --device cuda --out-dir "$OUT" > "$OUT/$name-probe-served.log" 2>&1
    grep -E '^\{' "$OUT/$name-probe-served.log" | cut -c1-120; rm -f "$OUT"/*.md "$OUT"/*.png ;;
  Y)
    serve() {  # tag engine_process num
      TANDEM_ENGINE_PROCESS=$2 timeout 200 python3 -m cli.main bench-serve --name "$1" --servers tandem-colocated \
        --gateways ${GATEWAYS:-2} --concurrency 8,64 --temperatures 0 --num-prompts $3 --max-tokens 128 \
        --client-processes 4 --attention torch --device cuda --out-dir "$OUT" > "$OUT/$1.log" 2>&1
      echo "engine_process=$2: $(grep -E '^\{' "$OUT/$1.log" | cut -c1-100 | tr '\n' ' ')"; }
    serve warmup true 64; rm -f "$OUT"/warmup.*
    for variant in false true true false; do serve "$name-engine-process-$variant-$SECONDS" $variant ${NUM:-512}; done
    rm -f "$OUT"/*.md "$OUT"/*.png ;;
  Z)
    tag=$name-table${NUM:+-n$NUM}${CONC:+-c$(echo "$CONC" | tr , -)}
    timeout "${TABLE_S:-590}" python3 -m cli.main bench-serve --name "$tag" --servers tandem-colocated,tandem-split-direct \
      --gateways ${GATEWAYS:-2} --concurrency "${CONC:-1,8,64}" --temperatures 0,0.7 --max-tokens 128 \
      ${NUM:+--num-prompts "$NUM"} --client-processes 4 --in-process --attention torch --device cuda --out-dir "$OUT" \
      > "$OUT/$tag.log" 2>&1
    grep -E '^\{' "$OUT/$tag.log" | cut -c1-160; rm -f "$OUT"/*.png ;;
  AB)
    probe() {  # tree tag
      (cd "$1" && TANDEM_ATTENTION=torch timeout 200 python3 bench/device/serve_probe.py --concurrency 64 \
        --num-prompts ${NUM:-1024} --modes step,step > "$OUT/$2.log" 2>&1)
      echo "$2: $(grep -E '^\{' "$OUT/$2.log" | cut -c1-130 | tr '\n' ' ')"; }
    serve() {  # tree tag
      (cd "$1" && timeout 200 python3 -m cli.main bench-serve --name "$2" --servers tandem-colocated --gateways 2 \
        --concurrency 64 --temperatures ${TEMPS:-0} --num-prompts ${NUM:-1024} --max-tokens 128 --client-processes 4 \
        --attention torch --device cuda --out-dir "$OUT" > "$OUT/$2.log" 2>&1)
      echo "$2: $(grep -E '^\{' "$OUT/$2.log" | cut -c1-100)"; }
    for t in base new new base; do
      tree=$([ $t = base ] && echo "$BASE" || echo .)
      probe "$tree" "$name-probe-$t-$SECONDS"; serve "$tree" "$name-serve-$t-$SECONDS"
    done; rm -f "$OUT"/*.md "$OUT"/*.png ;;
  R)
    timeout 560 python3 -m cli.main bench-serve --name "$name-gateways" --servers tandem-colocated \
      --gateways ${GATEWAYS:-1,2,2,1} \
      --concurrency 8,64 --temperatures 0 --num-prompts ${NUM:-512} --max-tokens 128 --client-processes 4 --in-process \
      --attention torch --device cuda --out-dir "$OUT" > "$OUT/$name-gateways.log" 2>&1
    grep -E '^\{' "$OUT/$name-gateways.log" | cut -c1-230; rm -f "$OUT"/*.png ;;
  Q)
    python3 -m pip install -q --no-index --no-deps --target /tmp/spy .whl/py_spy-*.whl && export PATH=/tmp/spy/bin:$PATH
    timeout 150 py-spy record -r 250 --threads --idle --nonblocking -f raw -o "$OUT/pyspy-inproc64.txt" -- \
      python3 -m cli.main bench --name "$name-inproc64" --dataset humaneval --num-prompts 512 --batch-sizes 64 \
      --drafts none --baselines none --temperatures 0 --attention torch --device cuda --out-dir "$OUT" \
      > "$OUT/$name-inproc64.log" 2>&1
    grep -E '^\|' "$OUT/$name-inproc64.md" | cut -d'|' -f2-12; echo "in-process done at $SECONDS s"
    log="$OUT/$name-spy64.log"
    (for _ in $(seq 600); do grep -q "measuring tandem-colocated at concurrency 64" "$log" 2>/dev/null && break; sleep 0.3; done
     sleep 3; py-spy record -r 250 -d 4 --threads --idle --nonblocking -f raw -o "$OUT/pyspy-served64.txt" \
       --pid "$(pgrep -f "cli.main verifier" | head -1)" > /dev/null 2>&1) &
    timeout 240 python3 -m cli.main bench-serve --name "$name-spy64" --servers tandem-colocated --concurrency 64 \
      --num-prompts 1024 --max-tokens 128 --client-processes 4 --attention torch --device cuda --out-dir "$OUT" \
      > "$log" 2>&1
    wait; grep -E '^\{' "$log" | cut -c1-400; rm -f "$OUT"/*.md "$OUT"/*.png; wc -l "$OUT"/pyspy-*.txt ;;
  P)
    serve() {  # tree tag [extra args]
      (cd "$1" && timeout 200 python3 -m cli.main bench-serve --name "$2" --servers tandem-colocated --concurrency 8,64 \
        --temperatures 0 --num-prompts ${NUM:-384} --max-tokens 128 --client-processes 4 --attention torch \
        --device cuda --out-dir "$OUT" ${GATEWAYS:+--gateways $GATEWAYS} > "$OUT/$2.log" 2>&1)
      grep -E '^\{' "$OUT/$2.log" | cut -c1-160; }
    inproc() {  # tree tag
      (cd "$1" && timeout ${TO:-150} python3 -m cli.main bench --name "$2" --dataset ${DATASET:-humaneval} \
        --num-prompts ${NUM:-128} --batch-sizes ${BS:-1,4,16,64} --drafts ${DRAFTS:-none,auto,ngram} --baselines none \
        --temperatures ${TEMPS:-0} \
        --spec-max-batch 64 --admission ${ADMISSION:-waves} \
        --attention torch --device cuda --out-dir "$OUT" > "$OUT/$2.log" 2>&1)
      python3 - "$OUT/$2.json" <<'PY'
import json, sys
keys = ("engine", "batch_size", "admission", "temperature", "tokens_per_s", "speedup_vs_plain", "acceptance_length",
        "rounds_ahead", "fused_rounds_run", "rows_joined", "rounds_dropped")
for r in json.load(open(sys.argv[1])):
    print(" ".join(str(r.get(k, "-")) for k in keys))
PY
    }
    run=$([ "${KIND:-serve}" = inproc ] && echo inproc || echo serve)
    if [ "$run" = serve ]; then NUM=64 serve "${NEW:-.}" warmup; else NUM=16 inproc "${NEW:-.}" warmup; fi
    rm -f "$OUT"/warmup.*; echo "warm-up done at $SECONDS s"
    for rep in $(seq ${REPS:-2}); do  # base, new, then new, base: a drift over the call cancels out
      for t in $([ $((rep % 2)) = 1 ] && echo base new || echo new base); do
        if [ $t = base ]; then $run "$BASE" "$name-$run$rep-base"; else $run "${NEW:-.}" "$name-$run$rep"; fi
        echo "$t $rep done at $SECONDS s"
      done
    done
    rm -f "$OUT"/*.md ;;  # the json rows say it all (at most 8 files come back)
  AV)
    sv() {  # tag [env]
      timeout 200 env ${2:-} python3 -m cli.main bench-serve --name "$1" --servers tandem-colocated \
        --concurrency ${CONC:-16,64} --temperatures ${TEMPS:-0} --num-prompts ${NUM:-384} --max-tokens 128 \
        --client-processes 4 --attention torch --device cuda --out-dir "$OUT" > "$OUT/$1.log" 2>&1
      grep -E '^\{' "$OUT/$1.log" | cut -c1-200; echo "$1 done at $SECONDS s"; }
    NUM=64 sv warmup; rm -f "$OUT"/warmup.*
    sv "$name-servedA1"; sv "$name-servedB1" "$ENV_B"; sv "$name-servedB2" "$ENV_B"; sv "$name-servedA2"
    rm -f "$OUT"/*.md ;;
esac
cd "$OUT" && rm -f ./*.png && tar czf "logs-${PART:-A}.tgz" ./*.log 2>/dev/null && rm -f ./*.log; ls "$OUT"
