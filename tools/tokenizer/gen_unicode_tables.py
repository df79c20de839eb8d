#!/usr/bin/env python3
"""gen_unicode_tables.py - writes src/tokenizer/tok_unicode_data.c.

Hugging Face `tokenizers` (the pip wheel) matches pre-tokenizer regexes with Oniguruma (Unicode
16 tables in 0.23.x), uses Rust std tables for char::is_numeric / is_whitespace / to_lowercase,
the Rust `regex` crate for \\w in added-token single_word checks, and an older Unicode version
for NFC/NFD/NFKC/NFKD. deepinfer runs the regexes on PCRE2 (Debian 12: Unicode 14) and
normalizes with utf8proc (Unicode 15). This script measures, code point by code point, what HF
does and what PCRE2/utf8proc do, and emits the tables that make deepinfer behave like HF:

  * for each regex property (\\p{L}, \\s, ...): HF's full set as ranges, and the code points HF
    has but PCRE2 lacks ("extras"), so a pattern can use PCRE2's fast \\p{..} plus extras;
  * Rust's numeric / whitespace / word sets and lowercase mappings that differ from utf8proc;
  * the code points whose normalization HF's tables do not know ("opaque"): HF passes them
    through unchanged, so deepinfer normalizes around them.

The reference is HF itself (probed through its public Python API), never our own code.
Usage: python3 tools/tokenizer/gen_unicode_tables.py  (needs gcc, libpcre2-dev, libutf8proc-dev,
pip tokenizers==0.23.2; takes a few minutes).
"""
import json
import os
import subprocess
import sys
import tempfile

import tokenizers
from tokenizers import Regex, Tokenizer, normalizers, pre_tokenizers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "src", "tokenizer", "tok_unicode_data.c")
ALL = [c for c in range(0x110000) if not (0xD800 <= c <= 0xDFFF)]

GC = ["L", "Lu", "Ll", "Lt", "Lm", "Lo", "M", "Mn", "Mc", "Me", "N", "Nd", "Nl", "No", "P", "Pc", "Pd",
      "Ps", "Pe", "Pi", "Pf", "Po", "S", "Sm", "Sc", "Sk", "So", "Z", "Zs", "Zl", "Zp", "Cc", "Cf", "Co"]
SCRIPTS = ["Han", "Hiragana", "Katakana", "Hangul", "Latin", "Greek", "Cyrillic", "Arabic", "Hebrew",
           "Thai", "Devanagari", "Common"]
# name -> (Oniguruma pattern probed in HF, PCRE2 class items used as the fast base)
PROPS = [(n, "\\p{%s}" % n, "\\p{%s}" % n) for n in GC + SCRIPTS]
PROPS += [("s", "\\s", "\\x{9}-\\x{D}\\x{85}\\p{Z}"),
          ("d", "\\d", "\\p{Nd}"),
          ("w", "\\w", "\\p{L}\\p{M}\\p{Nd}\\p{Pc}")]
# POSIX bracket classes: always emitted as explicit ranges (no PCRE2 base)
POSIX = ["alpha", "digit", "alnum", "upper", "lower", "space", "punct", "word", "xdigit", "cntrl", "graph", "print",
         "blank"]
PROPS += [("posix_" + n, "[[:%s:]]" % n, None) for n in POSIX]


def build_probe():
    exe = os.path.join(tempfile.gettempdir(), "di_ucprobe")
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ucprobe.c")
    subprocess.check_call(["gcc", "-O2", src, "-o", exe, "-lpcre2-8", "-lutf8proc"])
    return exe


def probe(exe, *args, inp=None):
    return subprocess.run([exe, *args], input=inp, capture_output=True, text=True, check=True).stdout


def ranges(cps):
    out = []
    for c in sorted(cps):
        if out and out[-1][1] == c - 1:
            out[-1][1] = c
        else:
            out.append([c, c])
    return out


def hf_regex_set(pattern):
    text = "".join(chr(c) for c in ALL)
    pt = pre_tokenizers.Split(Regex(pattern), behavior="removed")
    kept = set()
    for piece, _ in pt.pre_tokenize_str(text):
        kept.update(ord(ch) for ch in piece)
    return set(ALL) - kept


def hf_numeric():
    # Digits(individual_digits) isolates every char::is_numeric char; separators are 'a'
    chars = [chr(c) for c in ALL]
    text = "a".join(chars)
    out = set()
    for piece, _ in pre_tokenizers.Digits(individual_digits=True).pre_tokenize_str(text):
        if len(piece) == 1 and piece != "a":
            out.add(ord(piece))
    return out


