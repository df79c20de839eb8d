#!/usr/bin/env python3
"""gen_corpus.py - builds the tokenizer test corpus and its Hugging Face reference ids.

Writes tests/data/tokenizer_corpus/corpus.tar.xz containing
  corpus.jsonl  one line per string: {"cat", "text", "ds", "ds_safe", "qw", "qw_safe"} where ds/qw are
                the ids of HF `tokenizers` (pip, version recorded in meta) for DeepSeek-V3 / Qwen3:
                  ds, qw           Tokenizer.encode(text, add_special_tokens=False)
                  ds_safe, qw_safe the same tokenizer.json with "added_tokens": [] (no added-token
                                   matching: the reference for deepinfer's safe mode)
                ds_safe / qw_safe are omitted when equal to ds / qw; *_dec / *_safe_dec hold HF's
                decode(ids) when it differs from the text (normalization), for round-trip checks.
  decode.jsonl  random id sequences with HF decode(ids, skip_special_tokens=False/True)
  large.jsonl   ~1 MB inputs as recipes over corpus strings, with the HF id count and a 64-bit
                FNV-1a hash of the ids (little-endian int32) for each tokenizer and mode
  meta.json     tokenizers version, seed, counts

Deterministic: random.Random(SEED); prose comes from /usr/share/common-licenses and code from
the Python standard library and this repository (both present on the Debian machine where the
corpus was made; the output is committed, so tests never need this script).
Usage: python3 tools/tokenizer/gen_corpus.py [--tokenizers DIR]
"""
import argparse
import glob
import json
import os
import random
import unicodedata

import tokenizers
from tokenizers import Tokenizer

from tarxz import write_tar_xz

SEED = 20261129
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "data", "tokenizer_corpus", "corpus.tar.xz")

WS = [" ", "  ", "\t", "\n", "\r\n", "\r", "\n\n", "\u00a0", "\u2028", "\u2029", "\u3000", "\ufeff", "\u200b",
      "\u180e", "\u0085", "\u000b", "\u000c", "\u1680", "\u2000", "\u2003", "\u2009", "\u200a", "\u202f", "\u205f",
      "\u200c", "\u200d", "\u2060", " \n", "\n ", "\t\n", " \t "]


def read_files(patterns, limit_bytes):
    out = []
    total = 0
    for pat in patterns:
        for p in sorted(glob.glob(pat)):
            try:
                s = open(p, encoding="utf-8").read()
            except (UnicodeDecodeError, OSError):
                continue
            out.append(s)
            total += len(s)
            if total > limit_bytes:
                return out
    return out


def slice_of(rng, docs, lo, hi):
    d = rng.choice(docs)
    n = rng.randint(lo, hi)
    if len(d) <= n:
        return d
    a = rng.randrange(0, len(d) - n)
    return d[a:a + n]


def rand_cp(rng, ranges):
    lo, hi = rng.choice(ranges)
    while True:
        c = rng.randint(lo, hi)
        if not (0xD800 <= c <= 0xDFFF):
            return chr(c)


def gen_whitespace(rng):
    parts = []
    for _ in range(rng.randint(1, 12)):
        k = rng.random()
        if k < 0.5:
            parts.append("".join(rng.choice(WS) for _ in range(rng.randint(1, 8))))
        elif k < 0.8:
            parts.append(rng.choice(["word", "x", "Hello", "世界", "42", "def", "!", "'s", "a.b", "😀"]))
        else:
            parts.append(" " * rng.randint(1, 40) + rng.choice(["", "\n", "x", "\t"]))
    return "".join(parts)


