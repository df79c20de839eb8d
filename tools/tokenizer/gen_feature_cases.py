#!/usr/bin/env python3
"""gen_feature_cases.py - small tokenizers exercising every supported tokenizer.json component,
with Hugging Face `tokenizers` reference outputs.

Writes tests/data/tokenizer_features/features.tar.xz containing, per variant V:
  V/tokenizer.json   a small BPE (trained here with HF's BpeTrainer) plus the components under test
  V/cases.jsonl      {"text", "ids" (encode, add_special_tokens=False), "ids_special" (=True),
                      "dec" (decode(ids, skip_special_tokens=False)), "dec_skip" (=True)}
Variants cover: ByteLevel with/without regex and prefix space; Split with every behavior,
invert, String and Regex patterns, empty matches, anchors, look-around, case-insensitive
groups, Unicode properties; Digits; normalizers NFC/NFD/NFKC/NFKD/Lowercase/Replace/Prepend/
Strip/Sequence; post-processors TemplateProcessing/Roberta/Bert/Sequence; added tokens with
lstrip/rstrip/single_word/normalized/special; BPE ignore_merges, unk_token with and without
fuse_unk, byte_fallback, continuing_subword_prefix/end_of_word_suffix, legacy "a b" merges with a
"#version" line; no decoder.
Usage: python3 tools/tokenizer/gen_feature_cases.py (needs the corpus archive unpacked in build/).
"""
import json
import os
import random

import tokenizers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from tarxz import write_tar_xz

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "data", "tokenizer_features", "features.tar.xz")
CORPUS = os.path.join(ROOT, "build", "tests", "data", "tokenizer_corpus", "corpus.jsonl")
SEED = 7


def load_corpus():
    recs = [json.loads(l) for l in open(CORPUS, encoding="utf-8")]
    return [(r["cat"], r["text"]) for r in recs]


def train_bytelevel(texts):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tr = trainers.BpeTrainer(vocab_size=1200, min_frequency=2, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                             show_progress=False)
    tok.train_from_iterator(texts, trainer=tr)
    return json.loads(tok.to_str())


def train_charlevel(texts):
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tr = trainers.BpeTrainer(vocab_size=600, min_frequency=2, special_tokens=["[UNK]"], limit_alphabet=60,
                             show_progress=False)
    tok.train_from_iterator([t for t in texts if t.isascii()], trainer=tr)
    return json.loads(tok.to_str())


def added(content, id_, special=True, lstrip=False, rstrip=False, single_word=False, normalized=None):
    return {"id": id_, "content": content, "single_word": single_word, "lstrip": lstrip, "rstrip": rstrip,
            "normalized": (not special) if normalized is None else normalized, "special": special}


def regex(p):
    return {"Regex": p}


def split(pattern, behavior, invert=False):
    return {"type": "Split", "pattern": pattern, "behavior": behavior, "invert": invert}


BL_NOREGEX = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
BL_DEC = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}


