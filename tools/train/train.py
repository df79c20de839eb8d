"""pycoder-moe end-to-end pipeline: corpus -> tokenizer -> train (fixed seconds) -> FP8 export -> eval.

Owns the run: one command on the GPU machine (or a toy run on CPU with --toy) that must finish
inside a hard wall-clock budget.  Every stage writes its results under --out as soon as it has
them (shards, bundle.tar.gz, heldout.tar.gz), so a late failure still returns something.
Settings are the argparse defaults below and ARCH / MTP_LAMBDA / BIAS_UPDATE_SPEED in model.py;
tools/train/README.md documents each of them.
"""
import argparse
import hashlib
import io
import json
import math
import os
import sys
import tarfile
import time
import traceback

T_START = time.time()
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", required=True, help="results folder (the device tool's $OUT)")
    p.add_argument("--work", default="/tmp/pycoder_work", help="scratch folder")
    p.add_argument("--budget-s", type=float, default=500, help="whole-run wall-clock budget (s)")
    p.add_argument("--reserve-s", type=float, default=80, help="time kept for export + eval + samples")
    p.add_argument("--device", default="cuda")
    p.add_argument("--seq", type=int, default=512, help="training context T (also eval window W)")
    p.add_argument("--batch", type=int, default=128, help="sequences per step")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--min-lr-frac", type=float, default=0.1)
    p.add_argument("--warmup-steps", type=int, default=150)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--beta2", type=float, default=0.95)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--heldout-mb", type=float, default=6.0)
    p.add_argument("--max-train-mb", type=float, default=300.0)
    p.add_argument("--tok-train-mb", type=float, default=30.0)
    p.add_argument("--encode-max-s", type=float, default=45.0, help="stop encoding train text after this")
    p.add_argument("--max-steps", type=int, default=0, help="stop after N steps (0: time only)")
    p.add_argument("--eval-batch", type=int, default=32)
    p.add_argument("--toy", action="store_true", help="local CPU smoke run: few files, tiny steps")
    p.add_argument("--v3-parts", default=os.path.join(HERE, "v3_tokenizer_parts.json"))
    p.add_argument("--seed", type=int, default=1234)
    return p.parse_args()


class Logger:
    def __init__(self, path):
        self.f = open(path, "a", encoding="utf-8")

    def __call__(self, msg):
        line = f"[{time.time() - T_START:7.1f}s] {msg}"
        print(line, flush=True)
        self.f.write(line + "\n")
        self.f.flush()


def write_bundle(out, work, log):
    """Tar+gzip everything small under work/bundle into out/bundle.tar.gz (atomic rename)."""
    src = os.path.join(work, "bundle")
    tmp = os.path.join(out, "bundle.tar.gz.tmp")
    with tarfile.open(tmp, "w:gz") as tf:
        tf.add(src, arcname="bundle")
    os.replace(tmp, os.path.join(out, "bundle.tar.gz"))
    log(f"bundle: {os.path.getsize(os.path.join(out, 'bundle.tar.gz')) / 1e6:.2f} MB")


