#!/usr/bin/env bash
# Train both drafter kinds for the default target on the GPU machine, inside one 10-minute call:
#   source .carry/env/setup.sh && bash train/device/train_drafters.sh
# The corpus (the target's own answers to ShareGPT prompts < 15800) is generated once into
# $CORPUS (about 275 s for 6000 prompts on an H100) and reused when it exists (the one the
# shipped head was trained on: CORPUS=train/data/smollm2-135m-instruct-6000.npz); the EAGLE head
# goes first (it is the default drafter), the draft LM gets the time that is left.
# RESUME=DIR continues the EAGLE head from an earlier run. REPLIES=N adds N ShareGPT replies as
# written (REPLIES_CACHE=FILE.npz caches their tokens), ANSWERS_WEIGHT=W shows the target's own
# answers W times per pass, GENERATOR=engine answers through the serving engine. LM_S=0 skips
# the draft LM. TEMPERATURES (default 0,0.7: every prompt answered at each), TURNS=all (every user
# turn with its conversation as a prompt), GEN_BATCH (512), GEN_S (a time budget for answering) and
# CORPUS=a directory (shards written block by block) shape the corpus; CORPUS_ONLY=1 stops after it
# (CORPUS_OUT=DIR: the corpus again there, in shards of 6M tokens).
# Results: $STAGE/{eagle,lm}; the small files are copied under $OUT.
set -euo pipefail
STAGE=${STAGE:-/root/stage}
CORPUS=${CORPUS:-$STAGE/corpus.npz}
export TANDEM_CACHE=${TANDEM_CACHE:-$STAGE/payload} TQDM_MININTERVAL=${TQDM_MININTERVAL:-15}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
tandem() { python3 -m cli.main "$@"; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
common=(--corpus "$CORPUS" --num-prompts "${NUM_PROMPTS:-6000}" --gen-batch-size "${GEN_BATCH:-512}"
        --temperatures "${TEMPERATURES:-0,0.7}" --turns "${TURNS:-first}" --max-prompt-tokens "${MAX_PROMPT:-384}"
        ${GEN_S:+--gen-time-budget "$GEN_S"} ${LR:+--lr "$LR"}
        --max-new-tokens 256 --generator "${GENERATOR:-dense}" --val-prompts 32 --eval-every 1000 --answers-weight "${ANSWERS_WEIGHT:-1}"
        --replies "${REPLIES:-0}" ${REPLIES_CACHE:+--replies-cache "$REPLIES_CACHE"})
show() { tee "$1" | tr '\r' '\n' | grep -E '^(step|train-draft|corpus|\{|  ")' || true; }
if [ -n "${CORPUS_ONLY:-}" ]; then
  tandem train-draft --kind eagle --out "$STAGE/eagle" --corpus-only "${common[@]}" 2>&1 | show "$OUT/corpus.log"
  # fewer, larger files to bring back (a device call returns at most 8, 16 MiB each)
  [ -z "${CORPUS_OUT:-}" ] || python3 -c "import sys; from pathlib import Path; from train import corpus
print(corpus.reshard(corpus.load(Path(sys.argv[1])), Path(sys.argv[2]), 6_000_000))" "$CORPUS" "$CORPUS_OUT"
  echo "done in $SECONDS s"; exit 0
fi
tandem train-draft --kind eagle --out "$STAGE/eagle" --time-budget "${EAGLE_S:-200}" \
  ${RESUME:+--resume "$RESUME"} "${common[@]}" 2>&1 | show "$OUT/eagle.log"
mkdir -p "$OUT/eagle" && cp "$STAGE"/eagle/* "$OUT/eagle/"
if [ -f "$CORPUS" ] && [ ! -e "$OUT/$(basename "$CORPUS")" ] && [ "$(du -b "$CORPUS" | cut -f1)" -le 16000000 ]; then
  cp "$CORPUS" "$OUT/"
fi
left=$(( ${CALL_S:-560} - SECONDS - 45 ))
echo "seconds used: $SECONDS; draft LM budget: $left"
if [ "${LM_S:-$left}" -gt 0 ] && [ "$left" -ge 60 ]; then
  tandem train-draft --kind lm --layers 4 --out "$STAGE/lm" --time-budget "${LM_S:-$left}" "${common[@]}" \
    2>&1 | show "$OUT/lm.log"
  mkdir -p "$OUT/lm" && cp "$STAGE"/lm/{config.json,train_report.json} "$OUT/lm/"
fi
echo "done in $SECONDS s"
