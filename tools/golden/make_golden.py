#!/usr/bin/env python3
"""Golden logits from Hugging Face transformers for checkpoints written by `deepinfer mkmodel`.

For every case below: regenerate the checkpoint with `deepinfer mkmodel`, load it with
`DeepseekV3ForCausalLM` / `DeepseekV2ForCausalLM.from_pretrained(dir, dtype=float32,
attn_implementation="eager")` (asserting no missing / unexpected / mismatched keys and no
loading warnings), run the fixed id sequence in one forward pass, and write the float32
little-endian logits [n_ids, vocab] to tests/data/golden/<case>.logits.bin. FP8 checkpoints are
evaluated through a dequantized fp32 twin (weight x block scale), not transformers' own FP8
path (which needs a GPU kernel and quantizes activations); the FP8 checkpoint itself is still
loaded once to assert its layout loads cleanly (needs `accelerate` on a machine without GPU).

tests/data/golden/golden.json records, per case: the preset, seed, dtype and ids that regenerate
the checkpoint, the CRC32 of every checkpoint file (so the C test knows it rebuilt the very
bytes transformers saw), library versions, and two sanity measurements:
  - min_route_margin: the smallest gap, over all tokens and MoE layers, between the last
    selected and the first rejected expert (and group) score, and for V3.2 contexts beyond
    index_topk between the last selected and first rejected indexer score. A gap near fp32 noise would make
    the case flaky, so the script refuses margins < MIN_MARGIN.
  - sensitivity: max|dlogits| / max|logits| when routing is deliberately done wrong
    (bias ignored / bias in the weights / no group limit / no renormalisation, or for V2
    renormalisation / top-k-1), or
    attention is (softmax scale without the YaRN mscale, no cos/sin attention factor, the other
    RoPE pair layout; V3.2: dense attention instead of the indexer's selection). Each
    must exceed the test tolerance (1e-4) by far, or a routing bug could pass the test.
The id sequence of a case is drawn from a seeded RNG, redrawn (seed + 1000 k) until the routing
margin is >= MIN_MARGIN; the ids actually used are recorded.

Usage (transformers 5.17, CPU is fine):
  python3 tools/golden/make_golden.py --bin build/bin/deepinfer [--out tests/data/golden] [--only CASE]
"""
import argparse
import json
import logging
import os
import random
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import safetensors
import tokenizers
import torch
import transformers
from safetensors.torch import load_file, save_file

from checksum import crc32

TOL = 1e-4
MIN_MARGIN = 2e-5  # smallest accepted routing score gap (fp32 noise is ~1e-7..1e-6)


def ids_for(seed, n, vocab):
    rng = random.Random(seed)
    return [rng.randrange(vocab) for _ in range(n)]


# name, preset, seed, dtype, n_ids, ids seed
CASES = [
    ("v3_len1", "tiny-v3", 1, "bf16", 1, 11),
    ("v3_len37", "tiny-v3", 1, "bf16", 37, 12),
    ("v3_len300", "tiny-v3", 1, "bf16", 300, 13),
    ("v3nolora_len19", "tiny-v3-nolora", 2, "bf16", 19, 21),
    ("v3nolora_len300", "tiny-v3-nolora", 2, "bf16", 300, 22),
    ("v3fp8_len23", "tiny-v3-fp8", 3, "fp8", 23, 31),
    ("v3fp8_len300", "tiny-v3-fp8", 3, "fp8", 300, 32),
    ("v3neox_len50", "tiny-v3-neox", 4, "bf16", 50, 41),
    ("v3f32_len40", "tiny-v3", 5, "f32", 40, 51),
    ("v2lite_len1", "tiny-v2-lite", 6, "bf16", 1, 61),
    ("v2lite_len64", "tiny-v2-lite", 6, "bf16", 64, 62),
    ("v2lite_len300", "tiny-v2-lite", 6, "bf16", 300, 63),
    ("v2grouped_len30", "tiny-v2-grouped", 7, "bf16", 30, 71),
    ("v2grouped_len300", "tiny-v2-grouped", 7, "bf16", 300, 72),
    # V3.2 with a context <= index_topk (64): the indexer selects every position, attention is dense
    ("v32_len48", "tiny-v32", 8, "bf16", 48, 81),
    # V3.2 beyond index_topk: DeepSeek sparse attention (each query attends to its top-64 positions)
    ("v32_len100", "tiny-v32", 8, "bf16", 100, 82),
]