def main():
    args = parse_args()
    os.makedirs(args.out, exist_ok=True)
    B = os.path.join(args.work, "bundle")
    for d in ("model", "data", "eval"):
        os.makedirs(os.path.join(B, d), exist_ok=True)
    log = Logger(os.path.join(B, "train_log.txt"))
    deadline = T_START + args.budget_s
    log(f"args: {json.dumps(vars(args))}")

    import numpy as np
    import torch
    import transformers
    import tokenizers
    log(f"python {sys.version.split()[0]} torch {torch.__version__} transformers {transformers.__version__} "
        f"tokenizers {tokenizers.__version__} cpus {os.cpu_count()}")
    if args.device == "cuda":
        if not torch.cuda.is_available():
            log("FATAL: torch sees no GPU")
            sys.exit(3)
        log(f"gpu: {torch.cuda.get_device_name(0)} cap {torch.cuda.get_device_capability(0)}")
    dev = torch.device(args.device)
    torch.manual_seed(args.seed)

    import corpus
    import evaluate as EV
    import export as X
    import model as M
    import tokenizer_train as TT

    run = {"args": vars(args), "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                                           "tokenizers": tokenizers.__version__, "python": sys.version.split()[0]}}
    if args.device == "cuda":
        run["gpu"] = torch.cuda.get_device_name(0)

    def save_run():
        with open(os.path.join(B, "run.json"), "w") as f:
            json.dump(run, f, indent=1)

    # ---------------------------------------------------------------- 1. corpus
    t = time.time()
    cp = corpus.build(heldout_bytes=int(args.heldout_mb * 1e6),
                      max_train_bytes=args.max_train_mb * 1e6,
                      max_files=400 if args.toy else None, log=log)
    run["corpus"] = cp["stats"]
    run["corpus"]["stdlib_path"] = cp["info"]["stdlib"]
    run["corpus"]["site_dirs"] = cp["info"]["site_dirs"]
    run["timing"] = {"corpus_s": time.time() - t}
    with open(os.path.join(B, "data", "packages.json"), "w") as f:
        json.dump(cp["info"]["packages"], f, indent=1, sort_keys=True)
    with open(os.path.join(B, "data", "heldout_files.txt"), "w") as f:
        f.write("".join(rel + "\n" for rel, _ in cp["heldout"]))
    with open(os.path.join(B, "data", "train_files.txt"), "w") as f:
        f.write("".join(rel + "\n" for rel, _ in cp["train"]))
    ho = os.path.join(args.out, "heldout.tar.gz")
    with tarfile.open(ho + ".tmp", "w:gz") as tf:
        for i, (rel, text) in enumerate(cp["heldout"]):
            data = text.encode("utf-8")
            ti = tarfile.TarInfo(f"heldout/{i:05d}.py")
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    os.replace(ho + ".tmp", ho)
    save_run()

    # ---------------------------------------------------------------- 2. tokenizer
    t = time.time()
    by_hash = sorted(cp["train"], key=lambda x: hashlib.sha256(x[0].encode()).hexdigest())
    tok_texts, acc = [], 0
    for _, text in by_hash:
        if acc >= args.tok_train_mb * 1e6:
            break
        tok_texts.append(text)
        acc += len(text.encode())
    tok = TT.train(tok_texts, M.ARCH["vocab_size"], args.v3_parts, os.path.join(B, "model"), log=log)
    run["tokenizer"] = {"train_bytes": acc, "train_files": len(tok_texts), "vocab_size": M.ARCH["vocab_size"],
                        "seconds": time.time() - t}
    log(f"tokenizer trained on {acc / 1e6:.1f} MB in {time.time() - t:.1f}s")
    del tok_texts

    # ---------------------------------------------------------------- 3. encode train text
    t = time.time()
    chunks, n_files_enc, n_bytes_enc = [], 0, 0
    step_files = 2000
    train_texts = [text for _, text in by_hash]     # hash order: a time cap keeps a random subset
    for s in range(0, len(train_texts), step_files):
        part = train_texts[s:s + step_files]
        encs = tok.encode_batch_fast(part, add_special_tokens=False)
        for e in encs:
            chunks.append(np.asarray([0] + e.ids + [1], dtype=np.int32))
        n_files_enc += len(part)
        n_bytes_enc += sum(len(x.encode()) for x in part)
        if time.time() - t > args.encode_max_s:
            log(f"encode: time cap reached after {n_files_enc} files")
            break
    stream = np.concatenate(chunks)
    del chunks, train_texts
    run["train_data"] = {"files": n_files_enc, "bytes": n_bytes_enc, "tokens": int(stream.size),
                         "bytes_per_token": n_bytes_enc / max(stream.size, 1), "seconds": time.time() - t}
    log(f"encode: {n_files_enc} files {n_bytes_enc / 1e6:.1f} MB -> {stream.size / 1e6:.2f}M tokens "
        f"({n_bytes_enc / stream.size:.2f} B/tok) in {time.time() - t:.1f}s")
    save_run()
    write_bundle(args.out, args.work, log)

    # ---------------------------------------------------------------- 4. model
    cfg = M.make_config(attn="sdpa", experts="eager")
    model = M.PyCoder(cfg).to(dev)
    run["params"] = M.count_params(model)
    log(f"params: {run['params']}")
    use_amp = args.device == "cuda"
    amp = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if use_amp else (lambda: torch.autocast("cpu", enabled=False))

    data = torch.from_numpy(stream.astype(np.int64)).to(dev)
    n_tok = data.numel()
    T = args.seq
    offs = torch.arange(T + 2, device=dev)
    gen = torch.Generator(device=dev)
    gen.manual_seed(args.seed)

    def batch():
        starts = torch.randint(0, n_tok - (T + 2), (args.batch,), device=dev, generator=gen)
        return data[starts[:, None] + offs]

    def timed_steps(n):
        """n full forward+backward passes (no update); returns the seconds of the last one."""
        dt = 0.0
        for _ in range(n):
            if use_amp:
                torch.cuda.synchronize()
            t0 = time.time()
            with amp():
                a, b = model(batch())
                (a + M.MTP_LAMBDA * b).backward()
            if use_amp:
                torch.cuda.synchronize()
            dt = time.time() - t0
        model.zero_grad(set_to_none=True)
        return dt

    # Attention: sdpa unless a full step fails with it (then eager, which builds explicit masks).
    M.set_experts_impl(model, "eager")
    run["attn_impl"] = "sdpa"
    try:
        timed_steps(1)
    except Exception as ex:  # noqa: BLE001
        log(f"sdpa step failed ({type(ex).__name__}: {str(ex)[:300]}); using eager attention")
        model.zero_grad(set_to_none=True)
        model.cfg._attn_implementation = "eager"
        run["attn_impl"] = "eager"
    # Experts: the fastest implementation whose output matches the eager loop.
    moe = model.lm.model.layers[cfg.first_k_dense_replace].mlp
    xt = torch.randn(2048 if use_amp else 64, cfg.hidden_size, device=dev)
    with torch.no_grad(), amp():
        _, tw, ti = moe.gate(xt)
        M.set_experts_impl(model, "eager")
        ref = moe.experts(xt, ti, tw).float()
    timings = {}
    n_timed = 2 if use_amp else 1
    # HF's own grouped_mm runs fp32 under autocast (weights are fp32); it is only tried on CPU, so
    # that an unsupported-kernel failure cannot poison the CUDA context of the one GPU run.
    cands = ("eager", "di_bf16_grouped") if use_amp else ("eager", "di_bf16_grouped", "grouped_mm")
    for cand in cands:
        try:
            M.set_experts_impl(model, cand)
            with torch.no_grad(), amp():
                y = moe.experts(xt, ti, tw).float()
            err = ((y - ref).norm() / ref.norm()).item()
            if not err < 3e-2:
                log(f"experts impl {cand}: rel err vs eager {err:.2e} -> rejected")
                continue
            timings[cand] = timed_steps(n_timed)
            log(f"experts impl {cand}: rel err vs eager {err:.2e}, fwd+bwd step {timings[cand] * 1e3:.0f} ms")
        except Exception as ex:  # noqa: BLE001 - any failure means: do not use it
            model.zero_grad(set_to_none=True)
            log(f"experts impl {cand} failed: {type(ex).__name__}: {str(ex)[:300]}")
    chosen = min(timings, key=timings.get) if timings else "eager"
    M.set_experts_impl(model, chosen)
    run["experts_impl"] = chosen
    run["impl_step_ms"] = {k: v * 1e3 for k, v in timings.items()}
    log(f"experts implementation: {chosen}")

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "embed" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, args.beta2), eps=1e-8, fused=use_amp)
    balancer = M.LoadBalancer(model)

    # ---------------------------------------------------------------- 5. train
    train_start = time.time()
    train_end = deadline - args.reserve_s
    log(f"train: {train_end - train_start:.0f}s budget, batch {args.batch}x{T}")
    model.train()
    step, tokens_seen = 0, 0
    lr_scale = 1.0

    def snapshot():
        cpu = lambda sd: {k: (v.detach().to("cpu", copy=True) if torch.is_tensor(v) else v) for k, v in sd.items()}
        osd = opt.state_dict()
        return {"model": cpu(model.state_dict()), "opt": {"state": {k: cpu(v) for k, v in osd["state"].items()},
                                                          "param_groups": osd["param_groups"]},
                "step": step, "tokens": tokens_seen, "time": time.time()}
    snap = snapshot()
    curve = []
    ema = None
    last_log = time.time()
    while True:
        now = time.time()
        if now >= train_end or (args.max_steps and step >= args.max_steps):
            break
        frac = min(1.0, (now - train_start) / max(train_end - train_start, 1e-6))
        lr = lr_scale * args.lr * min(1.0, (step + 1) / args.warmup_steps) * (
            args.min_lr_frac + (1 - args.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        win = batch()
        with amp():
            l_main, l_mtp = model(win)
            loss = l_main + M.MTP_LAMBDA * l_mtp
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        imb = balancer.step()
        step += 1
        tokens_seen += args.batch * T
        if step % 50 == 0 or step == 1 or time.time() - last_log > 30:
            lm_, lt_ = l_main.item(), l_mtp.item()
            if not (math.isfinite(lm_) and math.isfinite(lt_)):
                # Divergence guard: back to the last finite snapshot, half the learning rate.
                lr_scale *= 0.5
                log(f"step {step}: non-finite loss; restoring step {snap['step']} and lr scale {lr_scale}")
                model.load_state_dict(snap["model"])
                opt.load_state_dict(snap["opt"])
                step, tokens_seen = snap["step"], snap["tokens"]
                run.setdefault("restarts", []).append({"at_step": step, "lr_scale": lr_scale})
                continue
            if time.time() - snap["time"] > 45:
                snap = snapshot()
            ema = lm_ if ema is None else 0.8 * ema + 0.2 * lm_
            el = time.time() - train_start
            rec = {"step": step, "t": round(el, 1), "tokens": tokens_seen, "loss": lm_, "loss_mtp": lt_,
                   "lr": lr, "grad_norm": float(gn), "max_load_over_mean": [round(v, 2) for v in imb.tolist()]}
            curve.append(rec)
            log(f"step {step} t {el:.0f}s tok {tokens_seen / 1e6:.1f}M loss {lm_:.4f} mtp {lt_:.4f} "
                f"lr {lr:.2e} gn {float(gn):.2f} {tokens_seen / max(el, 1e-6) / 1e3:.0f}k tok/s "
                f"load max/mean {max(imb.tolist()):.2f}")
            last_log = time.time()
    if use_amp:
        torch.cuda.synchronize()
    train_s = time.time() - train_start
    # final loss: mean over a few fresh batches with the final weights (no update)
    model.eval()
    with torch.no_grad(), amp():
        fl, fm = [], []
        for _ in range(4):
            a, b = model(batch())
            fl.append(a.item())
            fm.append(b.item())
    run["training"] = {"steps": step, "tokens_seen": tokens_seen, "seconds": train_s,
                       "tokens_per_s": tokens_seen / max(train_s, 1e-6),
                       "final_train_loss": sum(fl) / len(fl), "final_train_loss_mtp": sum(fm) / len(fm),
                       "epochs_over_train_tokens": tokens_seen / n_tok}
    log(f"train done: {step} steps, {tokens_seen / 1e6:.1f}M tokens, {train_s:.0f}s, "
        f"final loss {run['training']['final_train_loss']:.4f} mtp {run['training']['final_train_loss_mtp']:.4f}")
    with open(os.path.join(B, "train_curve.json"), "w") as f:
        json.dump(curve, f)
    biases = {f"layer{i}": r.e_score_correction_bias.tolist() for i, r in enumerate(balancer.routers)}
    with open(os.path.join(B, "router_bias.json"), "w") as f:
        json.dump(biases, f)
    save_run()
    del data, opt

    # ---------------------------------------------------------------- 6. export
    t = time.time()
    model = model.float().cpu()
    mdir = os.path.join(args.work, "export")
    files = X.export(model, mdir, log=log)
    for fn in files:
        os.replace(os.path.join(mdir, fn), os.path.join(args.out, fn))
    for fn in ("config.json", "model.safetensors.index.json"):
        os.replace(os.path.join(mdir, fn), os.path.join(B, "model", fn))
    run["export"] = {"files": files, "bytes": sum(os.path.getsize(os.path.join(args.out, f)) for f in files),
                     "seconds": time.time() - t}
    save_run()
    write_bundle(args.out, args.work, log)

    # ---------------------------------------------------------------- 7. evaluation (from the FP8 files)
    t = time.time()
    ldir = os.path.join(args.work, "reload")
    os.makedirs(ldir, exist_ok=True)
    for fn in files:
        os.symlink(os.path.join(args.out, fn), os.path.join(ldir, fn))
    os.symlink(os.path.join(B, "model", "model.safetensors.index.json"), os.path.join(ldir, "model.safetensors.index.json"))
    if args.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    ecfg = M.make_config(attn=run.get("attn_impl", "sdpa"), experts="eager")
    emodel = M.PyCoder(ecfg)
    X.load_into(emodel, X.load_hub_tensors(ldir))
    emodel = emodel.to(dev).eval()
    del model
    heldout_texts = [text for _, text in cp["heldout"]]
    if args.toy:
        heldout_texts = heldout_texts[:8]
    res = EV.evaluate(emodel, tok, heldout_texts, w=T, batch=args.eval_batch, device=dev, log=log)
    run["heldout_eval"] = res
    save_run()
    # the committed slice: the first held-out file (list order) of 4-8 KB
    sl = next(((rel, text) for rel, text in cp["heldout"] if 4000 <= len(text.encode()) <= 8000), cp["heldout"][0])
    with open(os.path.join(B, "eval", "slice.txt"), "w", encoding="utf-8", newline="") as f:
        f.write(sl[1])
    sres = EV.evaluate(emodel, tok, [sl[1]], w=T, batch=args.eval_batch, device=dev, log=log)
    sres["source_file"] = sl[0]
    sres["token_ids"] = tok.encode(sl[1], add_special_tokens=False).ids
    sres["protocol"] = ("ppl = exp(sum NLL / predicted tokens) over windows ids[s:s+W], s = 0, W, 2W, ...; "
                        "ids = encode(text, add_special_tokens=False); no BOS; windows < 2 tokens skipped; "
                        "fp32 math with FP8 weights dequantized")
    with open(os.path.join(B, "eval", "slice.json"), "w") as f:
        json.dump(sres, f, indent=1)
    run["slice_eval"] = {k: v for k, v in sres.items() if k != "token_ids"}
    run["timing"]["eval_s"] = time.time() - t
    save_run()
    write_bundle(args.out, args.work, log)

    # ---------------------------------------------------------------- 8. samples
    t = time.time()
    smp = EV.samples(emodel, tok, device=dev, max_new_tokens=24 if args.toy else 96, log=log)
    with open(os.path.join(B, "eval", "samples.json"), "w") as f:
        json.dump(smp, f, indent=1, ensure_ascii=False)
    run["timing"]["samples_s"] = time.time() - t
    run["timing"]["total_s"] = time.time() - T_START
    save_run()
    write_bundle(args.out, args.work, log)
    log(f"DONE total {time.time() - T_START:.0f}s")


if __name__ == "__main__":
    try:
        main()
    except SystemExit:
        raise
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        sys.exit(1)
