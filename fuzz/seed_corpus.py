#!/usr/bin/env python3
"""seed_corpus.py CORPUS_JSONL OUTDIR - writes libFuzzer seed files from the tokenizer test corpus:
each string prefixed by a selector byte (tokenizer and test, see fuzz_tokenizer.c)."""
import hashlib
import json
import os
import sys

src, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
n = 0
for i, line in enumerate(open(src, encoding="utf-8")):
    if i % 7:
        continue
    text = json.loads(line)["text"].encode("utf-8")[:2000]
    for sel in (i % 12, (i + 1) % 12):
        data = bytes([sel]) + text
        with open(os.path.join(out, hashlib.sha1(data).hexdigest()), "wb") as f:
            f.write(data)
        n += 1
print("seeded %d inputs" % n)