def mkmodel(binary, preset, seed, dtype, out):
    subprocess.run([binary, "mkmodel", "--preset", preset, "--seed", str(seed), "--dtype", dtype, "--out", out],
                   check=True)


def dequantized_twin(src, dst):
    """fp32 copy of an FP8 checkpoint: W = fp8(W) * scale (128x128 blocks), no quantization_config."""
    os.makedirs(dst, exist_ok=True)
    cfg = json.load(open(os.path.join(src, "config.json")))
    bs = cfg["quantization_config"]["weight_block_size"]
    del cfg["quantization_config"]
    cfg["torch_dtype"] = "float32"
    json.dump(cfg, open(os.path.join(dst, "config.json"), "w"), indent=2)
    t = load_file(os.path.join(src, "model.safetensors"))
    out = {}
    for name, w in t.items():
        if name.endswith("_scale_inv"):
            continue
        if w.dtype == torch.float8_e4m3fn:
            s = t[name + "_scale_inv"]
            r, c = w.shape
            full = s.repeat_interleave(bs[0], 0)[:r].repeat_interleave(bs[1], 1)[:, :c]
            out[name] = w.to(torch.float32) * full
        else:
            out[name] = w.to(torch.float32)
    save_file(out, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(src, f), dst)


class LogCapture(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.records = []

    def emit(self, record):
        self.records.append(record.getMessage())


def load(path):
    cap = LogCapture()
    tlog = logging.getLogger("transformers")
    tlog.addHandler(cap)
    try:
        model, info = transformers.AutoModelForCausalLM.from_pretrained(
            path, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    finally:
        tlog.removeHandler(cap)
    bad = {k: v for k, v in info.items() if v}
    if bad:
        sys.exit(f"{path}: loading reported {bad}")
    noisy = [r for r in cap.records if "missing" in r.lower() or "unexpected" in r.lower() or "not used" in r.lower()
             or "newly initialized" in r.lower()]
    if noisy:
        sys.exit(f"{path}: loading warnings: {noisy}")
    model.eval()
    return model


# ---- routing instrumentation ----

def router_forward_factory(router, mode, margins, is_v3):
    """Re-implements the router with a deliberate change (mode != 'ref') and records the selection margin."""
    E, k = router.num_experts, router.top_k
    G = router.num_group if router.num_group else 1
    KG = router.topk_group if router.topk_group else 1

    def fwd(hidden_states):
        x = hidden_states.view(-1, router.hidden_dim)
        logits = torch.nn.functional.linear(x.type(torch.float32), router.weight.type(torch.float32))
        if is_v3:
            scores = logits.sigmoid()
            bias = router.e_score_correction_bias
            choice = scores if mode == "no_bias" else scores + bias
            gscore = choice.view(-1, G, E // G).topk(2, dim=-1)[0].sum(-1)
        else:
            scores = logits.softmax(dim=-1, dtype=torch.float32)
            choice = scores
            gscore = scores.view(-1, G, E // G).max(dim=-1).values
        grouped = (is_v3 or router.topk_method == "group_limited_greedy") and mode != "no_group_limit" and KG < G
        if grouped:
            gs = gscore.sort(dim=-1, descending=True).values
            margins.append(float((gs[:, KG - 1] - gs[:, KG]).min()))
            gidx = torch.topk(gscore, k=KG, dim=-1, sorted=False)[1]
            gmask = torch.zeros_like(gscore).scatter_(1, gidx, 1)
            smask = gmask.unsqueeze(-1).expand(-1, G, E // G).reshape(-1, E).bool()
            choice = choice.masked_fill(~smask, float("-inf") if is_v3 else 0.0)
        kk = k - 1 if mode == "topk_minus_1" else k
        cs = choice.sort(dim=-1, descending=True).values
        margins.append(float((cs[:, k - 1] - cs[:, k]).min()))
        idx = torch.topk(choice, k=kk, dim=-1, sorted=False)[1]
        w = (choice if mode == "bias_in_weights" else scores).gather(1, idx)
        if (is_v3 and router.norm_topk_prob and mode != "no_renorm") or mode == "v2_renorm":
            w = w / (w.sum(-1, keepdim=True) + 1e-20)
        w = w * router.routed_scaling_factor
        if kk < k:  # keep shapes: pad with a zero-weight expert
            idx = torch.cat([idx, idx[:, :1]], dim=1)
            w = torch.cat([w, torch.zeros_like(w[:, :1])], dim=1)
        return logits, w, idx

    return fwd


def routers(model):
    return [m for n, m in model.named_modules() if n.endswith("mlp.gate") and hasattr(m, "top_k")]


def indexer_forward_factory(ix, margins):
    """transformers' DeepseekV32Indexer.forward, plus the gap between the last selected and the
    first rejected index score of every query whose context exceeds index_topk."""
    from transformers.models.deepseek_v32 import modeling_deepseek_v32 as m32
    cls_forward = type(ix).forward

    def fwd(hidden_states, q_resid, position_embeddings, attention_mask, position_ids, past_key_values=None):
        B, S, _ = hidden_states.shape
        cos, sin = position_embeddings
        q = ix.wq_b(q_resid).view(B, S, ix.n_heads, ix.head_dim)
        q_rot, q_pass = torch.split(q, [ix.qk_rope_head_dim, ix.head_dim - ix.qk_rope_head_dim], dim=-1)
        k = ix.k_norm(ix.wk(hidden_states)).unsqueeze(2)
        k_rot, k_pass = torch.split(k, [ix.qk_rope_head_dim, ix.head_dim - ix.qk_rope_head_dim], dim=-1)
        q_rot, k_rot = m32.apply_rotary_pos_emb(q_rot, k_rot, cos, sin, unsqueeze_dim=2)
        q = torch.cat([q_rot, q_pass], -1)
        k = torch.cat([k_rot, k_pass], -1).squeeze(2)
        sc = torch.relu(torch.matmul(q.float(), k.transpose(-1, -2).float().unsqueeze(1)) * ix.softmax_scale)
        w = ix.weights_proj(hidden_states.to(ix.weights_proj.weight.dtype)).float() * (ix.n_heads ** -0.5)
        idx_scores = torch.matmul(w.unsqueeze(-2), sc).squeeze(-2)
        K = ix.index_topk
        for b in range(B):
            for t in range(K, S):
                row = idx_scores[b, t, :t + 1].sort(descending=True).values
                margins.append(float(row[K - 1] - row[K]))
        return cls_forward(ix, hidden_states, q_resid, position_embeddings, attention_mask, position_ids,
                           past_key_values)

    return fwd


def indexers(model):
    return [m for n, m in model.named_modules() if n.endswith("self_attn.indexer")]


def attention_modules(model):
    return [m for n, m in model.named_modules() if n.endswith("self_attn")]


def run(model, ids, mode="ref"):
    """Logits with transformers' routing re-implemented (mode "ref") or deliberately broken
    (router modes above, or attention modes: "attn_plain_scale" drops the YaRN mscale from the
    softmax scale, "attn_no_cos_sin_factor" drops the YaRN attention factor, "attn_rope_pairs"
    flips rope_interleave)."""
    margins = []
    is_v3 = model.config.model_type != "deepseek_v2"
    saved, restore = [], []
    for r in routers(model):
        saved.append((r, r.forward))
        r.forward = router_forward_factory(r, "ref" if mode.startswith("attn_") else mode, margins, is_v3)
    for ix in indexers(model):
        ix.forward = indexer_forward_factory(ix, margins)
        restore.append((ix, "forward", None))
        if mode == "dsa_dense":  # every position selected: dense attention instead of DSA
            restore.append((ix, "index_topk", ix.index_topk))
            ix.index_topk = 1 << 30
    if mode == "attn_plain_scale":
        for a in attention_modules(model):
            restore.append((a, "scaling", a.scaling))
            a.scaling = a.qk_head_dim ** -0.5
    elif mode == "attn_no_cos_sin_factor":
        re = model.model.rotary_emb
        restore.append((re, "attention_scaling", re.attention_scaling))
        re.attention_scaling = 1.0
    elif mode == "attn_rope_pairs":
        restore.append((model.config, "rope_interleave", model.config.rope_interleave))
        model.config.rope_interleave = not model.config.rope_interleave
    try:
        with torch.no_grad():
            out = model(torch.tensor([ids])).logits[0].to(torch.float32)
    finally:
        for r, f in saved:
            r.forward = f
        for obj, attr, val in reversed(restore):
            if val is None:
                delattr(obj, attr)  # drop the instance override: the class method is back
            else:
                setattr(obj, attr, val)
    return out, (min(margins) if margins else None)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True, help="path of the deepinfer binary (for mkmodel)")
    ap.add_argument("--out", default="tests/data/golden")
    ap.add_argument("--only", default=None)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    manifest_path = os.path.join(args.out, "golden.json")
    manifest = {"tolerance": TOL, "cases": []}
    if args.only and os.path.exists(manifest_path):
        manifest = json.load(open(manifest_path))
        manifest["cases"] = [c for c in manifest["cases"] if c["name"] != args.only]
    manifest["versions"] = {"transformers": transformers.__version__, "torch": torch.__version__,
                            "safetensors": safetensors.__version__, "tokenizers": tokenizers.__version__,
                            "numpy": np.__version__}
    tmp = tempfile.mkdtemp(prefix="golden_")
    models = {}
    try:
        for name, preset, seed, dtype, n, ids_seed in CASES:
            if args.only and name != args.only:
                continue
            key = (preset, seed, dtype)
            ckpt = os.path.join(tmp, f"{preset}_{seed}_{dtype}")
            if key not in models:
                mkmodel(args.bin, preset, seed, dtype, ckpt)
                path = ckpt
                if dtype == "fp8":
                    # the FP8 checkpoint itself must load cleanly (layout, scale names); on a
                    # machine without a GPU transformers dequantizes it to bf16 (needs accelerate)
                    load(ckpt)
                    path = ckpt + "_dequant"
                    dequantized_twin(ckpt, path)
                models[key] = load(path)
            model = models[key]
            vocab = model.config.vocab_size
            # Near-tied routing decisions would make the case flaky (fp32 summation order differs
            # between implementations): draw id sequences until every decision has a clear margin.
            for attempt in range(50):
                ids = ids_for(ids_seed + 1000 * attempt, n, vocab)
                ref, margin = run(model, ids)
                if margin is None or margin >= MIN_MARGIN:
                    break
            # the hook reproduces transformers' own router exactly
            with torch.no_grad():
                plain = model(torch.tensor([ids])).logits[0].to(torch.float32)
            if not torch.equal(plain, ref):
                sys.exit(f"{name}: instrumented router differs from transformers' own: {(plain - ref).abs().max()}")
            maxref = float(ref.abs().max())
            sens = {}
            is_v3 = model.config.model_type != "deepseek_v2"
            modes = ["topk_minus_1"]
            if is_v3:
                modes += ["no_bias", "bias_in_weights", "no_renorm"]
            else:
                modes.append("v2_renorm")  # V2 never renormalises the top-k softmax weights
            if model.config.n_group and model.config.topk_group and model.config.topk_group < model.config.n_group:
                modes.append("no_group_limit")
            att = [a for a in attention_modules(model)]
            if att and abs(att[0].scaling - att[0].qk_head_dim ** -0.5) > 1e-12:
                modes.append("attn_plain_scale")
            if getattr(model.model.rotary_emb, "attention_scaling", 1.0) != 1.0:
                modes.append("attn_no_cos_sin_factor")
            if model.config.model_type == "deepseek_v3":  # V3.2 always interleaves
                modes.append("attn_rope_pairs")
            if indexers(model) and n > model.config.index_topk:
                modes.append("dsa_dense")
            for m in modes:
                alt, _ = run(model, ids, m)
                sens[m] = float((alt - ref).abs().max()) / maxref
            print(f"{name}: n={n} max|ref|={maxref:.4f} min_route_margin={margin:.3g} sensitivity=" +
                  ", ".join(f"{k}={v:.3g}" for k, v in sens.items()))
            if margin is not None and margin < MIN_MARGIN:
                sys.exit(f"{name}: no id sequence without near-tied routing found")
            if n >= 16:  # a single token attends only to itself: attention modes need a sequence
                weak = {k: v for k, v in sens.items() if v < 100 * TOL}
                if weak:
                    sys.exit(f"{name}: routing perturbations change the logits too little: {weak}")
            logits_file = f"{name}.logits.bin"
            ref.numpy().astype("<f4").tofile(os.path.join(args.out, logits_file))
            files = {f: crc32(os.path.join(ckpt, f)) for f in sorted(os.listdir(ckpt))}
            manifest["cases"].append({
                "name": name, "preset": preset, "seed": seed, "dtype": dtype, "ids": ids, "vocab_size": vocab,
                "logits": logits_file, "max_abs_ref": maxref, "min_route_margin": margin, "sensitivity": sens,
                "checkpoint_crc32": files, "reference": "dequantized fp32 twin" if dtype == "fp8" else "checkpoint",
            })
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    order = {c[0]: i for i, c in enumerate(CASES)}
    manifest["cases"].sort(key=lambda c: order.get(c["name"], 1 << 30))
    with open(manifest_path, "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    print(f"wrote {manifest_path}")


if __name__ == "__main__":
    main()
