#!/usr/bin/env python3
"""Golden logits of the shipped trained model (models/pycoder-moe, FP8) from Hugging Face transformers.

The model is loaded with `DeepseekV3ForCausalLM.from_pretrained(twin, dtype=float32,
attn_implementation="eager")` from a dequantized fp32 twin of the FP8 files (weight x 128x128
block scale, written by tools/train/export.py's write_dequantized_twin; transformers 5.17 does
not load the MTP layer model.layers.8.*, which is the only group of unexpected keys allowed).
Each case is one id sequence run in a single forward pass; the float32 little-endian logits of
the rows listed in the manifest ("rows": positions in the sequence) are written, row after row,
to <out>/<case>.logits.bin. Only some rows of the long cases are kept (the first 8, every 32nd,
the last 8): every row depends on the whole prefix, so the kept rows still check every layer
and the KV cache over the full length, and the committed data stays ~2 MB (xz-compressed into
golden_pycoder.tar.xz, which tests/data/CMakeLists.txt unpacks at configure time).

Cases: the BOS token alone; a demo prompt followed by its greedy continuation (confident
predictions); the head of the held-out slice (tests/data/ppl/slice.json) with BOS; 300 tokens
from the middle of the slice without BOS (like the perplexity windows).

The manifest (<out>/golden_pycoder.json) records the ids, the kept rows, the CRC32 of every
model file (the C tests refuse a changed model), library versions, and per case:
  - route_margin_min / route_margin_p1: the smallest and the 1st-percentile gap, over tokens and
    MoE layers, between the last selected and first rejected biased expert score (after the
    group mask) and between the last kept and first dropped group score. A trained model should
    have real margins: this is what makes a bf16 GPU run route like the fp32 reference;
  - routes_below_1e3: how many (token, layer) decisions have a gap < 1e-3 (bf16 noise level);
  - top2_margin_min: the smallest gap between the two largest logits over the kept rows (an
    argmax closer than this may flip under bf16).

Usage (CPU, transformers 5.17):
  python3 tools/golden/make_pycoder_golden.py [--model models/pycoder-moe] [--out tests/data/golden_pycoder]
"""
import argparse
import io
import json
import lzma
import os
import sys
import tarfile
import tempfile

import numpy as np
import torch
import transformers

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tools", "train"))
import export as X  # noqa: E402  (write_dequantized_twin)
from checksum import crc32  # noqa: E402

TOL = 1e-4          # CPU (fp32) tolerance of the C test: max|d| / max|ref| over the kept rows
GPU_TOL = 2e-2      # CUDA (bf16 activations) tolerance of tests/ops


def kept_rows(n):
    if n <= 24:
        return list(range(n))
    rows = set(range(8)) | set(range(n - 8, n)) | set(range(0, n, 32))
    return sorted(rows)


def cases(model_dir, ppl_dir):
    with open(os.path.join(model_dir, "demo_prompts.json"), encoding="utf-8") as f:
        demo = json.load(f)["prompts"]
    with open(os.path.join(ppl_dir, "slice.json"), encoding="utf-8") as f:
        sl = json.load(f)["token_ids"]
    d = demo[2]
    return [
        ("bos_len1", [0], "the BOS token alone"),
        (f"demo2_len{len(d['prompt_ids']) + 48}", d["prompt_ids"] + d["greedy_ids"][:48],
         f"demo prompt {d['prompt']!r} (BOS first) and 48 tokens of its greedy continuation"),
        ("slice_head_len160", [0] + sl[:159], "BOS + the first 159 tokens of tests/data/ppl/slice.json"),
        ("slice_mid_len300", sl[700:1000], "tokens 700..999 of tests/data/ppl/slice.json (no BOS)"),
    ]