def gen_digits(rng):
    digit_sets = ["0123456789", "٠١٢٣٤٥٦٧٨٩", "०१२३४५६७८९", "０１２３４５６７８９", "⁰¹²³⁴⁵⁶⁷⁸⁹", "₀₁₂₃₄₅₆₇₈₉",
                  "ⅠⅡⅢⅣⅤⅥⅦⅧⅨⅩ", "½¼¾⅓⅔", "𝟎𝟏𝟐𝟑𝟒", "①②③④⑤", "〇一二三四五六七八九"]
    parts = []
    for _ in range(rng.randint(1, 8)):
        ds = rng.choice(digit_sets) if rng.random() < 0.3 else "0123456789"
        parts.append("".join(rng.choice(ds) for _ in range(rng.randint(1, 40))))
        parts.append(rng.choice(["", " ", ".", ",", "-", "e", "x", "$", "%", " + ", "\n", "abc", "万", "_"]))
    return "".join(parts)


CJK = [(0x4E00, 0x9FA5), (0x9FA6, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2B740, 0x2B81D),
       (0x31350, 0x323AF), (0x2EBF0, 0x2EE5D), (0xF900, 0xFAFF)]
KANA = [(0x3040, 0x309F), (0x30A0, 0x30FF), (0xFF66, 0xFF9D), (0x31F0, 0x31FF), (0x1B000, 0x1B0FF)]
HANGUL = [(0xAC00, 0xD7A3), (0x1100, 0x11FF), (0x3130, 0x318F), (0xA960, 0xA97F), (0xD7B0, 0xD7FF)]
CJK_PUNCT = "。，、；：？！「」『』（）【】《》〈〉…—～·　"


def gen_cjk(rng):
    out = []
    for _ in range(rng.randint(1, 30)):
        k = rng.random()
        if k < 0.45:
            out.append("".join(rand_cp(rng, CJK[:1] if rng.random() < 0.8 else CJK) for _ in range(rng.randint(1, 12))))
        elif k < 0.6:
            out.append("".join(rand_cp(rng, KANA) for _ in range(rng.randint(1, 10))))
        elif k < 0.75:
            out.append("".join(rand_cp(rng, HANGUL[:1] if rng.random() < 0.8 else HANGUL) for _ in range(rng.randint(1, 8))))
        elif k < 0.9:
            out.append(rng.choice(CJK_PUNCT))
        else:
            out.append(rng.choice([" ", "abc", "123", "\n", "ＡＢＣ", "GPU", "3.14"]))
    return "".join(out)


SCRIPTS = {
    "arabic": [(0x0600, 0x06FF), (0x0750, 0x077F), (0xFB50, 0xFDFF), (0xFE70, 0xFEFF)],
    "hebrew": [(0x0590, 0x05FF), (0xFB1D, 0xFB4F)],
    "devanagari": [(0x0900, 0x097F), (0xA8E0, 0xA8FF)],
    "thai": [(0x0E00, 0x0E7F)],
    "cyrillic": [(0x0400, 0x04FF)],
    "greek": [(0x0370, 0x03FF), (0x1F00, 0x1FFF)],
    "bengali": [(0x0980, 0x09FF)],
    "tamil": [(0x0B80, 0x0BFF)],
}
WORDS = {
    "arabic": ["مرحبا", "بالعالم", "السلام", "عليكم", "كتاب", "الذكاء", "الاصطناعي", "١٢٣", "؟", "،"],
    "hebrew": ["שָׁלוֹם", "עוֹלָם", "תורה", "מחשב", "בְּרֵאשִׁית", "בָּרָא", "?", "״"],
    "devanagari": ["नमस्ते", "दुनिया", "हिन्दी", "भाषा", "क्षत्रिय", "श्री", "।", "॥", "१२३"],
    "thai": ["สวัสดี", "ชาวโลก", "ภาษาไทย", "คอมพิวเตอร์", "๑๒๓"],
    "cyrillic": ["Привет", "мир", "ёлка", "Ёжик", "ЪЫЬ", "съешь"],
    "greek": ["Καλημέρα", "κόσμε", "ΣΊΣΥΦΟΣ", "ὅτι", "ᾅδης", "ς"],
    "bengali": ["বাংলা", "ভাষা", "কম্পিউটার"],
    "tamil": ["தமிழ்", "வணக்கம்"],
}


