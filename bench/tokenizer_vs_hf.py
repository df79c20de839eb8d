#!/usr/bin/env python3
"""tokenizer_vs_hf.py - deepinfer's tokenizer vs Hugging Face `tokenizers`, same input, same run.

  python3 bench/tokenizer_vs_hf.py [--build build] [--tokenizer NAME|PATH ...] [--mb 12] [--repeat 3]

1. Builds (once, cached in <build>/bench/tokenizer_corpus.jsonl) a deterministic mixed corpus of
   at least 10 MB, one JSON document per line: English prose (/usr/share/common-licenses and
   /usr/share/doc/*/copyright), source code (the Python standard library), the tokenizer test
   corpus (multilingual, emoji, whitespace, digits, special-token text, random Unicode) and
   Chinese/Japanese text composed from common words.
2. Runs <build>/bench/bench_tokenizer on it (load time, single-thread throughput one document at
   a time, segment-parallel throughput on 1 and 2 threads over the concatenated corpus).
3. Runs HF `tokenizers` on the same documents in this process, single thread
   (RAYON_NUM_THREADS=1, TOKENIZERS_PARALLELISM=false, Tokenizer.encode per document), and its
   load time.
4. Checks that both produced the same ids (count + FNV-1a hash) and prints the ratios.
Needs: pip tokenizers (the version is printed).
"""
import argparse
import glob
import json
import os
import random
import subprocess
import sys
import time

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
import tokenizers  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

ZH = ["我们", "你好", "世界", "中国", "人工智能", "模型", "数据", "计算", "推理", "服务器", "用户", "问题", "回答",
      "今天", "天气", "非常", "好", "的", "了", "是", "在", "有", "和", "这个", "那个", "因为", "所以", "但是",
      "学习", "深度", "神经网络", "语言", "大模型", "训练", "参数", "速度", "内存", "显卡", "开源", "社区", "。",
      "，", "！", "？", "：", "；", "“", "”", "（", "）", "一个", "可以", "需要", "使用", "方法", "结果", "系统"]
JA = ["こんにちは", "世界", "私", "は", "です", "ます", "日本語", "の", "を", "に", "が", "東京", "モデル", "データ",
      "カタカナ", "ひらがな", "漢字", "。", "、", "ありがとう", "ございます", "機械学習", "推論", "サーバー"]


def cjk_doc(rng):
    words = ZH if rng.random() < 0.7 else JA
    return "".join(rng.choice(words) for _ in range(rng.randint(50, 800)))


def chunks(text, rng, lo, hi):
    out, i = [], 0
    while i < len(text):
        n = rng.randint(lo, hi)
        out.append(text[i:i + n])
        i += n
    return out


def build_corpus(path, mb, build):
    rng = random.Random(1234)
    docs = []
    target = mb * 1_000_000

    def size():
        return sum(len(d.encode("utf-8")) for d in docs)

    prose = []
    for p in sorted(glob.glob("/usr/share/common-licenses/*") + glob.glob("/usr/share/doc/*/copyright")):
        try:
            prose.append(open(p, encoding="utf-8").read())
        except (UnicodeDecodeError, OSError):
            pass
    code = []
    for p in sorted(glob.glob(os.path.join(os.path.dirname(os.__file__), "**", "*.py"), recursive=True)):
        try:
            code.append(open(p, encoding="utf-8").read())
        except (UnicodeDecodeError, OSError):
            pass
    corpus = os.path.join(build, "tests", "data", "tokenizer_corpus", "corpus.jsonl")
    test_docs = [json.loads(l)["text"] for l in open(corpus, encoding="utf-8")] if os.path.exists(corpus) else []
    parts = {"prose": [], "code": [], "test": test_docs, "cjk": []}
    ptext = "\n\n".join(prose)
    parts["prose"] = chunks(ptext, rng, 500, 8000)
    ctext = "\n".join(code)
    parts["code"] = chunks(ctext, rng, 500, 8000)
    budget = {"prose": 0.40, "code": 0.35, "cjk": 0.10}
    for k in ("prose", "code"):
        lst = parts[k]
        rng.shuffle(lst)
        b = 0
        for d in lst:
            if b >= budget[k] * target:
                break
            docs.append(d)
            b += len(d.encode("utf-8"))
    b = 0
    while b < budget["cjk"] * target:
        d = cjk_doc(rng)
        docs.append(d)
        b += len(d.encode("utf-8"))
    docs += test_docs
    while size() < target:
        docs.append(rng.choice(parts["prose"] + parts["code"]))
    rng.shuffle(docs)
    with open(path, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"text": d}) + "\n")


