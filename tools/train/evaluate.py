"""Held-out evaluation of pycoder-moe: perplexity, MTP acceptance, sample completions.

Owns the evaluation protocol that deepinfer's C side reproduces:
  Perplexity: for each held-out file in list order, ids = tokenizer.encode(text,
  add_special_tokens=False); windows ids[s:s+W] for s = 0, W, 2W, ... (W = 512); windows shorter
  than 2 tokens are skipped; the NLL of predicting w[1:] from w[:-1] inside each window is summed
  (no BOS, no context across windows); ppl = exp(total NLL / number of predicted tokens).
  The model runs in fp32 (TF32 off) with the FP8 export dequantized (Wq * block scale) and the
  bf16 tensors widened to fp32.
  MTP acceptance: over the same windows, at each position i with i + 2 < len(w): the MTP top-1
  computed from (h_i, t_{i+1}) (h_i = post-norm main hidden state, t_{i+1} = the true next token)
  equals the main model's argmax at position i + 1.  Reported as accepted / positions.
Windows of one batch are right-padded (causal attention and per-token routing make padding
invisible to real positions); padded positions are excluded from every count.
"""
import math
import time

import torch
import torch.nn.functional as F

W_DEFAULT = 512


def windows_of(ids, w):
    return [ids[s:s + w] for s in range(0, len(ids), w) if len(ids[s:s + w]) >= 2]


@torch.no_grad()
def evaluate(model, tokenizer, texts, w=W_DEFAULT, batch=32, device="cpu", log=print, per_text=False):
    """texts: list of strings (files in list order).  Returns metrics dict."""
    model.eval()
    encs = tokenizer.encode_batch([t for t in texts], add_special_tokens=False)
    wins = []
    for fi, e in enumerate(encs):
        for win in windows_of(e.ids, w):
            wins.append((fi, win))
    # Sort by length for padding efficiency; sums are order-independent (accumulated in fp64).
    order = sorted(range(len(wins)), key=lambda i: -len(wins[i][1]))
    nll_sum = 0.0
    n_pred = 0
    acc_main = 0
    mtp_ok = 0
    mtp_pos = 0
    mtp_true = 0
    per_file_nll = [0.0] * len(texts)
    per_file_n = [0] * len(texts)
    t0 = time.time()
    for b0 in range(0, len(order), batch):
        idx = order[b0:b0 + batch]
        lens = [len(wins[i][1]) for i in idx]
        tmax = max(lens)
        x = torch.zeros(len(idx), tmax, dtype=torch.long)
        for r, i in enumerate(idx):
            x[r, :lens[r]] = torch.tensor(wins[i][1])
        x = x.to(device)
        lens_t = torch.tensor(lens, device=device)
        pos = torch.arange(tmax, device=device).unsqueeze(0)
        h = model.lm.model(input_ids=x, position_ids=pos).last_hidden_state
        logits = model.lm.lm_head(h).float()
        logp = F.log_softmax(logits[:, :-1], dim=-1)
        tgt = x[:, 1:]
        nll = -logp.gather(-1, tgt.unsqueeze(-1)).squeeze(-1)               # [B, T-1]
        valid = pos[:, 1:] < lens_t[:, None]                                  # target index < len
        nll = torch.where(valid, nll, torch.zeros_like(nll))
        row_nll = nll.double().sum(1).cpu()
        for r, i in enumerate(idx):
            per_file_nll[wins[i][0]] += row_nll[r].item()
            per_file_n[wins[i][0]] += lens[r] - 1
        nll_sum += row_nll.sum().item()
        n_pred += int(valid.sum().item())
        greedy = logits.argmax(-1)                                            # [B, T]
        acc_main += int(((greedy[:, :-1] == tgt) & valid).sum().item())
        if tmax >= 3:
            hm = model.mtp_forward(h[:, :-1], x[:, 1:], pos[:, :-1])
            mtp_top = model.lm.lm_head(hm).float().argmax(-1)                 # [B, T-1]: predicts t_{i+2}
            # position i valid iff i + 2 < len
            vpos = pos[:, :-2] + 2 < lens_t[:, None]
            mtp_ok += int(((mtp_top[:, :-1] == greedy[:, 1:-1]) & vpos).sum().item())
            mtp_true += int(((mtp_top[:, :-1] == x[:, 2:]) & vpos).sum().item())
            mtp_pos += int(vpos.sum().item())
    dt = time.time() - t0
    res = {
        "window": w, "files": len(texts), "windows": len(wins), "predicted_tokens": n_pred,
        "tokens": sum(len(e.ids) for e in encs), "bytes": sum(len(t.encode()) for t in texts),
        "nll_sum": nll_sum, "mean_nll": nll_sum / max(n_pred, 1),
        "ppl": math.exp(nll_sum / max(n_pred, 1)),
        "bits_per_byte": nll_sum / math.log(2) / max(sum(len(t.encode()) for t in texts), 1),
        "main_top1_acc": acc_main / max(n_pred, 1),
        "mtp_positions": mtp_pos, "mtp_accepted": mtp_ok,
        "mtp_acceptance": mtp_ok / max(mtp_pos, 1),
        "mtp_top1_acc_vs_truth": mtp_true / max(mtp_pos, 1),
        "seconds": dt,
    }
    if per_text:
        res["per_file"] = [{"nll_sum": a, "predicted": n} for a, n in zip(per_file_nll, per_file_n)]
    log(f"eval: {res['files']} files {res['tokens']} tokens ppl {res['ppl']:.4f} "
        f"main acc {res['main_top1_acc']:.3f} MTP acceptance {res['mtp_acceptance']:.3f} ({dt:.1f}s)")
    return res


PROMPTS = [
    "def fibonacci(n):\n",
    "import os\nimport sys\n\n\ndef main():\n",
    "class Stack:\n    \"\"\"A simple LIFO stack.\"\"\"\n\n    def __init__(self):\n",
    "def read_json(path):\n    \"\"\"Read a JSON file and return the parsed object.\"\"\"\n",
    "    def __repr__(self):\n",
    "for i in range(10):\n",
]


@torch.no_grad()
def samples(model, tokenizer, device="cpu", max_new_tokens=96, seed=1234, log=print):
    """Greedy and sampled (T=0.8, top_p=0.95) completions of PROMPTS with the main model
    (HF generate, BOS prepended as tokenizer_config's add_bos_token says)."""
    lm = model.lm
    lm.eval()
    out = []
    for p in PROMPTS:
        ids = [0] + tokenizer.encode(p, add_special_tokens=False).ids
        x = torch.tensor([ids], device=device)
        for mode in ("greedy", "sampled"):
            torch.manual_seed(seed)
            t0 = time.time()
            kw = dict(do_sample=False) if mode == "greedy" else dict(do_sample=True, temperature=0.8, top_p=0.95, top_k=0)
            y = lm.generate(x, max_new_tokens=max_new_tokens, eos_token_id=1, pad_token_id=1, **kw)
            dt = time.time() - t0
            new = y[0, len(ids):].tolist()
            text = tokenizer.decode(new, skip_special_tokens=False)
            out.append({"prompt": p, "mode": mode, "completion": text, "new_tokens": len(new),
                        "seconds": dt, "tokens_per_s": len(new) / max(dt, 1e-9)})
            log(f"--- {mode} ({len(new)} tok, {len(new) / max(dt, 1e-9):.1f} tok/s)\n{p}{text}")
    return out