def gen_script(rng):
    name = rng.choice(sorted(SCRIPTS))
    out = []
    for _ in range(rng.randint(1, 20)):
        if rng.random() < 0.6:
            out.append(rng.choice(WORDS[name]))
        else:
            out.append("".join(rand_cp(rng, SCRIPTS[name]) for _ in range(rng.randint(1, 6))))
        out.append(rng.choice([" ", " ", "", ", ", ".\n", " 42 ", " abc "]))
    return "".join(out)


SKIN = ["\U0001F3FB", "\U0001F3FC", "\U0001F3FD", "\U0001F3FE", "\U0001F3FF"]
BASE_EMOJI = ["👍", "👋", "🧑", "👩", "👨", "🤝", "🏃", "🙋", "✌", "☝", "🫶", "🫰"]
EMOJI_SEQ = ["👨‍👩‍👧‍👦", "👩‍❤️‍💋‍👨", "🏳️‍🌈", "🏴‍☠️", "🧑‍💻", "👁️‍🗨️", "🐻‍❄️", "❤️‍🔥", "🇺🇸", "🇯🇵", "🇪🇺",
             "1️⃣", "#️⃣", "©️", "🏴󠁧󠁢󠁳󠁣󠁴󠁿", "😀", "😂", "🤖", "🦀", "🫨", "🫩", "🪿", "🩷", "🫎", "\U0001FAEA", "\U0001FADC"]


def gen_emoji(rng):
    out = []
    for _ in range(rng.randint(1, 15)):
        k = rng.random()
        if k < 0.3:
            out.append(rng.choice(BASE_EMOJI) + rng.choice(SKIN))
        elif k < 0.6:
            out.append(rng.choice(EMOJI_SEQ))
        elif k < 0.75:
            out.append(rand_cp(rng, [(0x1F300, 0x1FAFF), (0x2600, 0x27BF)]))
        else:
            out.append(rng.choice([" ", "ok", "!", "\n", "😀😀", "：", "a"]))
    return "".join(out)


MARKS = [(0x0300, 0x036F), (0x1AB0, 0x1AFF), (0x1DC0, 0x1DFF), (0x20D0, 0x20FF), (0xFE20, 0xFE2F)]


def gen_combining(rng):
    out = []
    for _ in range(rng.randint(1, 15)):
        k = rng.random()
        base = rng.choice("aeiouAEIOUcnsyz ̸ωαжक가")
        if k < 0.4:
            out.append(base + "".join(rand_cp(rng, MARKS) for _ in range(rng.randint(1, 5))))
        elif k < 0.6:
            s = rng.choice(["é", "Å", "ñ", "ǖ", "ệ", "Ω", "ﬁ", "가", "각", "ḱ", "ẛ̣"])
            out.append(unicodedata.normalize(rng.choice(["NFC", "NFD", "NFKD"]), s))
        elif k < 0.75:
            # Hangul conjoining jamo: L V (T)
            out.append(chr(rng.randint(0x1100, 0x1112)) + chr(rng.randint(0x1161, 0x1175)) +
                       (chr(rng.randint(0x11A8, 0x11C2)) if rng.random() < 0.5 else ""))
        elif k < 0.85:
            out.append(rng.choice(["\u0915\u094d\u0937", "\u05e9\u05c1\u05b8", "a\u0301\u0316", "a\u0316\u0301",
                                   "\u0041\u030a", "\u212b", "\u00c5", "q\u0307\u0323", "\u1e0b\u0323"]))
        else:
            out.append(rng.choice([" ", "word", "\n", "2"]))
    return "".join(out)


LOOKALIKE = ["раураl", "аpple", "ΑΒΓ", "ＡＢＣ", "ｈｅｌｌｏ　ｗｏｒｌｄ", "𝐀𝐁𝐂", "𝕳𝖊𝖑𝖑𝖔", "ﬁnance", "ﬂow", "ſtreet", "K", "Å",
             "ℌ", "①", "™", "㎏", "㍿", "＜｜User｜＞", "〈think〉", "‹›", "“quoted”", "‘single’", "–—", "…", "ǅ", "ǈ",
             "İstanbul", "ß", "ẞ", "ﬀ", "Ⅻ", "℃", "ＤｅｅｐＳｅｅｋ", "ｐｙｔｈｏｎ３", "ﾊﾝｶｸ"]