def fnv64(h, ids):
    for i in ids:
        v = i & 0xffffffff
        for b in range(4):
            h ^= (v >> (8 * b)) & 0xff
            h = (h * 0x100000001b3) & 0xffffffffffffffff
    return h


def run_ours(build, tok, corpus, repeat):
    exe = os.path.join(build, "bench", "bench_tokenizer")
    out = subprocess.run([exe, "--tokenizer", tok, "--input", corpus, "--jsonl", "--threads", "1,2",
                          "--repeat", str(repeat)], capture_output=True, text=True, check=True).stdout
    res = {}
    for line in out.splitlines():
        f = line.split()
        if f[0] == "load_ms":
            res["load_ms"] = float(f[2])
        elif f[0] == "serial":
            res["mbs"] = float(f[2])
        elif f[0] == "ids":
            res["ids"] = int(f[1])
            res["hash"] = f[3]
        elif f[0] == "parallel":
            res["par%s" % f[2]] = float(f[4])
            res["cpu%s" % f[2]] = float(f[8])
    return res, out


def run_hf(tok_path, docs, repeat):
    t0 = time.perf_counter()
    tok = Tokenizer.from_file(tok_path)
    load_ms = (time.perf_counter() - t0) * 1e3
    loads = [load_ms]
    for _ in range(2):
        t0 = time.perf_counter()
        Tokenizer.from_file(tok_path)
        loads.append((time.perf_counter() - t0) * 1e3)
    best = 1e30
    n = 0
    h = 0
    total = sum(len(d.encode("utf-8")) for d in docs)
    for _ in range(repeat):
        n = 0
        enc = []
        t0 = time.perf_counter()
        for d in docs:
            enc.append(tok.encode(d, add_special_tokens=False).ids)
        dt = time.perf_counter() - t0
        best = min(best, dt)
    h = 0xcbf29ce484222325
    for ids in enc:
        n += len(ids)
        h = fnv64(h, ids)
    return {"load_ms": min(loads), "mbs": total / best / 1e6, "ids": n, "hash": "%016x" % h}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--tokenizer", nargs="*", default=["deepseek-v3", "qwen3"])
    ap.add_argument("--mb", type=int, default=12)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    corpus = os.path.join(args.build, "bench", "tokenizer_corpus.jsonl")
    if not os.path.exists(corpus):
        build_corpus(corpus, args.mb, args.build)
    docs = [json.loads(l)["text"] for l in open(corpus, encoding="utf-8")]
    total = sum(len(d.encode("utf-8")) for d in docs)
    print("corpus: %s, %d documents, %.2f MB; HF tokenizers %s" % (corpus, len(docs), total / 1e6, tokenizers.__version__))
    ok = True
    for name in args.tokenizer:
        tdir = name if os.path.exists(name) else os.path.join(args.build, "tests", "data", "tokenizers", name)
        ours, raw = run_ours(args.build, tdir, corpus, args.repeat)
        hf = run_hf(os.path.join(tdir, "tokenizer.json"), docs, args.repeat)
        same = ours["ids"] == hf["ids"] and ours["hash"] == hf["hash"]
        ok &= same
        print("\n== %s" % name)
        print("  load time:        deepinfer %7.1f ms   HF %7.1f ms" % (ours["load_ms"], hf["load_ms"]))
        print("  1 thread:         deepinfer %7.2f MB/s HF %7.2f MB/s   ratio %.2fx" % (ours["mbs"], hf["mbs"], ours["mbs"] / hf["mbs"]))
        print("  parallel, 1 thr:  deepinfer %7.2f MB/s" % ours.get("par1", 0))
        print("  parallel, 2 thr:  deepinfer %7.2f MB/s   scaling %.2fx (cores busy %.2f)" % (
            ours.get("par2", 0), ours.get("par2", 0) / max(ours.get("par1", 1e-9), 1e-9), ours.get("cpu2", 0)))
        print("  ids:              deepinfer %d (%s)  HF %d (%s)  %s" % (ours["ids"], ours["hash"], hf["ids"], hf["hash"],
                                                                   "identical" if same else "DIFFERENT"))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
