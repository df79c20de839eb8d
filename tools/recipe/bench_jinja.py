#!/usr/bin/env python3
"""bench_jinja.py - baseline for bench/bench_recipe.c: render the 300 reference conversations
with jinja2 through transformers (render_jinja_template with the compiled template, i.e.
apply_chat_template(tokenize=False) minus argument handling), 20 times per template, and report
microseconds of process CPU time per conversation.

Usage: python3 tools/recipe/bench_jinja.py [--tokenizer DIR]
"""
import argparse
import json
import lzma
import os
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
T = os.path.join(ROOT, "tests", "data", "recipe", "templates")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", default="/work/shared/data/tokenizers/deepseek-v3")
    a = ap.parse_args()
    from transformers import AutoTokenizer
    from transformers.utils.chat_template_utils import render_jinja_template
    hf = AutoTokenizer.from_pretrained(a.tokenizer)
    special = hf.special_tokens_map
    path = os.path.join(ROOT, "tests", "data", "recipe", "render", "conversations.jsonl.xz")
    lines = [json.loads(x) for x in lzma.decompress(open(path, "rb").read()).decode().splitlines()]
    for name, f in [("v3", "deepseek-v3.jinja"), ("r1", "deepseek-r1.jinja"), ("v3.1", "deepseek-v3.1.jinja")]:
        tmpl = open(os.path.join(T, f), encoding="utf-8").read()
        render_jinja_template(conversations=[lines[0]["messages"]], chat_template=tmpl, **special)  # compile
        iters = 20
        t0 = time.process_time()
        for _ in range(iters):
            for line in lines:
                kw = {k: line[k] for k in ("add_generation_prompt", "thinking") if k in line}
                render_jinja_template(conversations=[line["messages"]], tools=line["tools"] or None,
                                      chat_template=tmpl, **kw, **special)
        dt = time.process_time() - t0
        print("jinja2 %-4s: %d conversations x %d: %.1f us/conversation" % (name, len(lines), iters,
                                                                          dt / (len(lines) * iters) * 1e6))


if __name__ == "__main__":
    main()