def gen_lookalike(rng):
    return "".join(rng.choice(LOOKALIKE) + rng.choice(["", " ", "\n", ", ", "'s ", "123"]) for _ in range(rng.randint(1, 10)))


def gen_special(rng, specials):
    out = []
    for _ in range(rng.randint(1, 12)):
        k = rng.random()
        if k < 0.45:
            out.append(rng.choice(specials))
        elif k < 0.6:
            s = rng.choice(specials)
            cut = rng.randint(1, max(1, len(s) - 1))
            out.append(s[:cut] if rng.random() < 0.5 else s[cut:])  # near misses
        elif k < 0.7:
            out.append(rng.choice(specials) + rng.choice(specials))
        else:
            out.append(rng.choice([" ", "  ", "\n", "Hello", "user:", "思考", " </", "<", ">", "｜", "▁", "x", "\t",
                                   "{\"a\": 1}", "'s", "12"]))
    return "".join(out)


RANDOM_BLOCKS = [(0x0000, 0x007F), (0x0080, 0x07FF), (0x0800, 0xFFFF), (0x10000, 0x10FFFF), (0x0000, 0x10FFFF),
                 (0xE000, 0xF8FF), (0x1F000, 0x1FFFF), (0x105C0, 0x105FF), (0x10D40, 0x10D8F), (0x11380, 0x113FF),
                 (0x1CC00, 0x1CEBF), (0x16D40, 0x16D7F), (0x1E5D0, 0x1E5FF), (0x2E80, 0x2FDF), (0xFFF0, 0xFFFF)]


def gen_random(rng):
    blocks = [rng.choice(RANDOM_BLOCKS) for _ in range(rng.randint(1, 3))]
    return "".join(rand_cp(rng, blocks) for _ in range(rng.randint(1, 60)))


def gen_contractions(rng):
    parts = ["'s", "'S", "'t", "'T", "'re", "'RE", "'ve", "'m", "'ll", "'LL", "'d", "'D", "’s", "'ſ", "'K", "'x",
             "''", "'", "don't", "I'M", "we'LL", "it's", "O'Neil", "'tis", "rock'n'roll", "'123", "' s"]
    return "".join(rng.choice(["", " ", "word", "Word", "\n", "!", "a"]) + rng.choice(parts) for _ in range(rng.randint(1, 10)))


def gen_chat(rng, prose, code):
    pieces = ["# Title\n", "## Section\n", "- item\n", "* bullet\n", "1. first\n", "> quote\n", "```python\n", "```\n",
              "**bold**", "_it_", "`code`", "$x^2 + y_i$", "\\frac{a}{b}", "https://example.com/a?b=c&d=e#f",
              "user@example.org", "/usr/local/bin/deepinfer", "C:\\Windows\\System32", "<div class=\"x\">", "</div>",
              "{\"role\": \"user\", \"content\": \"hi\"}", "| a | b |\n|---|---|\n", "TODO:", "...", "?!", "¿Qué?", "¡Hola!"]
    out = []
    for _ in range(rng.randint(1, 10)):
        k = rng.random()
        if k < 0.5:
            out.append(rng.choice(pieces))
        elif k < 0.75:
            out.append(slice_of(rng, prose, 5, 120))
        else:
            out.append(slice_of(rng, code, 5, 120))
        out.append(rng.choice(["", " ", "\n", "\n\n"]))
    return "".join(out)


