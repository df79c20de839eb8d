#!/usr/bin/env bash
# demo.sh - what `make demo` runs after building: `deepinfer generate` with the bundled model
# models/pycoder-moe (our own ~21M-parameter DeepSeek-V3-architecture Python code model, FP8,
# see models/pycoder-moe/MODEL_CARD.md) on a few Python-completion prompts, once greedy and once
# sampled, printing each completion and the engine's summary (tokens/s, TTFT, TPOT).
#
# usage: scripts/demo.sh [path/to/deepinfer] [model_dir]
# env:   DEMO_TOKENS (default 64) new tokens per prompt
#        DEMO_DEVICE (default cpu) cpu or cuda
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-build/bin/deepinfer}
MODEL=${2:-models/pycoder-moe}
N=${DEMO_TOKENS:-64}
DEVICE=${DEMO_DEVICE:-cpu}

if [ ! -x "$BIN" ]; then
  echo "demo: $BIN not found (run 'make demo', which builds it)" >&2
  exit 1
fi
if [ ! -f "$MODEL/config.json" ]; then
  echo "demo: no model in $MODEL" >&2
  exit 1
fi

prompts=(
  $'def fibonacci(n):\n'
  $'import os\n\n\ndef list_python_files(root):\n    """Return the paths of all .py files under root."""\n'
  $'class Stack:\n    def __init__(self):\n'
  $'def read_json(path):\n'
)
args=()
for p in "${prompts[@]}"; do args+=(--prompt "$p"); done

echo "== greedy: deepinfer generate --model $MODEL --temperature 0 --max-tokens $N (${#prompts[@]} prompts, batched)"
"$BIN" generate --model "$MODEL" --device "$DEVICE" "${args[@]}" --temperature 0 --max-tokens "$N"
echo
echo "== sampled: --temperature 0.8 --top-p 0.95 --seed 7"
"$BIN" generate --model "$MODEL" --device "$DEVICE" "${args[@]}" --temperature 0.8 --top-p 0.95 --seed 7 --max-tokens "$N"
