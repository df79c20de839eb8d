"""Local (CPU) checks of the shipped pycoder-moe files against the GPU run's numbers.

Owns no data; reads models/pycoder-moe, tests/data/ppl and (with --heldout) the held-out texts.
Checks, each printed as PASS/FAIL (exit 1 on any FAIL):
  1. tensor dtypes/shapes: every quantized linear is float8_e4m3fn with an fp32 weight_scale_inv of
     shape [ceil(out/128), ceil(in/128)]; the rest bf16 except e_score_correction_bias (fp32);
     the MTP layer's embed_tokens / shared_head.head equal the main embed_tokens / lm_head;
  2. transformers' from_pretrained loads a dequantized fp32 twin with no missing or mismatched
     keys, the only unexpected keys being the MTP layer (HF 5.17 ignores only layer 61 by name),
     and gives the same logits as this package's loader;
  3. transformers' AutoTokenizer (tokenizer.json + tokenizer_config.json) reproduces slice.json's
     token ids, prepends BOS, and renders the V3 chat template;
  4. the slice perplexity recomputed here (fp32, CPU) matches slice.json (rel. diff < 1e-4);
  5. greedy completions of evaluate.PROMPTS recomputed here equal the GPU run's samples.json
     (--write-demo-refs also writes them, with token ids, to <model>/demo_prompts.json);
  6. (--heldout) the full held-out perplexity and MTP acceptance match run.json (rel. < 1e-4).
"""
import argparse
import json
import math
import os
import sys
import tarfile
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import evaluate as EV  # noqa: E402
import export as X  # noqa: E402
import model as M  # noqa: E402

FAILS = []


def check(ok, what):
    print(("PASS " if ok else "FAIL ") + what, flush=True)
    if not ok:
        FAILS.append(what)


