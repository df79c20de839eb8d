#!/usr/bin/env bash
# Builds the input-parser libFuzzer target (clang 14 with libclang-rt-14-dev) into build-fuzz/:
#   build-fuzz/fuzz_inputs   safetensors files, config.json, `generate --input` request lines
# Run e.g.: build-fuzz/fuzz_inputs -max_total_time=60 -rss_limit_mb=4096 fuzz/corpus/inputs
# (the seed corpus: one file per parser, first byte 0 / 1 / 2; fuzz/seed_inputs.py remakes it)
set -euo pipefail
cd "$(dirname "$0")/.."
CC=${CC:-clang-14}
OUT=build-fuzz
mkdir -p "$OUT"
# the library's C sources (the request defaults come from the engine, which needs the rest);
# no CLI, no CUDA
SRCS=$(find src -name '*.c' -not -path 'src/cli/*' | sort)
FLAGS="-g -O1 -std=gnu11 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -Iinclude -Isrc"
LIBS="$(pkg-config --cflags --libs jansson libpcre2-8 libutf8proc) -lpthread -lm"
# shellcheck disable=SC2086
$CC $FLAGS fuzz/fuzz_inputs.c $SRCS $LIBS -o "$OUT/fuzz_inputs"
echo "built $OUT/fuzz_inputs"
