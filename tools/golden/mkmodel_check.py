#!/usr/bin/env python3
"""Independent check of `deepinfer mkmodel` output against the value spec in src/io/mkmodel.h.

Re-implements the generator in Python/numpy (splitmix64 keyed by FNV-1a of the tensor name,
24-bit uniforms, per-role ranges, bf16 / FP8 block quantization) and compares every tensor of a
checkpoint bit for bit. Also loads tokenizer.json with the HF `tokenizers` library and checks
its special tokens and pre-tokenizer against the real DeepSeek-V3 tokenizer.

Usage: python3 tools/golden/mkmodel_check.py CKPT_DIR SEED [--real-tokenizer DIR] [--print-values]
"""
import argparse
import json
import math
import os
import sys

import numpy as np
import torch
from safetensors import safe_open
from tokenizers import Tokenizer

M64 = (1 << 64) - 1


def splitmix64(z):
    z = np.asarray(z, dtype=np.uint64)
    with np.errstate(over="ignore"):  # uint64 arithmetic wraps, as in C
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xbf58476d1ce4e5b9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94d049bb133111eb)
    return z ^ (z >> np.uint64(31))


def key(name, seed):
    h = 0xcbf29ce484222325
    for b in name.encode():
        h = ((h ^ b) * 0x100000001b3) & M64
    return np.uint64(h) ^ splitmix64(np.uint64(seed))


def uniform(k, n):
    with np.errstate(over="ignore"):
        i = np.arange(1, n + 1, dtype=np.uint64)
        r = splitmix64(np.uint64(k) + i * np.uint64(0x9e3779b97f4a7c15))
    s = (r >> np.uint64(40)).astype(np.int64) - (1 << 23)
    return s.astype(np.float32) * np.float32(1.0 / 8388608.0)


def role(name, cfg, mtp_layers):
    D = cfg["hidden_size"]
    base = name.rsplit(".", 1)[0]
    if name.endswith("embed_tokens.weight"):
        return "embed"
    if name.endswith("shared_head.head.weight") or name == "lm_head.weight":
        return "head"
    if name.endswith("e_score_correction_bias"):
        return "bias"
    if name.endswith("mlp.gate.weight"):
        return "router"
    if name.endswith("k_norm.bias"):
        return "norm_bias"
    if "norm" in base.rsplit(".", 1)[-1]:
        return "norm"
    if name.endswith("eh_proj.weight") or name.endswith("weights_proj.weight"):
        return "linear_keep"
    return "linear"


def det_sqrt(v):
    x = v if v > 1.0 else 1.0
    for _ in range(64):
        x = 0.5 * (x + v / x)
    return x


def expected_f32(name, shape, cfg, seed):
    D = cfg["hidden_size"]
    r = role(name, cfg, None)
    center, a = 0.0, 1.0
    stream = name
    parts = name.split(".")
    if len(parts) > 3 and parts[0] == "model" and parts[1] == "layers" and int(parts[2]) >= cfg["num_hidden_layers"]:
        if r == "embed":
            stream = "model.embed_tokens.weight"
        if r == "head":
            stream = "lm_head.weight"
    if r == "embed":
        a = 1.0
    elif r == "norm":
        center, a = 1.0, 0.25
    elif r == "norm_bias":
        a = 0.1
    elif r in ("linear", "linear_keep"):
        a = det_sqrt(3.0 / shape[1])
    elif r == "router":
        a = 2.0 * det_sqrt(3.0 / D)
    elif r == "bias":
        a = 0.25
    elif r == "head":
        a = 2.0 / det_sqrt(D)
    n = int(np.prod(shape)) if shape else 1
    u = uniform(key(stream, seed), n)
    if r == "bias":
        u = np.where(u == 0, np.float32(1.0 / 1024.0), u)
    v = np.float32(center) + u * np.float32(a)
    return v.reshape(shape), r


def to_bf16(v):
    return torch.from_numpy(np.ascontiguousarray(v)).to(torch.bfloat16)


