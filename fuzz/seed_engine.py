#!/usr/bin/env python3
"""fuzz/seed_engine.py - writes the seed corpus of fuzz_engine (fuzz/corpus/engine by default):
each seed is one flags byte (bit 0: the control request queued last; bits 1-3: abort the first
fuzzed request after that many steps) and then a request line, or an array of up to three, in
the shapes `deepinfer generate --input` takes (fields of fuzz/seed_inputs.py, plus prompts long
enough to preempt the control request on the fuzzer's small KV pool).

    python3 fuzz/seed_engine.py [OUT_DIR]
"""
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "fuzz"))
from seed_inputs import REQUESTS  # noqa: E402

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "fuzz", "corpus", "engine")

EXTRA = [
    {"prompt_token_ids": list(range(3, 200)), "n": 4, "temperature": 1.2, "seed": 3},
    {"prompt": "def quicksort(a):\n    " * 20, "n": 3, "top_k": 1},
    {"prompt_token_ids": [5, 9, 14, 3, 77, 120, 8, 41], "temperature": 0, "logprobs": 20},
    {"prompt": "x", "logit_bias": {"0": 100, "1": -100}, "stop": ["a", "b", "c", "d"],
     "min_tokens": 8, "repetition_penalty": 2.0, "frequency_penalty": -2, "presence_penalty": 2},
    {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"},
                  {"role": "assistant", "content": "a"}, {"role": "user", "content": "again"}]},
]


def main():
    os.makedirs(OUT, exist_ok=True)
    reqs = REQUESTS + EXTRA
    k = 0
    for flags in (0, 1, 2 | 1, 6):
        for r in reqs:
            with open(os.path.join(OUT, "req_%02d" % k), "wb") as f:
                f.write(bytes([flags]) + json.dumps(r).encode())
            k += 1
    for i in range(0, len(reqs) - 2, 2):
        with open(os.path.join(OUT, "batch_%02d" % i), "wb") as f:
            f.write(bytes([i & 7]) + json.dumps(reqs[i:i + 3]).encode())
    print("wrote %d seeds to %s" % (k + (len(reqs) - 1) // 2, OUT))


if __name__ == "__main__":
    main()