def fixed_cases(specials):
    cases = ["", " ", "  ", "\n", "\r\n", "\t", "a", "A", "0", "00", "000", "0000", "1234567", "!", "'", "'s", "\u0000",
             "\u0000abc\u0000", "\u007f", "\u0080", "\u00ad", "\u00a0", "\ufeff", "\ufffd", "\U0010ffff", "\uffff",
             "".join(chr(c) for c in range(1, 128)), "".join(chr(c) for c in range(128, 256)),
             " " * 100, "\n" * 50, " \n" * 30, "\t" * 20 + "x", "x" + " " * 17, "a" * 300, "ab" * 200,
             "1" * 100, "Hello, world!", "hello world", " hello world", "Hello\n\nWorld\n", "   leading", "trailing   ",
             "你好，世界！", "こんにちは世界", "안녕하세요 세계", "مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया",
             "👨‍👩‍👧‍👦", "👍🏽", "🇺🇸🇯🇵", "e\u0301", "\u00e9", "\u1100\u1161\u11a8", "ﬁ", "ＡＢＣ１２３", "𝐀𝐁𝐂"]
    cases += specials[:40]
    cases += [s + s for s in specials[:10]] + [" " + s + " " for s in specials[:10]]
    return cases


def build_strings(rng, prose, code, specials):
    gens = [
        ("prose", 900, lambda: slice_of(rng, prose, 1, 1500)),
        ("code", 700, lambda: slice_of(rng, code, 1, 1500)),
        ("whitespace", 400, lambda: gen_whitespace(rng)),
        ("digits", 400, lambda: gen_digits(rng)),
        ("cjk", 500, lambda: gen_cjk(rng)),
        ("scripts", 400, lambda: gen_script(rng)),
        ("emoji", 300, lambda: gen_emoji(rng)),
        ("combining", 300, lambda: gen_combining(rng)),
        ("lookalike", 300, lambda: gen_lookalike(rng)),
        ("special", 600, lambda: gen_special(rng, specials)),
        ("random", 500, lambda: gen_random(rng)),
        ("contractions", 200, lambda: gen_contractions(rng)),
        ("chat", 300, lambda: gen_chat(rng, prose, code)),
    ]
    out, ranges = [], {}
    for name, count, fn in gens:
        lo = len(out)
        for _ in range(count):
            out.append(fn())
        ranges[name] = (lo, len(out))
    lo = len(out)
    out += fixed_cases(specials)
    ranges["fixed"] = (lo, len(out))
    return out, ranges


def safe_tokenizer(path):
    d = json.load(open(path, encoding="utf-8"))
    d["added_tokens"] = []
    return Tokenizer.from_str(json.dumps(d))