def main():
    root = os.path.abspath(os.path.join(HERE, "..", ".."))
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default=os.path.join(root, "models", "pycoder-moe"))
    p.add_argument("--ppl-dir", default=os.path.join(root, "tests", "data", "ppl"))
    p.add_argument("--heldout-archive", default="heldout.tar.gz",
                   help="the held-out texts as returned by the training run (not in the repository)")
    p.add_argument("--run", default=os.path.join(HERE, "runs", "h200-2026-11-29", "run.json"))
    p.add_argument("--heldout", action="store_true", help="also recompute the full held-out numbers")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--write-demo-refs", action="store_true", help="write <model>/demo_prompts.json")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from safetensors.torch import load_file
    from tokenizers import Tokenizer

    # 1. tensors
    with open(os.path.join(args.model, "model.safetensors.index.json")) as f:
        files = sorted(set(json.load(f)["weight_map"].values()))
    raw = {}
    for fn in files:
        raw.update(load_file(os.path.join(args.model, fn)))
    cfg = X.config_from_dir(args.model)
    L = cfg.num_hidden_layers
    bad = []
    for k, v in raw.items():
        if k.endswith("_scale_inv"):
            continue
        if X.QUANT_RE.match(k):
            s = raw.get(k + "_scale_inv")
            want = [-(-v.shape[0] // 128), -(-v.shape[1] // 128)]
            if v.dtype != torch.float8_e4m3fn or s is None or s.dtype != torch.float32 or list(s.shape) != want:
                bad.append(k)
        elif k.endswith("e_score_correction_bias"):
            if v.dtype != torch.float32:
                bad.append(k)
        elif v.dtype != torch.bfloat16:
            bad.append(k)
    n_fp8 = sum(1 for k in raw if X.QUANT_RE.match(k))
    check(not bad, f"tensor dtypes/scales ({len(raw)} tensors, {n_fp8} fp8 weights){' bad: ' + str(bad[:5]) if bad else ''}")
    check(torch.equal(raw[f"model.layers.{L}.embed_tokens.weight"], raw["model.embed_tokens.weight"]) and
          torch.equal(raw[f"model.layers.{L}.shared_head.head.weight"], raw["lm_head.weight"]),
          "MTP embed_tokens / shared_head.head are copies of the main embedding / lm_head")
    size = sum(os.path.getsize(os.path.join(args.model, f)) for f in os.listdir(args.model))
    check(size <= 40e6, f"model folder size {size / 1e6:.2f} MB <= 40 MB")

    model = M.PyCoder(cfg)
    X.load_into(model, X.load_hub_tensors(args.model))
    model.eval()
    counts = M.count_params(model)
    print("params:", counts)

    # 2. transformers from_pretrained on a dequantized twin
    from transformers import AutoTokenizer, DeepseekV3ForCausalLM
    with tempfile.TemporaryDirectory() as tmp:
        X.write_dequantized_twin(args.model, tmp)
        hf, info = DeepseekV3ForCausalLM.from_pretrained(tmp, output_loading_info=True, dtype=torch.float32,
                                                         attn_implementation="eager")
    unexpected = sorted(info["unexpected_keys"])
    check(not info["missing_keys"] and not info["mismatched_keys"] and
          all(k.startswith(f"model.layers.{L}.") for k in unexpected),
          f"HF from_pretrained: missing {len(info['missing_keys'])}, mismatched {len(info['mismatched_keys'])}, "
          f"unexpected {len(unexpected)} (all in MTP layer {L})")
    with open(os.path.join(args.ppl_dir, "slice.json")) as f:
        sl = json.load(f)
    x = torch.tensor([sl["token_ids"][:256]])
    with torch.no_grad():
        a = hf(x).logits
        b = model.lm(x).logits
    rel = ((a - b).norm() / b.norm()).item()
    check(rel < 1e-5, f"HF eager logits vs our loader (sdpa): rel diff {rel:.2e}")

    # 3. tokenizer
    hft = AutoTokenizer.from_pretrained(args.model)
    with open(os.path.join(args.ppl_dir, "slice.txt"), encoding="utf-8", newline="") as f:
        slice_text = f.read()
    ids = hft(slice_text, add_special_tokens=False)["input_ids"]
    check(ids == sl["token_ids"], f"HF AutoTokenizer reproduces the slice ids ({len(ids)} tokens)")
    v3_dir = os.path.join(root, "..", "shared", "data", "tokenizers", "deepseek-v3")
    if not os.path.isdir(v3_dir):
        v3_dir = "/work/shared/data/tokenizers/deepseek-v3"
    if os.path.isdir(v3_dir):
        v3 = AutoTokenizer.from_pretrained(v3_dir)
        ours_bos = hft("def f():")["input_ids"][0] == 0
        v3_bos = v3("def f():")["input_ids"][0] == 0
        check(ours_bos == v3_bos, f"HF adds BOS to plain encodes exactly as for DeepSeek-V3's tokenizer ({ours_bos})")
    chat = hft.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    check(chat == "<｜begin▁of▁sentence｜><｜User｜>hi<｜Assistant｜>", f"chat template renders V3 form: {chat!r}")
    check(hft.convert_tokens_to_ids("<｜end▁of▁sentence｜>") == 1 and hft.decode(hft("x = 1\n")["input_ids"],
          skip_special_tokens=True) == "x = 1\n", "EOS id 1; decode round trip")
    tok = Tokenizer.from_file(os.path.join(args.model, "tokenizer.json"))

    # 4. slice perplexity
    res = EV.evaluate(model, tok, [slice_text], w=sl["window"], batch=8)
    d = abs(res["ppl"] - sl["ppl"]) / sl["ppl"]
    check(d < 1e-4, f"slice ppl CPU {res['ppl']:.6f} vs GPU {sl['ppl']:.6f} (rel {d:.1e})")

    # 5. greedy completions of the demo prompts: CPU fp32 vs the GPU run (samples.json)
    samples_path = os.path.join(os.path.dirname(args.run), "samples.json")
    with open(samples_path, encoding="utf-8") as f:
        gpu = {s["prompt"]: s for s in json.load(f) if s["mode"] == "greedy"}
    refs = []
    for prompt in EV.PROMPTS:
        pids = [0] + tok.encode(prompt, add_special_tokens=False).ids
        with torch.no_grad():
            y = model.lm.generate(torch.tensor([pids]), max_new_tokens=gpu[prompt]["new_tokens"],
                                  do_sample=False, eos_token_id=1, pad_token_id=1)
        new = y[0, len(pids):].tolist()
        text = tok.decode(new, skip_special_tokens=False)
        check(text == gpu[prompt]["completion"], f"greedy completion of {prompt!r} equals the GPU run's")
        refs.append({"prompt": prompt, "prompt_ids": pids, "greedy_ids": new, "greedy_text": text})
    if args.write_demo_refs:
        with open(os.path.join(args.model, "demo_prompts.json"), "w", encoding="utf-8") as f:
            json.dump({"note": "Demo prompts (BOS prepended) and the greedy continuation computed by "
                               "PyTorch in fp32 from the dequantized FP8 weights (tools/train/verify_export.py).",
                       "sampling": {"temperature": 0.8, "top_p": 0.95}, "prompts": refs},
                      f, ensure_ascii=False, indent=1)

    # 6. held-out
    if args.heldout:
        with open(args.run) as f:
            run = json.load(f)
        with open(os.path.join(args.ppl_dir, "heldout_files.txt")) as f:
            names = [l.rstrip("\n") for l in f if l.strip()]
        # heldout.tar.gz comes back from the training run (run_device.sh); it is not committed
        with tarfile.open(args.heldout_archive) as tf:
            members = sorted(m.name for m in tf.getmembers() if m.isfile())
            texts = [tf.extractfile(m).read().decode("utf-8") for m in members]
        check(len(texts) == len(names), f"held-out archive has {len(texts)} files, list {len(names)}")
        res = EV.evaluate(model, tok, texts, w=sl["window"], batch=16)
        ref = run["heldout_eval"]
        d = abs(res["ppl"] - ref["ppl"]) / ref["ppl"]
        check(d < 1e-4, f"held-out ppl CPU {res['ppl']:.6f} vs GPU {ref['ppl']:.6f} (rel {d:.1e})")
        check(abs(res["mtp_acceptance"] - ref["mtp_acceptance"]) < 1e-3,
              f"MTP acceptance CPU {res['mtp_acceptance']:.4f} vs GPU {ref['mtp_acceptance']:.4f}")
        print(json.dumps({k: v for k, v in res.items()}, indent=1))
    print(f"{len(FAILS)} failed" if FAILS else "all checks passed")
    sys.exit(1 if FAILS else 0)


if __name__ == "__main__":
    main()
