#!/usr/bin/env python3
"""fuzz/seed_inputs.py - writes the seed corpus of fuzz_inputs (fuzz/corpus/inputs by default):
each seed is one byte naming the parser (0 safetensors, 1 config.json, 2 request line) and then
a real input of it, taken from the repository's test data: the safetensors fixtures, the saved
Hugging Face configs and the pycoder model's config, and request lines in every field shape.

    python3 fuzz/seed_inputs.py [OUT_DIR]
"""
import glob
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "fuzz", "corpus", "inputs")

REQUESTS = [
    {"prompt": "def f(x):", "max_tokens": 16},
    {"prompt_token_ids": [1, 2, 3], "temperature": 0.7, "top_p": 0.9, "top_k": 40, "seed": 7},
    {"prompt": "a", "stop": ["\n", "end"], "stop_token_ids": [2], "n": 2, "logprobs": 3},
    {"prompt": "b", "logit_bias": {"5": -100, "9": 2.5}, "presence_penalty": 0.5,
     "frequency_penalty": 0.1, "repetition_penalty": 1.1, "min_p": 0.05, "ignore_eos": True},
    {"prompt": "c", "logprobs": True, "top_logprobs": 2, "min_tokens": 3, "id": "r1",
     "max_completion_tokens": 8, "skip_special_tokens": False, "priority": 1},
    {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "custom_id": "x"},
]


def seed(name, kind, data):
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(bytes([kind]) + data)


def main():
    os.makedirs(OUT, exist_ok=True)
    for p in sorted(glob.glob(os.path.join(ROOT, "tests", "data", "safetensors", "*.safetensors"))):
        with open(p, "rb") as f:
            data = f.read()
        if len(data) <= 64 * 1024:
            seed("st_" + os.path.basename(p), 0, data)
    configs = sorted(glob.glob(os.path.join(ROOT, "tests", "data", "config", "*.json")))
    configs.append(os.path.join(ROOT, "models", "pycoder-moe", "config.json"))
    for p in configs:
        with open(p, "rb") as f:
            seed("cfg_" + os.path.basename(os.path.dirname(p)) + "_" + os.path.basename(p), 1, f.read())
    for i, r in enumerate(REQUESTS):
        seed("req_%d.json" % i, 2, json.dumps(r).encode())
    print("seeded", len(os.listdir(OUT)), "inputs into", OUT)


if __name__ == "__main__":
    main()
