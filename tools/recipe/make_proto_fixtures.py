#!/usr/bin/env python3
"""make_proto_fixtures.py - fill in the reference prompts of the protocol fixtures.

Each tests/data/recipe/proto/*.json is written by hand from the public API documentation: a
request in one protocol, the equivalent Chat Completions conversation ("equivalent": messages,
tools, add_generation_prompt, thinking, continue_final_message), a model output token stream
and the expected response objects. This script renders the equivalent conversation with
jinja2 through transformers' apply_chat_template for the DeepSeek V3, R1 and V3.1 templates and
stores the prompts under "expected_prompts" ({"error": ...} where the template raises). The C
test (tests/unit/test_recipe_proto.c) converts the request with our converter, encodes it and
compares with these prompts.

Usage: python3 tools/recipe/make_proto_fixtures.py [--tokenizer DIR]
"""
import argparse
import glob
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
TEMPLATES = os.path.join(ROOT, "tests", "data", "recipe", "templates")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", default="/work/shared/data/tokenizers/deepseek-v3")
    a = ap.parse_args()
    from transformers import AutoTokenizer
    hf = AutoTokenizer.from_pretrained(a.tokenizer)
    templates = {
        "v3": open(os.path.join(TEMPLATES, "deepseek-v3.jinja"), encoding="utf-8").read(),
        "r1": open(os.path.join(TEMPLATES, "deepseek-r1.jinja"), encoding="utf-8").read(),
        "v3.1": open(os.path.join(TEMPLATES, "deepseek-v3.1.jinja"), encoding="utf-8").read(),
    }
    for path in sorted(glob.glob(os.path.join(ROOT, "tests", "data", "recipe", "proto", "*.json"))):
        fx = json.load(open(path, encoding="utf-8"))
        eq = fx["equivalent"]
        prompts = {}
        for name, tmpl in templates.items():
            kw = {"add_generation_prompt": eq.get("add_generation_prompt", False)}
            if eq.get("continue_final_message"):
                kw["continue_final_message"] = True
            if eq.get("thinking") is not None:
                kw["thinking"] = eq["thinking"]
            try:
                prompts[name] = hf.apply_chat_template(eq["messages"], tools=eq.get("tools"), chat_template=tmpl,
                                                       tokenize=False, **kw)
            except Exception as e:
                prompts[name] = {"error": "%s: %s" % (type(e).__name__, e)}
        fx["expected_prompts"] = prompts
        with open(path, "w", encoding="utf-8") as f:
            json.dump(fx, f, ensure_ascii=False, indent=1)
            f.write("\n")
        print(os.path.basename(path), {k: (v if isinstance(v, dict) else len(v)) for k, v in prompts.items()})


if __name__ == "__main__":
    main()
