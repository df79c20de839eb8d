#!/usr/bin/env python3
"""The reference implementation's own low-precision error on the golden cases: Hugging Face
transformers running the golden checkpoints in bf16 (and, as a sanity check of the pipeline, in
fp32) on a device, measured against the committed fp32 golden logits with the metric of the GPU
tests, max|d| / max|ref| over every kept row of a case (bound 2e-2 in tests/ops), plus how many
rows keep the golden argmax.

What "bf16 tolerance" means for these models: transformers in bf16 keeps its residual stream
and activations in bf16 (its DeepseekV3TopkRouter still computes the router logits in fp32), so
its error is what a straightforward bf16 deployment of the reference costs. Cases:
  - tests/data/golden/golden.json: random tiny checkpoints, regenerated with `deepinfer mkmodel`
    (preset, seed, dtype of the manifest; FP8 ones through a dequantized fp32 twin, as
    make_golden.py does); the manifest's checkpoint CRC32s are checked;
  - tests/data/golden_pycoder/golden_pycoder.json (optional): the trained models/pycoder-moe,
    through a dequantized fp32 twin of its FP8 shards (the MTP layer is dropped: transformers
    does not load it), logits of the manifest's kept rows.
A model is loaded in fp32 (eager attention) and cast to the dtype on the device.

Usage (on the GPU machine; CPU works too, slowly):
  python3 tools/golden/hf_bf16_error.py --bin build/bin/deepinfer [--golden tests/data/golden]
      [--pycoder-model models/pycoder-moe --pycoder-golden DIR_WITH_UNPACKED_BINS]
      [--device cuda] [--dtypes bfloat16,float32] [--out report.json]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import transformers

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "train"))
import export as X  # noqa: E402  (write_dequantized_twin: the trained model's fp32 twin)
from checksum import crc32  # noqa: E402
from make_golden import dequantized_twin  # noqa: E402  (the random goldens' own fp32 twin)

BOUND = 2e-2


def load(path, dtype, device):
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                              attn_implementation="eager")
    return model.to(dtype).to(device).eval()


def logits_of(model, ids, device):
    with torch.no_grad():
        return model(torch.tensor([ids], device=device)).logits[0].to(torch.float32).cpu()


def compare(got, ref):
    d = (got - ref).abs().max().item()
    return d / ref.abs().max().item(), int((got.argmax(-1) == ref.argmax(-1)).sum().item())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True, help="the deepinfer binary (mkmodel)")
    ap.add_argument("--golden", default="tests/data/golden")
    ap.add_argument("--pycoder-model", default=None)
    ap.add_argument("--pycoder-golden", default=None, help="golden_pycoder.json and the unpacked .bin files")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--out", default=None, help="JSON report")
    ap.add_argument("--only", default=None, help="comma-separated case names (default: all)")
    args = ap.parse_args()
    dtypes = [getattr(torch, d) for d in args.dtypes.split(",")]
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, device {args.device}"
          + (f" ({torch.cuda.get_device_name()})" if args.device == "cuda" else ""), flush=True)
    report = {"device": args.device, "transformers": transformers.__version__, "torch": torch.__version__,
              "bound": BOUND, "cases": []}
    tmp = tempfile.mkdtemp(prefix="hf_bf16_")
    try:
        man = json.load(open(os.path.join(args.golden, "golden.json")))
        made = {}
        only = set(args.only.split(",")) if args.only else None
        for c in man["cases"]:
            if only and c["name"] not in only:
                continue
            key = (c["preset"], c["seed"], c["dtype"])
            if key not in made:
                ckpt = os.path.join(tmp, "%s_%d_%s" % key)
                subprocess.run([args.bin, "mkmodel", "--preset", c["preset"], "--seed", str(c["seed"]), "--dtype",
                                c["dtype"], "--out", ckpt], check=True, stdout=subprocess.DEVNULL)
                crc = {f: crc32(os.path.join(ckpt, f)) for f in c["checkpoint_crc32"]}
                if crc != c["checkpoint_crc32"]:
                    sys.exit(f"{c['name']}: mkmodel did not rebuild the golden checkpoint ({crc})")
                path = ckpt
                if c["dtype"] == "fp8":
                    path = ckpt + "_fp32"
                    dequantized_twin(ckpt, path)
                made[key] = path
            ref = torch.from_numpy(np.fromfile(os.path.join(args.golden, c["logits"]), dtype="<f4")).view(
                len(c["ids"]), c["vocab_size"])
            rows = list(range(len(c["ids"])))
            report["cases"].append(run_case(c["name"], made[key], c["ids"], rows, ref, dtypes, args.device))
        if args.pycoder_model and args.pycoder_golden:
            pm = json.load(open(os.path.join(args.pycoder_golden, "golden_pycoder.json")))
            twin = os.path.join(tmp, "pycoder_fp32")
            X.write_dequantized_twin(args.pycoder_model, twin, drop_mtp=True)
            for c in pm["cases"]:
                if only and "pycoder/" + c["name"] not in only and "pycoder" not in only:
                    continue
                ref = torch.from_numpy(np.fromfile(os.path.join(args.pycoder_golden, c["logits"]), dtype="<f4")).view(
                    len(c["rows"]), pm["vocab_size"])
                report["cases"].append(run_case("pycoder/" + c["name"], twin, c["ids"], c["rows"], ref, dtypes,
                                                args.device))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for dt in args.dtypes.split(","):
        r = [c[dt]["max_ratio"] for c in report["cases"]]
        ok = sum(x <= BOUND for x in r)
        print(f"hf {dt}: {ok} of {len(r)} cases within {BOUND:g}; worst {max(r):.3e}", flush=True)
    if args.out:
        json.dump(report, open(args.out, "w"), indent=1)


_models = {}  # path -> {dtype: model}: the models of one checkpoint at a time


def run_case(name, path, ids, rows, ref, dtypes, device):
    out = {"name": name, "n_ids": len(ids), "rows": len(rows)}
    line = f"{name:28s} n={len(ids):4d}"
    if path not in _models:
        _models.clear()
        if device == "cuda":
            torch.cuda.empty_cache()
        _models[path] = {dt: load(path, dt, device) for dt in dtypes}
    for dt in dtypes:
        model = _models[path][dt]
        t0 = time.time()
        got = logits_of(model, ids, device)[rows]
        ratio, agree = compare(got, ref)
        tag = str(dt).replace("torch.", "")
        out[tag] = {"max_ratio": ratio, "argmax_agree": agree, "seconds": round(time.time() - t0, 3)}
        line += f"  {tag}: max|d|/max|ref| {ratio:.3e} argmax {agree}/{len(rows)}"
    print(line, flush=True)
    return out


if __name__ == "__main__":
    main()
