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
# small tokenizer.json files for the JSON-loading test (selector 14: byte 0 >> 1 == 7)
SMALL = [
    {"added_tokens": [{"id": 3, "content": "<s>", "special": True, "normalized": False}],
     "normalizer": {"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Lowercase"}]},
     "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
         {"type": "Split", "pattern": {"Regex": "\\p{N}{1,3}| ?\\p{L}+|\\s+"}, "behavior": "Isolated"},
         {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}]},
     "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>"}}, {"Sequence": {"id": "A"}}],
                        "special_tokens": {"<s>": {"id": "<s>", "ids": [3]}}},
     "decoder": {"type": "ByteLevel"},
     "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]}},
    {"model": {"type": "BPE", "unk_token": "u", "fuse_unk": True, "byte_fallback": True, "ignore_merges": True,
               "continuing_subword_prefix": "##", "vocab": {"u": 0, "a": 1, "##b": 2, "a##b": 3, "ab": 4, "<0x41>": 5},
               "merges": [["a", "##b"]]},
     "pre_tokenizer": {"type": "Whitespace"}},
]
for i, d in enumerate(SMALL):
    data = bytes([14]) + json.dumps(d).encode("utf-8")
    with open(os.path.join(out, "json%d" % i), "wb") as f:
        f.write(data)
    n += 1
print("seeded %d inputs" % n)
