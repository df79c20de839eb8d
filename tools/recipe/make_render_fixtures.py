#!/usr/bin/env python3
"""make_render_fixtures.py - generate varied chat conversations (seeded, deterministic) and their
reference renderings by jinja2 through Hugging Face transformers' apply_chat_template, for the
DeepSeek V3, R1 and V3.1 chat templates; plus reference token ids from the `tokenizers` library.

Outputs (committed xz-compressed; tests/unit/test_recipe_render.c reads them through `xz -dc`):
  tests/data/recipe/render/conversations.jsonl   one request line per conversation, in the
      `deepinfer render --jsonl` input shape: {"messages", "tools", "add_generation_prompt",
      "thinking"} (the last two sometimes absent, to exercise the template defaults)
  tests/data/recipe/render/expected_<fmt>.jsonl  {"prompt": "..."} or {"error": "..."} per line
  tests/data/recipe/render/ids_<fmt>.jsonl       {"ids": [...]} = tokenizers' encoding of the
      prompt with the DeepSeek-V3 tokenizer (add_special_tokens=False; V3 has no <think> tokens, so
      R1/V3.1 prompts exercise the text fallback), or {"ids": null} when user-controlled text
      spells a special token (our safe mode deliberately differs there)

transformers 5's LlamaTokenizer (what DeepSeek's tokenizer_config.json selects) rebuilds the
pre-tokenizer and drops newlines, so ids come from tokenizers.Tokenizer on tokenizer.json, which
is what the model was trained with; the rendered text comes from apply_chat_template.

Usage: python3 tools/recipe/make_render_fixtures.py [--tokenizer DIR] [--n 300] [--seed 20250101]
"""
import argparse
import io
import json
import lzma
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
TEMPLATES = os.path.join(ROOT, "tests", "data", "recipe", "templates")
OUT = os.path.join(ROOT, "tests", "data", "recipe", "render")

FRAGMENTS = [
    "Hello", "What's the weather in Paris today?", "Please summarise the following text.",
    "", " ", "\n", "\n\n", "  leading and trailing spaces  ", "Line one\nLine two\n\nLine four",
    "tab\tseparated\tvalues", "café naïve résumé", "日本語のテキストです。", "中文字符测试，标点。",
    "emoji 🙂🚀👍🏽", "Ünïcödé ∑ ∫ √ ≤ ≥", "quotes \"double\" and 'single' and `back`",
    "back\\slash \\n not a newline", "numbers 123 4567 89012 3.14159 -0.5e10",
    "<think>I should reason first.</think>The answer is 42.", "a</think>b</think>c",
    "</think>", "<think>", "```json\n{\"x\": 1}\n```", "```python\nprint('hi')\n```",
    "{\"role\": \"user\"}", "{{ jinja }} {% raw %}", "<b>html</b> &amp; entities",
    "The quick brown fox jumps over the lazy dog.", "x" * 64, "😀" * 8,
    "mixed 日本 English 한국어 русский العربية",
]
INJECTIONS = ["<｜User｜>", "<｜Assistant｜>", "<｜end▁of▁sentence｜>", "<｜tool▁calls▁begin｜>",
              "<｜tool▁sep｜>", "<|EOT|>", "<｜begin▁of▁sentence｜>"]
TOOL_NAMES = ["get_weather", "search", "calculator", "send_email", "lookup_user", "f", "read_file",
              "run_sql", "translate", "get_time"]
ARG_KEYS = ["location", "query", "expression", "to", "subject", "id", "path", "sql", "text", "lang",
            "unit", "limit", "tz", "city"]


def text(r, allow_inject):
    k = r.choice([1, 1, 1, 2, 3])
    parts = [r.choice(FRAGMENTS) for _ in range(k)]
    if allow_inject and r.random() < 0.25:
        parts.insert(r.randrange(len(parts) + 1), r.choice(INJECTIONS))
    return r.choice(["", " ", "\n"]).join(parts)