def hf_whitespace():
    strip = normalizers.Strip(left=True, right=False)
    return {c for c in ALL if strip.normalize_str(chr(c) + "x") == "x"}


def hf_word():
    # An added token with single_word=True matches only if the previous char is not \w.
    tok = {"version": "1.0", "truncation": None, "padding": None,
           "added_tokens": [{"id": 1, "content": "\x01", "single_word": True, "lstrip": False, "rstrip": False,
                             "normalized": False, "special": True}],
           "normalizer": None, "pre_tokenizer": None, "post_processor": None, "decoder": None,
           "model": {"type": "BPE", "dropout": None, "unk_token": "u", "continuing_subword_prefix": None,
                     "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": False,
                     "vocab": {"u": 0}, "merges": []}}
    t = Tokenizer.from_str(json.dumps(tok))
    cps = [c for c in ALL if c != 1]
    encs = t.encode_batch([chr(c) + "\x01" for c in cps], add_special_tokens=False)
    return {c for c, e in zip(cps, encs) if 1 not in e.ids}


def hf_lower():
    low = normalizers.Lowercase()
    return {c: [ord(x) for x in low.normalize_str(chr(c))] for c in ALL}


def hf_norm(form, lines):
    n = getattr(normalizers, form.upper())()
    return [" ".join("%X" % ord(x) for x in n.normalize_str("".join(chr(int(h, 16)) for h in l.split())))
            for l in lines]


def norm_opaque(exe):
    props = {}
    for line in probe(exe, "props").split("\n"):
        if line:
            c, ccc, dec = line.split()
            props[int(c, 16)] = (int(ccc), int(dec))
    probes = {}  # probe line -> code points it tests
    for c, (ccc, dec) in props.items():
        probes.setdefault("%X" % c, set()).add(c)
        probes.setdefault("301 %X" % c, set()).add(c)
        probes.setdefault("%X 334" % c, set()).add(c)
    pairs = [l.split() for l in probe(exe, "pairs").split("\n") if l]
    for f, s, comp in pairs:
        probes.setdefault("%s %s" % (f, s), set()).update({int(f, 16), int(s, 16), int(comp, 16)})
    lines = sorted(probes)
    bad_lines = set()
    for form in ["nfc", "nfd", "nfkc", "nfkd"]:
        ours = probe(exe, "norm", form, inp="\n".join(lines) + "\n").split("\n")
        hf = hf_norm(form, lines)
        for l, a, b in zip(lines, ours, hf):
            if a != b:
                bad_lines.add(l)
    # a code point is opaque if a probe made of it alone (or with an old mark) differs
    opaque = set()
    for l in bad_lines:
        parts = l.split()
        if len(parts) == 1 or parts[0] == "301" or parts[-1] == "334":
            opaque |= probes[l]
    # composition pairs that still differ: mark the parts HF does not know
    for l in bad_lines:
        parts = l.split()
        if len(parts) == 2 and parts[0] != "301" and parts[1] != "334":
            if not (probes[l] & opaque):
                opaque |= probes[l]
    return opaque


def c_ranges(name, rs):
    body = ", ".join("0x%X, 0x%X" % (a, b) for a, b in rs)
    lines = []
    cur = "    "
    for tok in body.split(", "):
        piece = tok + ", "
        if len(cur) + len(piece) > 100:
            lines.append(cur.rstrip())
            cur = "    "
        cur += piece
    if cur.strip():
        lines.append(cur.rstrip())
    if not rs:
        lines = ["    0"]
    return "static const uint32_t %s[] = {\n%s\n};\n" % (name, "\n".join(lines))


