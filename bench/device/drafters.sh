#!/usr/bin/env bash
# Issue 4 in one device call, after staging (../shared/device/README.md, the GPU machine's notes beside the
# checkout, outside this repository):
#   source .carry/env/setup.sh && TANDEM_COMMIT=<sha> bash bench/device/drafters.sh
# 1) trains a 4-layer draft LM sliced from the target for $LM_S seconds on the kept corpus (the
#    target's answers to 6,000 ShareGPT prompts < 15800); 2) eval-draft on the H100 of that LM and the
#    shipped default (auto), then n-gram and layer-skip with the time left before $CALL_S: k 2,4,6,
#    T 0 and 0.7, ShareGPT >= 16000 and HumanEval, 32 prompts each, 128 new tokens.
source "$(dirname "$0")/env.sh"
tandem=(python3 -m cli.main)
"${tandem[@]}" train-draft --kind lm --layers 4 --out /root/stage/lm --time-budget "${LM_S:-200}" \
  --corpus train/data/smollm2-135m-instruct-6000.npz --val-prompts 32 --eval-every 100000 2>&1 \
  | tee "$OUT/lm.log" | tr '\r' '\n' | grep -E '^(train-draft|step|\{|  ")' | tail -12
cp /root/stage/lm/config.json "$OUT/lm-config.json"; cp /root/stage/lm/train_report.json "$OUT/lm-train_report.json"
echo "draft LM done at $SECONDS s"
grid=(--k 2,4,6 --temperature 0,0.7 --num-prompts 32 --max-tokens 128 --batch-size 32 --attention torch --device cuda)
timeout $(( ${CALL_S:-575} - SECONDS - 60 )) "${tandem[@]}" eval-draft --draft /root/stage/lm --draft auto "${grid[@]}" \
  --out "$OUT/eval-draft-h100-lm-auto.json" 2>&1 | grep -E '^\|'
echo "eval lm + auto done at $SECONDS s"
left=$(( ${CALL_S:-575} - SECONDS ))
[ "$left" -gt 20 ] && timeout "$left" "${tandem[@]}" eval-draft --draft ngram --draft layerskip:4 "${grid[@]}" \
  --out "$OUT/eval-draft-h100-ngram-layerskip.json" 2>&1 | grep -E '^\|'
echo "done in $SECONDS s"