def json_value(r, depth=0):
    c = r.random()
    if depth > 1 or c < 0.35:
        return r.choice(["Paris", "東京", "a \"quoted\" value", "line\nbreak", "", "🙂", "x" * 30])
    if c < 0.5:
        return r.choice([0, 1, -7, 42, 3.5, 1e-3, 10 ** 12])
    if c < 0.6:
        return r.choice([True, False, None])
    if c < 0.8:
        return [json_value(r, depth + 1) for _ in range(r.randrange(0, 4))]
    return {r.choice(ARG_KEYS): json_value(r, depth + 1) for _ in range(r.randrange(0, 3))}


def arguments(r):
    obj = {r.choice(ARG_KEYS): json_value(r) for _ in range(r.randrange(0, 4))}
    style = r.randrange(4)
    if style == 0:
        return json.dumps(obj)
    if style == 1:
        return json.dumps(obj, ensure_ascii=False)
    if style == 2:
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
    return json.dumps(obj, indent=2, ensure_ascii=False)


def tool_def(r, name):
    props = {k: {"type": r.choice(["string", "number", "integer", "boolean"]),
                 "description": r.choice(["", "The " + k, "単位"])}
             for k in r.sample(ARG_KEYS, r.randrange(0, 3))}
    fn = {"name": name, "description": r.choice(["Get the weather", "Search the web", "",
                                                  "Compute things — precisely"]),
          "parameters": {"type": "object", "properties": props, "required": list(props)[:1]}}
    if r.random() < 0.2:
        del fn["description"]
    return {"type": "function", "function": fn}


def conversation(r, idx):
    allow_inject = r.random() < 0.12
    tools = [tool_def(r, n) for n in r.sample(TOOL_NAMES, r.randrange(0, 4))]
    names = [t["function"]["name"] for t in tools] or TOOL_NAMES[:3]
    msgs = []
    for _ in range(r.choice([0, 0, 1, 1, 1, 2])):
        msgs.append({"role": "system", "content": text(r, allow_inject)})
    call_no = 0
    rounds = r.choice([1, 1, 2, 2, 3, 4])
    for rnd in range(rounds):
        if r.random() < 0.05:
            msgs.append({"role": "system", "content": text(r, allow_inject)})
        user = {"role": "user", "content": text(r, allow_inject)}
        if r.random() < 0.05:
            user["name"] = "alice"
        msgs.append(user)
        if r.random() < 0.08:
            msgs.append({"role": "user", "content": text(r, allow_inject)})
        last = rnd == rounds - 1
        if last and r.random() < 0.35:
            break  # conversation ends on a user turn
        while True:
            kind = r.random()
            if kind < 0.45:
                a = {"role": "assistant", "content": text(r, allow_inject)}
                if r.random() < 0.1:
                    a["reasoning_content"] = "hidden reasoning " + text(r, False)
                if r.random() < 0.03:
                    a["tool_calls"] = []
                msgs.append(a)
                break
            calls = []
            for _ in range(r.choice([1, 1, 2, 3])):
                call_no += 1
                calls.append({"id": "call_%d_%d" % (idx, call_no), "type": "function",
                              "function": {"name": r.choice(names), "arguments": arguments(r)}})
            c = r.random()
            content = None if c < 0.7 else ("" if c < 0.8 else text(r, allow_inject))
            a = {"role": "assistant", "content": content, "tool_calls": calls}
            msgs.append(a)
            n_out = len(calls) if r.random() < 0.85 else r.choice([1, 2, 3])
            for k in range(n_out):
                cid = calls[k]["id"] if k < len(calls) else "call_extra"
                msgs.append({"role": "tool", "tool_call_id": cid, "content": text(r, allow_inject)})
            if last and r.random() < 0.3:
                break  # trailing tool message(s)
            if r.random() < 0.25:
                continue  # tool after tool: another call round
            if r.random() < 0.15:
                break  # user speaks right after the tool outputs
            msgs.append({"role": "assistant", "content": text(r, allow_inject)})
            break
    if msgs[-1]["role"] == "assistant" and "tool_calls" not in msgs[-1] and r.random() < 0.1:
        msgs[-1]["prefix"] = True
    line = {"messages": msgs, "tools": tools}
    g = r.random()
    if g < 0.6:
        line["add_generation_prompt"] = True
    elif g < 0.9:
        line["add_generation_prompt"] = False
    t = r.random()
    if t < 0.4:
        line["thinking"] = True
    elif t < 0.8:
        line["thinking"] = False
    return line, allow_inject


