#!/bin/bash
# run_device.sh - the one command of a pycoder-moe training run on the GPU machine.
# Usage (device tool, from the repository root, with this folder copied to .dev/train):
#   bash .dev/train/run_device.sh [extra train.py flags]
# Writes everything to $OUT: model-0000k-of-0000n.safetensors, bundle.tar.gz, heldout.tar.gz, log.txt.
# The hard limit (timeout) sits above train.py's own --budget-s so the script ends on its own.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
: "${OUT:?OUT must be set}"
nvidia-smi -L 2>&1 | head -4
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=true
set -o pipefail
timeout -k 10 578 python3 "$HERE/train.py" --out "$OUT" --work /tmp/pycoder_work \
    --budget-s 495 --reserve-s 75 "$@" 2>&1 | tee "$OUT/log.txt"
rc=$?
ls -la "$OUT"
exit $rc