class RouteMargins:
    """Forward hooks on the routers: recomputes the selection (transformers' formula) from the
    router's input and records the per-(token, layer) gaps; the forward itself is untouched."""

    def __init__(self, model):
        self.gaps = []
        self.handles = [m.register_forward_hook(self.hook) for n, m in model.named_modules()
                        if n.endswith("mlp.gate") and hasattr(m, "top_k")]

    def hook(self, r, inputs, _out):
        x = inputs[0].reshape(-1, r.hidden_dim).float()
        s = torch.nn.functional.linear(x, r.weight.float()).sigmoid() + r.e_score_correction_bias
        G, E, KG, K = r.num_group, r.num_experts, r.topk_group, r.top_k
        g = s.view(-1, G, E // G).topk(2, dim=-1)[0].sum(-1)
        gs = g.sort(dim=-1, descending=True).values
        gap_g = gs[:, KG - 1] - gs[:, KG] if KG < G else torch.full_like(gs[:, 0], float("inf"))
        gidx = torch.topk(g, k=KG, dim=-1)[1]
        mask = torch.zeros_like(g).scatter_(1, gidx, 1).unsqueeze(-1).expand(-1, G, E // G).reshape(-1, E).bool()
        cs = s.masked_fill(~mask, float("-inf")).sort(dim=-1, descending=True).values
        gap_e = cs[:, K - 1] - cs[:, K]
        self.gaps.append(torch.minimum(gap_g, gap_e))

    def take(self):
        v = torch.cat(self.gaps) if self.gaps else torch.zeros(0)
        self.gaps = []
        return v

    def remove(self):
        for h in self.handles:
            h.remove()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "pycoder-moe"))
    ap.add_argument("--ppl-dir", default=os.path.join(ROOT, "tests", "data", "ppl"))
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "data", "golden_pycoder"))
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.model, "config.json")) as f:
        L = json.load(f)["num_hidden_layers"]
    with tempfile.TemporaryDirectory() as tmp:
        X.write_dequantized_twin(args.model, tmp)
        model, info = transformers.DeepseekV3ForCausalLM.from_pretrained(
            tmp, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    unexpected = sorted(info["unexpected_keys"])
    if info["missing_keys"] or info["mismatched_keys"] or not all(k.startswith(f"model.layers.{L}.") for k in unexpected):
        sys.exit(f"loading the twin: missing {info['missing_keys']}, mismatched {info['mismatched_keys']}, "
                 f"unexpected outside the MTP layer {[k for k in unexpected if not k.startswith(f'model.layers.{L}.')]}")
    model.eval()
    vocab = model.config.vocab_size
    files = sorted(f for f in os.listdir(args.model) if f.endswith(".safetensors") or f == "config.json")
    manifest = {
        "note": "transformers logits of models/pycoder-moe (dequantized fp32 twin, eager attention); "
                "written by tools/golden/make_pycoder_golden.py",
        "model": "models/pycoder-moe",
        "tolerance": TOL,
        "gpu_tolerance": GPU_TOL,
        "vocab_size": vocab,
        "model_crc32": {f: crc32(os.path.join(args.model, f)) for f in files},
        "versions": {"transformers": transformers.__version__, "torch": torch.__version__, "numpy": np.__version__},
        "archive": "golden_pycoder.tar.xz",
        "cases": [],
    }
    hooks = RouteMargins(model)
    blobs = {}
    for name, ids, what in cases(args.model, args.ppl_dir):
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].to(torch.float32)
        # the hooks only observe: the logits equal a run without them
        gaps = hooks.take()
        hooks.remove()
        with torch.no_grad():
            plain = model(torch.tensor([ids])).logits[0].to(torch.float32)
        hooks = RouteMargins(model)
        if not torch.equal(plain, logits):
            sys.exit(f"{name}: logits changed with the routing hooks attached")
        rows = kept_rows(len(ids))
        kept = logits[rows].contiguous().numpy().astype("<f4")
        top2 = torch.topk(logits[rows], 2, dim=-1).values
        fname = f"{name}.logits.bin"
        blobs[fname] = kept.tobytes()
        g = gaps.sort().values
        case = {
            "name": name, "what": what, "ids": ids, "rows": rows, "logits": fname,
            "max_abs_ref": float(kept.__abs__().max()),
            "route_margin_min": float(g[0]) if len(g) else None,
            "route_margin_p1": float(g[int(0.01 * (len(g) - 1))]) if len(g) else None,
            "route_decisions": int(len(g)),
            "routes_below_1e3": int((g < 1e-3).sum()),
            "top2_margin_min": float((top2[:, 0] - top2[:, 1]).min()),
            "argmax": [int(a) for a in logits[rows].argmax(-1)],
        }
        manifest["cases"].append(case)
        print(f"{name}: {len(ids)} ids, {len(rows)} rows kept, route margin min {case['route_margin_min']:.2e} "
              f"p1 {case['route_margin_p1']:.2e}, {case['routes_below_1e3']}/{case['route_decisions']} below 1e-3, "
              f"top-2 logit margin min {case['top2_margin_min']:.3e}", flush=True)
    hooks.remove()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for fname, data in blobs.items():
            ti = tarfile.TarInfo(f"golden_pycoder/{fname}")
            ti.size = len(data)
            ti.mtime = 0
            ti.mode = 0o644
            tf.addfile(ti, io.BytesIO(data))
    with open(os.path.join(args.out, manifest["archive"]), "wb") as f:
        f.write(lzma.compress(buf.getvalue(), preset=9 | lzma.PRESET_EXTREME))
    with open(os.path.join(args.out, "golden_pycoder.json"), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    raw = sum(len(b) for b in blobs.values())
    print(f"wrote {len(blobs)} cases, {raw / 1e6:.2f} MB of logits "
          f"({os.path.getsize(os.path.join(args.out, manifest['archive'])) / 1e6:.2f} MB xz) to {args.out}")


if __name__ == "__main__":
    main()
