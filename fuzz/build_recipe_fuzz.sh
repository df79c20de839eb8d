#!/usr/bin/env bash
# Builds the recipe libFuzzer targets (clang 14 with libclang-rt-14-dev) into build-fuzz/:
#   build-fuzz/recipe_fuzz_parser   streaming output parser + stream renderers
#   build-fuzz/recipe_fuzz_convert  protocol converters + chat encoders
# Run e.g.: build-fuzz/recipe_fuzz_parser -max_total_time=60 fuzz/corpus/parser
set -euo pipefail
cd "$(dirname "$0")/.."
CC=${CC:-clang-14}
OUT=build-fuzz
mkdir -p "$OUT"
# the recipe sources minus prompt_ids.c (the only one that needs the tokenizer), and core
SRCS=$(ls src/recipe/*.c src/core/*.c | grep -v prompt_ids.c)
FLAGS="-g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -Iinclude -Isrc"
LIBS="$(pkg-config --cflags --libs jansson) -lpthread -lm"
for t in parser convert; do
  $CC $FLAGS fuzz/recipe_fuzz_$t.c $SRCS $LIBS -o "$OUT/recipe_fuzz_$t"
done
echo "built $OUT/recipe_fuzz_parser $OUT/recipe_fuzz_convert"