def variants(bl, cl):
    v = {}
    nb = len(bl["model"]["vocab"])

    def make(base, **kw):
        d = json.loads(json.dumps(base))
        d.setdefault("added_tokens", [])
        for k, val in kw.items():
            d[k] = val
        # ids as HF assigns them: the vocab id for content already in the vocab, else the next one
        vocab = d["model"]["vocab"]
        nxt = len(vocab)
        for a in d["added_tokens"]:
            if a["content"] in vocab:
                a["id"] = vocab[a["content"]]
            else:
                a["id"] = nxt
                nxt += 1
        return d

    v["bl_regex_prefix"] = make(bl, pre_tokenizer={"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                                                   "use_regex": True}, decoder=BL_DEC)
    v["bl_regex"] = make(bl, pre_tokenizer={"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                                            "use_regex": True}, decoder=BL_DEC)
    v["bl_prefix_noregex"] = make(bl, pre_tokenizer={"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                                                     "use_regex": False}, decoder=BL_DEC)
    pats = {"ws": regex(r"\s+"), "vowel": regex(r"[aeiouAEIOU]"), "num": regex(r"\p{N}+"),
            "lit": {"String": ", "}, "punct": regex(r"[\p{P}\p{S}]")}
    for beh in ["Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"]:
        for pn, pat in pats.items():
            for inv in (False, True):
                if pn in ("lit", "punct") and inv:
                    continue
                name = "split_%s_%s%s" % (beh.lower(), pn, "_inv" if inv else "")
                v[name] = make(bl, pre_tokenizer={"type": "Sequence", "pretokenizers": [split(pat, beh, inv), BL_NOREGEX]},
                               decoder=BL_DEC)
    odd = {"empty_star": r"a*", "lookahead": r"(?=[A-Z])", "anchors": r"^\s*|\s*$", "wordb": r"\b",
           "icase": r"(?i:the|and)\b", "props": r"[\p{Lu}\p{Nd}]+|\p{Han}+|\p{Hiragana}+", "dot": r"x.y",
           "curly": r"\d{,2}", "hexdig": r"\h+", "posix": r"[[:punct:]]+", "lookbehind": r"(?<=\d)[a-z]+",
           "atomic": r"(?>\s+)\S", "neg_props": r"\P{L}+", "mflag": r"(?m:a.b)"}
    # (a Replace normalizer whose pattern can match the empty string is left out: HF panics on
    # many inputs and is inconsistent with its own normalize_str on others)
    for pn, p in odd.items():
        for beh in ["Isolated", "Contiguous", "MergedWithNext"]:
            v["split_%s_%s" % (pn, beh.lower())] = make(bl, pre_tokenizer={"type": "Sequence", "pretokenizers": [
                split(regex(p), beh), BL_NOREGEX]}, decoder=BL_DEC)
    v["digits_individual"] = make(bl, pre_tokenizer={"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True}, BL_NOREGEX]}, decoder=BL_DEC)
    v["digits_contiguous"] = make(bl, pre_tokenizer={"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": False}, BL_NOREGEX]}, decoder=BL_DEC)
    seq_pre = {"type": "Sequence", "pretokenizers": [split(regex(r"\p{N}{1,3}"), "Isolated"),
                                                      {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                                                       "use_regex": True}]}
    for nn, norm in {"nfc": {"type": "NFC"}, "nfd": {"type": "NFD"}, "nfkc": {"type": "NFKC"}, "nfkd": {"type": "NFKD"},
                     "lower": {"type": "Lowercase"},
                     "replace_str": {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
                     "replace_re": {"type": "Replace", "pattern": regex(r"\s+"), "content": " "},
                     "prepend": {"type": "Prepend", "prepend": "▁"},
                     "strip": {"type": "Strip", "strip_left": True, "strip_right": True},
                     "strip_left": {"type": "Strip", "strip_left": True, "strip_right": False},
                     "seq": {"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Lowercase"},
                                                                 {"type": "Replace", "pattern": {"String": "ß"}, "content": "ss"},
                                                                 {"type": "Prepend", "prepend": " "}]}}.items():
        v["norm_" + nn] = make(bl, normalizer=norm, pre_tokenizer=seq_pre, decoder=BL_DEC,
                               added_tokens=[added("<|sp|>", nb, True), added("Hello", nb + 1, False, normalized=True),
                                             added("ÉCOLE", nb + 2, False, normalized=True)])
    tmpl = {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                       {"SpecialToken": {"id": "</s>", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [nb], "tokens": ["<s>"]},
                               "</s>": {"id": "</s>", "ids": [nb + 1, nb + 2], "tokens": ["</s>", "<pad>"]}}}
    specials3 = [added("<s>", nb, True), added("</s>", nb + 1, True), added("<pad>", nb + 2, True)]
    v["post_template"] = make(bl, pre_tokenizer=seq_pre, decoder=BL_DEC, post_processor=tmpl, added_tokens=specials3)
    v["post_template_norm"] = make(bl, pre_tokenizer=seq_pre, decoder=BL_DEC, post_processor=tmpl,
                                   normalizer={"type": "Lowercase"},
                                   added_tokens=specials3 + [added("<SP2>", nb + 3, True, normalized=True),
                                                             added("<sp3>", nb + 4, True, normalized=True)])
    v["post_roberta"] = make(bl, pre_tokenizer=seq_pre, decoder=BL_DEC, added_tokens=specials3,
                             post_processor={"type": "RobertaProcessing", "sep": ["</s>", nb + 1], "cls": ["<s>", nb],
                                             "trim_offsets": True, "add_prefix_space": False})
    v["post_bert"] = make(bl, pre_tokenizer=seq_pre, decoder=BL_DEC, added_tokens=specials3,
                          post_processor={"type": "BertProcessing", "sep": ["</s>", nb + 1], "cls": ["<s>", nb]})
    v["post_sequence"] = make(bl, pre_tokenizer=seq_pre, decoder=BL_DEC, added_tokens=specials3,
                              post_processor={"type": "Sequence", "processors": [
                                  {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
                                  tmpl]})
    toks = [added("<mask>", nb, True, lstrip=True), added("<r>", nb + 1, True, rstrip=True),
            added("<lr>", nb + 2, False, lstrip=True, rstrip=True), added("word", nb + 3, False, single_word=True),
            added("ab", nb + 4, False, single_word=True, lstrip=True), added("<a>", nb + 5, True),
            added("<a><b>", nb + 6, True), added("<a><b><c>", nb + 7, False), added("ünï", nb + 8, False),
            added("  ", nb + 9, False), added("the", nb + 10, False, normalized=False), added("<|x|>", nb + 11, True)]
    v["added_options"] = make(bl, pre_tokenizer=seq_pre, decoder=BL_DEC, added_tokens=toks)
    v["added_lower"] = make(bl, pre_tokenizer=seq_pre, decoder=BL_DEC, normalizer={"type": "Lowercase"},
                            added_tokens=[added("HeLLo", nb, False, normalized=True), added("WORLD", nb + 1, False, normalized=False),
                                          added("<Sp>", nb + 2, True, lstrip=True)])
    ig = make(bl, pre_tokenizer=seq_pre, decoder=BL_DEC)
    ig["model"]["ignore_merges"] = True
    v["bpe_ignore_merges"] = ig
    legacy = make(bl, pre_tokenizer=seq_pre, decoder=BL_DEC)
    legacy["model"]["merges"] = ["#version: 0.2"] + [" ".join(m) if isinstance(m, list) else m for m in legacy["model"]["merges"]]
    v["bpe_legacy_merges"] = legacy
    # char-level models: unk, fuse_unk, byte_fallback, prefix / suffix, no decoder
    for name, opts in {"cl_unk": {}, "cl_fuse_unk": {"fuse_unk": True}}.items():
        d = make(cl)
        d["model"].update(opts)
        d["decoder"] = None
        v[name] = d
    bf = make(cl)
    vocab = bf["model"]["vocab"]
    nxt = max(vocab.values()) + 1
    for b in range(256):
        if rng_choice_keep(b):
            vocab["<0x%02X>" % b] = nxt
            nxt += 1
    bf["model"]["byte_fallback"] = True
    bf["decoder"] = None
    v["cl_byte_fallback"] = bf
    # continuing_subword_prefix / end_of_word_suffix: rewrite the char-level vocab and merges
    for name, pre, suf in (("cl_prefix", "##", None), ("cl_suffix", None, "</w>")):
        d = make(cl)
        d["decoder"] = None
        d["model"]["continuing_subword_prefix"] = pre
        d["model"]["end_of_word_suffix"] = suf
        vocab = dict(d["model"]["vocab"])
        nid = max(vocab.values()) + 1
        merges = []
        for m in d["model"]["merges"]:
            a, b = m if isinstance(m, list) else m.split(" ")
            if pre:
                b2 = pre + b
                for tkn in (b2, a + b):
                    if tkn not in vocab:
                        vocab[tkn] = nid
                        nid += 1
                merges.append([a, b2])
            else:
                merges.append([a, b])
        for tkn in list(vocab):
            if pre and pre + tkn not in vocab:
                vocab[pre + tkn] = nid
                nid += 1
            if suf and tkn + suf not in vocab:
                vocab[tkn + suf] = nid
                nid += 1
        d["model"]["vocab"] = vocab
        d["model"]["merges"] = merges
        v[name] = d
    return v


def rng_choice_keep(b):
    return b % 3 != 0  # keep two thirds of the byte tokens: some fall back to [UNK]


def main():
    rng = random.Random(SEED)
    corpus = load_corpus()
    rng_unused = rng
    texts = [t for c, t in corpus if c in ("prose", "code", "cjk", "scripts", "emoji", "digits", "whitespace")]
    bl = train_bytelevel(texts)
    cl = train_charlevel(texts)
    vs = variants(bl, cl)
    # test strings: a sample of every corpus category plus strings aimed at the features
    by_cat = {}
    for c, t in corpus:
        by_cat.setdefault(c, []).append(t)
    sample = []
    for c in sorted(by_cat):
        sample += rng.sample(by_cat[c], min(25, len(by_cat[c])))
    sample = [s[:600] for s in sample]
    sample += ["", " ", "a", "aaa baaa", "bbb", "the The THE thé", "Hello HELLO hello HeLLo", "WORLD world",
               "x1y 2z", "The end", "A B C", "1 22 333 4444 55555", "ab abc xab ab.", "word words sword word",
               "say <mask>  here", "<mask>", "  <mask>", "<r>   x", "a <lr>  b", "<a><b><c>", "<a><b>", "<a> <b>",
               "<a><a><b>", "ünï ÜNÏ", "    ", "x  y   z", "<|x|>y<|x|>", "<|sp|> Hello ÉCOLE école",
               "<s> </s> <pad>", "ß straße STRASSE", "İstanbul ǅ ΣΑΣ", "\u0130", "ﬁﬂ ＡＢＣ ①", "e\u0301 é",
               "\u1100\u1161\u11a8", "line1\nline2\r\nline3", "  leading and trailing  ", "a-b--c---d",
               "x.y x\ny", "ab\u00a0cd", "Tab\there", "0x1F 0xff", "!!!", "a, b, c", "1,000,000.5",
               "<Sp>hello", "HeLLo WORLD", "<0x41>", "[UNK]", "日本語のテキスト", "émoji 👍🏽 test",
               "a<SP2>b<sp3>c<s>d", "hello, world! foo_bar baz-qux 3.14 ½ ⅔ x²", "tab\tsep\u3000wide\u00a0nb"]
    files = []
    for name in sorted(vs):
        d = vs[name]
        tok = Tokenizer.from_str(json.dumps(d))
        lines = []
        panics = 0
        for s in sample:
            try:
                e = tok.encode(s, add_special_tokens=False).ids
                e2 = tok.encode(s, add_special_tokens=True).ids
            except BaseException:  # HF itself panics on some inputs (e.g. empty-matching Replace)
                panics += 1
                continue
            lines.append(json.dumps({"text": s, "ids": e, "ids_special": e2,
                                     "dec": tok.decode(e, skip_special_tokens=False),
                                     "dec_skip": tok.decode(e2, skip_special_tokens=True)}, ensure_ascii=True))
        if panics:
            print("variant %s: HF panicked on %d strings (left out)" % (name, panics))
        files.append(("tokenizer_features/%s/tokenizer.json" % name, json.dumps(d, ensure_ascii=False)))
        files.append(("tokenizer_features/%s/cases.jsonl" % name, "\n".join(lines) + "\n"))
    files.append(("tokenizer_features/variants.txt", "\n".join(sorted(vs)) + "\n"))
    files.append(("tokenizer_features/meta.json", json.dumps({"tokenizers": tokenizers.__version__, "seed": SEED,
                                                              "variants": len(vs), "strings": len(sample)}) + "\n"))
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    size = write_tar_xz(OUT, files)
    print("wrote %s (%d bytes), %d variants x %d strings" % (OUT, size, len(vs), len(sample)))


if __name__ == "__main__":
    main()