def fnv64(ids):
    h = 0xcbf29ce484222325
    for i in ids:
        for b in (i & 0xffffffff).to_bytes(4, "little"):
            h ^= b
            h = (h * 0x100000001b3) & 0xffffffffffffffff
    return "%016x" % h


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizers", default=os.path.join(ROOT, "..", "..", "shared", "data", "tokenizers"))
    args = ap.parse_args()
    tdir = os.path.abspath(args.tokenizers)
    if not os.path.isdir(tdir):
        tdir = "/work/shared/data/tokenizers"
    rng = random.Random(SEED)
    prose = read_files(["/usr/share/common-licenses/*"], 2_000_000)
    pyroot = os.path.dirname(os.__file__)
    code = read_files([os.path.join(pyroot, "*.py"), os.path.join(ROOT, "src", "core", "*.c"),
                       os.path.join(ROOT, "src", "core", "*.h")], 3_000_000)
    toks = {}
    specials = []
    for key, name in (("ds", "deepseek-v3"), ("qw", "qwen3")):
        p = os.path.join(tdir, name, "tokenizer.json")
        toks[key] = (Tokenizer.from_file(p), safe_tokenizer(p))
        specials += [a["content"] for a in json.load(open(p, encoding="utf-8"))["added_tokens"]]
    specials = sorted(set(specials))
    rng.shuffle(specials)
    strings, cats = build_strings(rng, prose, code, specials)
    cat_of = {}
    for name, (lo, hi) in cats.items():
        for i in range(lo, hi):
            cat_of[i] = name

    def ref(key, s, safe):
        return toks[key][1 if safe else 0].encode(s, add_special_tokens=False).ids

    lines = []
    for i, s in enumerate(strings):
        rec = {"cat": cat_of[i], "text": s}
        for key in ("ds", "qw"):
            a = ref(key, s, False)
            b = ref(key, s, True)
            rec[key] = a
            if b != a:
                rec[key + "_safe"] = b
            # round trip reference: HF's decode of its own ids (differs from the text only
            # where the normalizer changed it, e.g. Qwen3's NFC)
            for k2, ids in ((key + "_dec", a), (key + "_safe_dec", b)):
                d = toks[key][0].decode(ids, skip_special_tokens=False)
                if d != s:
                    rec[k2] = d
        lines.append(json.dumps(rec, ensure_ascii=True))

    # decode references: random id sequences, including ids with no token
    dec = []
    for key in ("ds", "qw"):
        tok = toks[key][0]
        nv = tok.get_vocab_size(with_added_tokens=True)
        for _ in range(1500):
            ids = []
            for _ in range(rng.randint(0, 40)):
                k = rng.random()
                if k < 0.6:
                    ids.append(rng.randrange(0, nv))
                elif k < 0.85:
                    ids.append(rng.randrange(0, 260))  # single bytes: broken UTF-8
                elif k < 0.95:
                    ids.append(rng.randrange(nv - 900, nv))  # added tokens
                else:
                    ids.append(rng.randrange(nv, nv + 5000))  # no such token
            dec.append(json.dumps({"tok": key, "ids": ids, "text": tok.decode(ids, skip_special_tokens=False),
                                   "text_skip": tok.decode(ids, skip_special_tokens=True)}, ensure_ascii=True))

    # ~1 MB inputs as recipes over the corpus
    def pick(pred, sep, target=1 << 20):
        idx = [i for i, s in enumerate(strings) if pred(i, s)]
        rng.shuffle(idx)
        parts, total = [], 0
        while total < target:
            for i in idx:
                parts.append(i)
                total += len(strings[i].encode("utf-8")) + len(sep.encode("utf-8"))
                if total >= target:
                    break
        return parts

    def cat(name):
        return lambda i, s: cat_of[i] == name

    recipes = [
        {"name": "mixed", "sep": "\n", "parts": pick(lambda i, s: True, "\n")},
        {"name": "prose", "sep": " ", "parts": pick(cat("prose"), " ")},
        {"name": "code", "sep": "\n", "parts": pick(cat("code"), "\n")},
        {"name": "cjk", "sep": "", "parts": pick(cat("cjk"), "")},
        {"name": "special", "sep": "", "parts": pick(cat("special"), "")},
        {"name": "spaces", "repeat": " ", "count": 1 << 20},
        {"name": "digits", "repeat": "0123456789", "count": 104858},
        {"name": "newlines", "repeat": "\n \t", "count": 349526},
    ]
    large = []
    for r in recipes:
        text = r["repeat"] * r["count"] if "repeat" in r else r["sep"].join(strings[i] for i in r["parts"])
        rec = dict(r)
        rec["bytes"] = len(text.encode("utf-8"))
        for key in ("ds", "qw"):
            for safe in (False, True):
                ids = ref(key, text, safe)
                rec[key + ("_safe" if safe else "")] = {"n": len(ids), "fnv64": fnv64(ids)}
        large.append(json.dumps(rec, ensure_ascii=True))

    meta = {"tokenizers": tokenizers.__version__, "seed": SEED, "strings": len(strings), "decode": len(dec),
            "large": len(large), "categories": cats}
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    files = (("corpus.jsonl", "\n".join(lines) + "\n"), ("decode.jsonl", "\n".join(dec) + "\n"),
             ("large.jsonl", "\n".join(large) + "\n"), ("meta.json", json.dumps(meta, indent=1) + "\n"))
    size = write_tar_xz(OUT, [("tokenizer_corpus/" + name, data) for name, data in files])
    print("wrote %s (%d bytes): %s" % (OUT, size, meta))


if __name__ == "__main__":
    main()
