#!/usr/bin/env bash
# Builds the engine libFuzzer target (clang 14 with libclang-rt-14-dev) into build-fuzz/:
#   build-fuzz/fuzz_engine   request lines run on a tiny generated model beside a control request
# Run e.g.: build-fuzz/fuzz_engine -max_total_time=60 -rss_limit_mb=4096 -dict=fuzz/inputs.dict fuzz/corpus/engine
# (the seed corpus: fuzz/seed_engine.py remakes it)
set -euo pipefail
cd "$(dirname "$0")/.."
CC=${CC:-clang-14}
OUT=build-fuzz
mkdir -p "$OUT"
# the library's C sources (engine, model, CPU backend, tokenizer, recipe, mkmodel); no CLI, no CUDA
SRCS=$(find src -name '*.c' -not -path 'src/cli/*' | sort)
FLAGS="-g -O1 -std=gnu11 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -Iinclude -Isrc"
LIBS="$(pkg-config --cflags --libs jansson libpcre2-8 libutf8proc) -lpthread -lm"
# shellcheck disable=SC2086
$CC $FLAGS fuzz/fuzz_engine.c $SRCS $LIBS -o "$OUT/fuzz_engine"
echo "built $OUT/fuzz_engine"
