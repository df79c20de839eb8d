#!/usr/bin/env bash
# demo.sh - what `make demo` runs after building: make the demo model if it is not there yet
# (models/tiny-demo: `deepinfer mkmodel --preset demo-v3 --mtp`, a ~34M-parameter FP8
# DeepSeek-V3-architecture checkpoint with random weights), then generate text greedily for a
# few chat prompts with the reference forward pass (`deepinfer logits --generate`).
# The weights are random, so the text is gibberish: the demo shows the pipeline working
# (load, tokenize, prefill, decode through the latent KV cache, detokenize), not a language model.
# Until the engine lands this is the "main job"; the engine issue replaces it with `generate`.
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

BOS="<｜begin▁of▁sentence｜>"
USER="<｜User｜>"
ASSISTANT="<｜Assistant｜>"
HAVE_TOK=0
if "$BIN" tokenize --help >/dev/null 2>&1 && "$BIN" detokenize --help >/dev/null 2>&1; then HAVE_TOK=1; fi

# Fallback encoder (no tokenizer command in this build): BOS, then one byte-level token per byte.
# In DeepSeek-V3's tokenizer layout (and the one mkmodel writes) the 256 byte tokens are ids
# 3..258 in the code-point order of the GPT-2 byte alphabet.
byte_ids() {
  printf '%s' "$1" | od -An -v -tu1 | awk '
    { for (i = 1; i <= NF; i++) { b = $i
        if (b >= 33 && b <= 126) id = b - 30
        else if (b >= 161 && b <= 172) id = 97 + b - 161
        else if (b >= 174) id = 109 + b - 174
        else if (b <= 32) id = 191 + b
        else if (b <= 160) id = 191 + 33 + b - 127
        else id = 191 + 67
        printf ",%d", id } }'
}
# Fallback decoder: reads the vocabulary of tokenizer.json (as mkmodel writes it: one
# `"token": id,` per line), maps each byte-level character back to its byte and prints the
# bytes of every id; ids it cannot map (added tokens) print as <id>.
decode_ids() {
  echo "$1" | tr ',' '\n' | LC_ALL=C awk -v vocab="$MODEL/tokenizer.json" '
    function cpbyte(cp) {   # GPT-2 byte-level alphabet: code point -> byte
      if ((cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || (cp >= 174 && cp <= 255)) return cp
      return nonprint[cp - 256]
    }
    BEGIN {
      n = 0
      for (b = 0; b < 256; b++) {
        ord[sprintf("%c", b)] = b
        if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255))) nonprint[n++] = b
      }
      invocab = 0
      while ((getline line < vocab) > 0) {
        if (line ~ /"vocab": \{/) { invocab = 1; continue }
        if (invocab && line ~ /^ *\}/) break
        if (!invocab) continue
        if (!match(line, /": [0-9]+,?$/)) continue
        id = substr(line, RSTART + 3); sub(/,$/, "", id)
        key = substr(line, 1, RSTART - 1); sub(/^ *"/, "", key)
        gsub(/\\"/, "\"", key); gsub(/\\\\/, "\\", key)
        out = ""; len = length(key)
        for (i = 1; i <= len; i++) {
          c = ord[substr(key, i, 1)]
          if (c < 128) cp = c
          else if (c >= 192 && c < 224 && i < len) { cp = (c - 192) * 64 + ord[substr(key, i + 1, 1)] - 128; i++ }
          else { out = ""; break }
          out = out sprintf("%c", cpbyte(cp))
        }
        if (out != "") text[id + 0] = out
      }
    }
    /^[0-9]+$/ { if (($1 + 0) in text) printf "%s", text[$1 + 0]; else printf "<%d>", $1 }'
}

prompts=("What is the capital of France?" "Write a haiku about the sea." "def fibonacci(n):")
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
for p in "${prompts[@]}"; do
  if [ $HAVE_TOK = 1 ]; then
    ids=$(printf '%s' "$BOS$USER$p$ASSISTANT" | "$BIN" tokenize --tokenizer "$MODEL/tokenizer.json" | tr -cs '0-9' ',' | sed 's/^,//; s/,$//')
  else
    ids="0$(byte_ids "$p")"
  fi
  t0=$(date +%s.%N)
  out=$("$BIN" logits --model "$MODEL" --ids "$ids" --out "$tmp" --generate "$N")
  t1=$(date +%s.%N)
  n_prompt=$(echo "$ids" | tr ',' '\n' | grep -c .)
  n_out=$(echo "$out" | tr ',' '\n' | grep -c . || true)
  if [ $HAVE_TOK = 1 ]; then
    text=$(echo "$out" | tr ',' ' ' | "$BIN" detokenize --tokenizer "$MODEL/tokenizer.json" || decode_ids "$out")
  else
    text=$(decode_ids "$out")
  fi
  printf '\n>>> %s\n%s\n' "$p" "$text"
  awk -v a="$t0" -v b="$t1" -v np="$n_prompt" -v no="$n_out" \
    'BEGIN { printf "    [%d prompt tokens, %d generated, %.2f s, reference CPU forward pass]\n", np, no, b - a }'
done