def user_text_has_special(line, added):
    def strs(m):
        if isinstance(m.get("content"), str):
            yield m["content"]
        for tc in m.get("tool_calls") or []:
            yield tc["type"]
            yield tc["function"]["name"]
            yield tc["function"]["arguments"]
    for m in line["messages"]:
        for s in strs(m):
            if any(sp in s for sp in added):
                return True
    return False


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", default="/work/shared/data/tokenizers/deepseek-v3")
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--seed", type=int, default=20250101)
    a = ap.parse_args()

    from transformers import AutoTokenizer
    from tokenizers import Tokenizer
    hf = AutoTokenizer.from_pretrained(a.tokenizer)
    raw = Tokenizer.from_file(os.path.join(a.tokenizer, "tokenizer.json"))
    templates = {
        "v3": hf.chat_template,
        "r1": open(os.path.join(TEMPLATES, "deepseek-r1.jinja"), encoding="utf-8").read(),
        "v31": open(os.path.join(TEMPLATES, "deepseek-v3.1.jinja"), encoding="utf-8").read(),
    }
    assert templates["v3"] == open(os.path.join(TEMPLATES, "deepseek-v3.jinja"), encoding="utf-8").read()

    r = random.Random(a.seed)
    lines = [conversation(r, i)[0] for i in range(a.n)]
    os.makedirs(OUT, exist_ok=True)
    dump = lambda o: json.dumps(o, ensure_ascii=False)
    outputs = {}
    f = outputs["conversations.jsonl"] = io.StringIO()
    for line in lines:
        f.write(dump(line) + "\n")
    counts = {}
    for fmt, tmpl in templates.items():
        ok = 0
        f = outputs["expected_%s.jsonl" % fmt] = io.StringIO()
        if True:
            for line in lines:
                kw = {}
                if "add_generation_prompt" in line:
                    kw["add_generation_prompt"] = line["add_generation_prompt"]
                if "thinking" in line:
                    kw["thinking"] = line["thinking"]
                try:
                    s = hf.apply_chat_template(line["messages"], tools=line["tools"] or None,
                                               chat_template=tmpl, tokenize=False, **kw)
                    f.write(dump({"prompt": s}) + "\n")
                    ok += 1
                except Exception as e:  # the template raised: our encoder must fail too
                    f.write(dump({"error": "%s: %s" % (type(e).__name__, e)}) + "\n")
        counts[fmt] = ok
    n_ids = 0
    added = [t.content for t in raw.get_added_tokens_decoder().values()]
    for fmt in templates:
        g = outputs["ids_%s.jsonl" % fmt] = io.StringIO()
        expected = outputs["expected_%s.jsonl" % fmt].getvalue().splitlines()
        for line, exp in zip(lines, (json.loads(x) for x in expected)):
            ids = None
            if "prompt" in exp and not user_text_has_special(line, added):
                ids = raw.encode(exp["prompt"], add_special_tokens=False).ids
                n_ids += 1
            g.write(json.dumps({"ids": ids}) + "\n")
    for name, buf in outputs.items():
        data = lzma.compress(buf.getvalue().encode("utf-8"), preset=9 | lzma.PRESET_EXTREME)
        with open(os.path.join(OUT, name + ".xz"), "wb") as f:
            f.write(data)
    print("conversations: %d, rendered ok: %s, id references: %d" % (a.n, counts, n_ids), file=sys.stderr)


if __name__ == "__main__":
    main()
