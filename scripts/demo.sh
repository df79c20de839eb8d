#!/usr/bin/env bash
# demo.sh - what `make demo` runs after building: make the demo model if it is not there yet
# (models/tiny-demo: `deepinfer mkmodel --preset demo-v3 --mtp`, a small FP8 DeepSeek-V3-
# architecture checkpoint with random weights), then the main job: `deepinfer generate` on a
# few chat prompts (Chat Completions "messages", DeepSeek-V3 chat format) with continuous
# batching, printing each completion and the engine's summary (tokens/s, TTFT, TPOT).
# The weights are random, so the text is gibberish: the demo shows the pipeline working
# (load, chat rendering, tokenize, batched prefill + decode through the paged latent KV cache,
# sampling, detokenize), not a language model.
#
# usage: scripts/demo.sh [path/to/deepinfer] [model_dir]
# env:   DEMO_TOKENS (default 32) new tokens per prompt
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-build/bin/deepinfer}
MODEL=${2:-models/tiny-demo}
N=${DEMO_TOKENS:-32}

if [ ! -x "$BIN" ]; then
  echo "demo: $BIN not found (run 'make demo', which builds it)" >&2
  exit 1
fi
if [ ! -f "$MODEL/config.json" ]; then
  echo "demo: creating the demo model in $MODEL (deepinfer mkmodel --preset demo-v3 --mtp)" >&2
  "$BIN" mkmodel --preset demo-v3 --mtp --seed 0 --out "$MODEL"
fi

prompts=("What is the capital of France?" "Write a haiku about the sea." "def fibonacci(n):")
in=$(mktemp)
out=$(mktemp)
trap 'rm -f "$in" "$out"' EXIT
for p in "${prompts[@]}"; do
  printf '{"messages": [{"role": "user", "content": "%s"}]}\n' "$p" >> "$in"
done
echo "demo: deepinfer generate --model $MODEL --input <${#prompts[@]} chat requests> --temperature 0 --max-tokens $N" >&2
"$BIN" generate --model "$MODEL" --input "$in" --output "$out" --temperature 0 --max-tokens "$N"
i=0
while IFS= read -r line; do
  text=$(printf '%s' "$line" | sed -n 's/^{"text":"\(.*\)","token_ids".*$/\1/p')
  printf '\n>>> %s\n%b\n' "${prompts[$i]}" "$text"
  i=$((i + 1))
done < "$out"