def check_tensor(f, name, cfg, seed, block):
    t = f.get_tensor(name)
    if name.endswith("_scale_inv"):
        return 0
    v, r = expected_f32(name, list(t.shape), cfg, seed)
    if t.dtype == torch.float8_e4m3fn:
        s = f.get_tensor(name + "_scale_inv")
        rows, cols = v.shape
        amax = np.zeros(s.shape, dtype=np.float32)
        for i in range(s.shape[0]):
            for j in range(s.shape[1]):
                amax[i, j] = np.abs(v[i * block[0]:(i + 1) * block[0], j * block[1]:(j + 1) * block[1]]).max()
        scale = np.where(amax > 0, amax / np.float32(448.0), np.float32(1.0)).astype(np.float32)
        if not np.array_equal(scale, s.numpy()):
            return f"{name}_scale_inv: scales differ"
        full = np.repeat(np.repeat(scale, block[0], 0)[:rows], block[1], 1)[:, :cols]
        q = torch.from_numpy((v / full).astype(np.float32)).clamp(-448, 448).to(torch.float8_e4m3fn)
        if not torch.equal(q.view(torch.uint8), t.view(torch.uint8)):
            bad = (q.view(torch.uint8) != t.view(torch.uint8)).sum().item()
            return f"{name}: {bad} fp8 codes differ"
        return 0
    if t.dtype == torch.float32:
        want = torch.from_numpy(np.ascontiguousarray(v))
    elif t.dtype == torch.bfloat16:
        want = to_bf16(v)
    else:
        return f"{name}: unexpected dtype {t.dtype}"
    if not torch.equal(want, t):
        return f"{name}: values differ (max |d| {(want.float() - t.float()).abs().max()})"
    return 0


def check_tokenizer(ckpt, real_dir):
    tok = Tokenizer.from_file(os.path.join(ckpt, "tokenizer.json"))
    cfg = json.load(open(os.path.join(ckpt, "config.json")))
    assert tok.get_vocab_size() <= cfg["vocab_size"], "tokenizer larger than the model vocabulary"
    assert tok.token_to_id("<｜begin▁of▁sentence｜>") == 0 and tok.token_to_id("<｜end▁of▁sentence｜>") == 1
    for t in ["<｜User｜>", "<｜Assistant｜>", "<think>", "</think>", "<｜tool▁calls▁begin｜>", "<｜tool▁sep｜>"]:
        i = tok.token_to_id(t)
        assert i is not None and tok.encode(t).ids == [i], t
    text = "Hello, world! 12345 <｜User｜>héllo\n\n  the 世界 ok<｜Assistant｜>"
    ids = tok.encode(text).ids
    assert tok.decode(ids, skip_special_tokens=False) == text, "round trip"
    mine = json.load(open(os.path.join(ckpt, "tokenizer.json")))
    if real_dir:
        real = json.load(open(os.path.join(real_dir, "tokenizer.json")))
        for k in ("normalizer", "pre_tokenizer", "post_processor", "decoder"):
            assert mine[k] == real[k], f"tokenizer.json '{k}' differs from DeepSeek-V3's"
        rc = json.load(open(os.path.join(real_dir, "tokenizer_config.json")))
        mc = json.load(open(os.path.join(ckpt, "tokenizer_config.json")))
        assert rc == mc, "tokenizer_config.json differs from DeepSeek-V3's"
        real_added = {a["content"]: a for a in real["added_tokens"]}
        for a in mine["added_tokens"]:
            if a["content"] in real_added:
                ra = real_added[a["content"]]
                assert (a["special"], a["normalized"]) == (ra["special"], ra["normalized"]), a["content"]
    print(f"tokenizer ok: {tok.get_vocab_size()} ids, {len(mine['model']['merges'])} merges; '{text[:20]}...' -> {ids[:12]}...")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ckpt")
    ap.add_argument("seed", type=int)
    ap.add_argument("--real-tokenizer", default=None)
    ap.add_argument("--print-values", action="store_true")
    a = ap.parse_args()
    cfg = json.load(open(os.path.join(a.ckpt, "config.json")))
    block = cfg.get("quantization_config", {}).get("weight_block_size", [128, 128])
    files = [x for x in os.listdir(a.ckpt) if x.endswith(".safetensors")]
    n, errors = 0, []
    for fn in sorted(files):
        with safe_open(os.path.join(a.ckpt, fn), "pt") as f:
            for name in f.keys():
                e = check_tensor(f, name, cfg, a.seed, block)
                n += 1
                if e:
                    errors.append(e)
                if a.print_values and name in ("model.embed_tokens.weight", "model.layers.1.mlp.gate.e_score_correction_bias",
                                               "model.layers.0.self_attn.kv_a_proj_with_mqa.weight"):
                    t = f.get_tensor(name).float().flatten()[:4].tolist()
                    print(f"{name}: {[float(x) for x in t]}")
    if errors:
        print("\n".join(errors[:20]))
        sys.exit(f"{len(errors)} of {n} tensors differ from the spec")
    print(f"{a.ckpt}: all {n} tensors match the generator spec")
    check_tokenizer(a.ckpt, a.real_tokenizer)


if __name__ == "__main__":
    main()
