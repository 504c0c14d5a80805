# Sourced by the device scripts beside it: the staged cache, $OUT, a clock, the GPU's name.
set -uo pipefail
export TANDEM_CACHE=${TANDEM_CACHE:-/root/stage/payload} TQDM_MININTERVAL=${TQDM_MININTERVAL:-60}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
SECONDS=0
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