def main():
    exe = build_probe()
    pcre_ver, u8p_ver = probe(exe, "version").split()
    out = []
    out.append("/* tok_unicode_data.c - GENERATED by tools/tokenizer/gen_unicode_tables.py; do not edit.\n"
               " *\n"
               " * Character sets measured from Hugging Face tokenizers %s (Oniguruma regex classes, Rust std\n"
               " * tables, its normalization tables), compared with PCRE2 (Unicode %s) and utf8proc (Unicode %s).\n"
               " * Ranges are inclusive [lo, hi] pairs, sorted. */\n" % (tokenizers.__version__, pcre_ver, u8p_ver))
    out.append('#include <string.h>\n\n#include "tokenizer/tok_internal.h"\n\n')
    out.append('const char *const di_tok_uc_pcre_unicode_version = "%s";\n\n' % pcre_ver)
    entries = []
    for name, onig, base in PROPS:
        hf = hf_regex_set(onig)
        pc = set(int(x, 16) for x in probe(exe, "pcre", "[%s]" % base).split()) if base else set(ALL)
        superset = pc <= hf and base is not None
        extra = hf - pc if superset else set()
        sys.stderr.write("%-10s hf=%d pcre=%d superset=%s extra=%d\n" % (name, len(hf), len(pc), superset, len(extra)))
        cname = "p_" + name
        out.append(c_ranges(cname, ranges(hf)))
        out.append(c_ranges("x_" + name, ranges(extra)))
        entries.append('    {"%s", "%s", %s, %d, %s, %d, %d},\n' % (
            name, (base or "").replace("\\", "\\\\"), cname, len(ranges(hf)), "x_" + name, len(ranges(extra)), int(superset)))
    out.append("\nstatic const di_tok_uc_prop props[] = {\n%s};\n\n" % "".join(entries))
    out.append("const di_tok_uc_prop *di_tok_uc_prop_find(const char *name, size_t len) {\n"
               "    for (size_t i = 0; i < sizeof props / sizeof props[0]; i++)\n"
               "        if (strlen(props[i].name) == len && memcmp(props[i].name, name, len) == 0) return &props[i];\n"
               "    return NULL;\n}\n\n")
    num = hf_numeric()
    ws = hf_whitespace()
    word = hf_word()
    sys.stderr.write("numeric=%d whitespace=%d word=%d\n" % (len(num), len(ws), len(word)))
    out.append(c_ranges("numeric", ranges(num)))
    out.append(c_ranges("whitespace", ranges(ws)))
    out.append(c_ranges("word", ranges(word)))
    opaque = norm_opaque(exe)
    sys.stderr.write("norm opaque=%d\n" % len(opaque))
    out.append(c_ranges("norm_opaque", ranges(opaque)))
    # lowercase: HF Lowercase vs utf8proc_tolower
    u8lower = {}
    for line in probe(exe, "lower").split("\n"):
        if line:
            a, b = line.split()
            u8lower[int(a, 16)] = int(b, 16)
    hfl = hf_lower()
    exc = []
    for c in ALL:
        mine = [u8lower.get(c, c)]
        if hfl[c] != mine:
            exc.append((c, hfl[c]))
    sys.stderr.write("lowercase exceptions=%d\n" % len(exc))
    out.append("static const uint32_t lower_exc[][5] = { /* cp, n, mapping... */\n")
    for c, m in exc:
        if len(m) > 3:
            raise SystemExit("lowercase mapping longer than 3 code points for U+%X" % c)
        mm = m + [0] * (3 - len(m))
        out.append("    {0x%X, %d, 0x%X, 0x%X, 0x%X},\n" % (c, len(m), mm[0], mm[1], mm[2]))
    if not exc:
        out.append("    {0xFFFFFFFF, 0, 0, 0, 0},\n")
    out.append("};\n\n")
    out.append(TAIL)
    with open(OUT, "w") as f:
        f.write("".join(out))
    print("wrote", OUT)


TAIL = r"""static int in_ranges(const uint32_t *r, size_t n_pairs, uint32_t cp) {
    size_t lo = 0, hi = n_pairs;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < r[2 * mid]) hi = mid;
        else if (cp > r[2 * mid + 1]) lo = mid + 1;
        else return 1;
    }
    return 0;
}
#define IN(tab, cp) in_ranges(tab, sizeof tab / sizeof tab[0] / 2, cp)

int di_tok_uc_is_numeric(uint32_t cp) { return IN(numeric, cp); }
int di_tok_uc_is_whitespace(uint32_t cp) { return IN(whitespace, cp); }
int di_tok_uc_is_word(uint32_t cp) { return IN(word, cp); }
int di_tok_uc_norm_opaque(uint32_t cp) { return cp >= norm_opaque[0] && IN(norm_opaque, cp); }

int di_tok_uc_lower_exception(uint32_t cp, uint32_t out[3]) {
    size_t lo = 0, hi = sizeof lower_exc / sizeof lower_exc[0];
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < lower_exc[mid][0]) hi = mid;
        else if (cp > lower_exc[mid][0]) lo = mid + 1;
        else {
            for (uint32_t i = 0; i < lower_exc[mid][1]; i++) out[i] = lower_exc[mid][2 + i];
            return (int)lower_exc[mid][1];
        }
    }
    return -1;
}
"""

if __name__ == "__main__":
    main()
